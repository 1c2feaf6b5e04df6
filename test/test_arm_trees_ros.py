"""The trained ACT checkpoint through ROS, driven by py_trees RunPolicy trees (examples/arm_interrupt_trees.py).

The policy node loads ``policy:=lerobot:<flashrt_ros/sim/checkpoints/arm_act>`` and runs
against the MuJoCo sim node over topics (JointState and ``/sim/target`` in, joint commands
out), stepping only inside RunPolicy goals. One seeded episode per cell:
* uninterrupted through ROS reaches the target and equals the in-process episode bit for bit
  (the node adds no special path: same observations, same commands);
* the override tree that restores the sim and the policy is bit-identical to uninterrupted;
* the override tree that resets the policy runs to its end (its outcome is the evaluation's business).
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco", reason="mujoco is not installed (scripts/setup_sim.sh installs it)")

from rosproc import REPO  # noqa: E402

from flashrt_ros.benchmarks.arm_interrupts import ArmEpisodes  # noqa: E402
from flashrt_ros.sim.arm_policy import TRAINED  # noqa: E402

SEED = 1


def _example(name: str):
    sys.path.insert(0, str(REPO / "examples"))
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def supervisor(tmp_path_factory):
    trees = _example("arm_interrupt_trees")
    sup = trees.Supervisor("act", str(tmp_path_factory.mktemp("capsules")))
    yield sup
    sup.close()


def test_uninterrupted_through_ros_reaches_and_matches_in_process(supervisor):
    torch.set_num_threads(1)
    ros = supervisor.run(SEED, "uninterrupted", k=25)
    runner = ArmEpisodes(TRAINED["act"])
    try:
        local = runner.run(SEED, "uninterrupted")
    finally:
        runner.close()
    assert ros.success, "the trained ACT policy did not reach seed 1's target through ROS"
    assert (ros.steps_to_success, ros.actions) == (local.steps_to_success, local.actions)


def test_override_trees_through_ros(supervisor):
    plain = supervisor.run(SEED, "uninterrupted", k=25)
    restored = supervisor.run(SEED, "override_sim_restored", k=25)
    assert restored.interrupted
    assert restored.actions == plain.actions and restored.steps_to_success == plain.steps_to_success
    reset = supervisor.run(SEED, "override_reset", k=25, timeout_s=120.0)
    assert reset.interrupted and reset.jump is not None
