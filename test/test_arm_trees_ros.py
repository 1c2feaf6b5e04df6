"""The trained ACT checkpoint through ROS, driven by py_trees RunPolicy trees (examples/arm_interrupt_trees.py).

The policy node loads ``policy:=lerobot:<flashrt_ros/sim/checkpoints/arm_act>`` and runs
against the MuJoCo sim node over topics (JointState and ``/sim/target`` in, joint commands
out), stepping only inside RunPolicy goals. One seeded episode per cell, the cells one
after another on the same nodes (as the evaluation runs them):
* uninterrupted through ROS reaches the target and equals the in-process episode bit for bit
  (the node adds no special path: same observations, same commands);
* the override tree that restores the sim and the policy is bit-identical to uninterrupted;
* the override tree that resets the policy and the pause tree that restores it run to their end.

Each episode ends only when its tree has ended and the node has settled (no goal running or
on its way, every command delivered), and the supervisor never ticks a finished tree again:
re-ticking one re-sent its RunPolicy goal, which then stepped on the next episode's first
observation and stalled it (``test_a_finished_episode_tree_is_not_ticked_again``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from types import SimpleNamespace

import py_trees
import pytest
import torch
from py_trees.common import ParallelPolicy, Status

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco", reason="mujoco is not installed (scripts/setup_sim.sh installs it)")

from rosproc import REPO  # noqa: E402
from test_policy_bt_behaviours import FakeClient  # noqa: E402

from benchmarks.arm_interrupts import ArmEpisodes  # noqa: E402
from flashrt_ros.bt import RunPolicy  # noqa: E402
from flashrt_ros.bt.requests import halted_goals_settled  # noqa: E402
from flashrt_ros.sim.arm_policy import TRAINED  # noqa: E402

SEED = 1
EPISODE_TIMEOUT_S = 300.0     # a condition deadline: a healthy episode takes seconds, even on a loaded CPU


def _example(name: str):
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(REPO / "examples"))
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_finished_episode_tree_is_not_ticked_again():
    """The episode's parallel ends with "task done?" while its RunPolicy goal runs. Until the
    halted goal has reported, the supervisor waits; ticking the finished tree meanwhile would
    start it over and send a second goal (the stray goal of the old stall)."""
    trees = _example("arm_interrupt_trees")
    client, done = FakeClient(), SimpleNamespace(value=False)
    tree = py_trees.composites.Parallel("episode", ParallelPolicy.SuccessOnOne(), children=[
        trees.Condition("task done?", lambda: done.value, running=True),
        RunPolicy("policy drives", client, max_steps=200)])

    def node(ticks=[0]) -> None:            # noqa: B006 - the fake node's side, once per tick
        ticks[0] += 1
        goal = client.goals[0]
        if ticks[0] == 1:
            goal.future.set_result(goal.handle)     # accepted
        elif ticks[0] == 2:
            done.value = True                       # the mux saw the target reached
    polls = []

    def settled() -> bool:
        polls.append(1)
        first = client.goals[0]
        if len(polls) == 1:                         # the cancelled goal reports its result
            first.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
                success=True, error_code=0, message="cancelled", steps=2, rolled_back=False), status=5))
        return len(polls) > 5 and halted_goals_settled(client)

    status = trees.tick_to_end(tree, settled, deadline=float("inf"), on_tick=node, period_s=0.0)
    assert status is Status.SUCCESS
    assert client.goals[0].cancelled, "the running goal was cancelled when the task was done"
    assert len(client.goals) == 1, "the finished tree was ticked again and sent another RunPolicy goal"


@pytest.fixture(scope="module")
def supervisor(tmp_path_factory):
    trees = _example("arm_interrupt_trees")
    sup = trees.Supervisor("act", str(tmp_path_factory.mktemp("capsules")))
    yield sup
    sup.close()


@pytest.fixture(scope="module")
def uninterrupted(supervisor):
    return supervisor.run(SEED, "uninterrupted", k=25, timeout_s=EPISODE_TIMEOUT_S)


def test_uninterrupted_through_ros_reaches_and_matches_in_process(uninterrupted):
    torch.set_num_threads(1)
    runner = ArmEpisodes(TRAINED["act"])
    try:
        local = runner.run(SEED, "uninterrupted")
    finally:
        runner.close()
    assert uninterrupted.success, "the trained ACT policy did not reach seed 1's target through ROS"
    assert (uninterrupted.steps_to_success, uninterrupted.actions) == (local.steps_to_success, local.actions)


def test_override_trees_through_ros(supervisor, uninterrupted):
    restored = supervisor.run(SEED, "override_sim_restored", k=25, timeout_s=EPISODE_TIMEOUT_S)
    assert restored.interrupted
    assert restored.actions == uninterrupted.actions
    assert restored.steps_to_success == uninterrupted.steps_to_success
    reset = supervisor.run(SEED, "override_reset", k=25, timeout_s=EPISODE_TIMEOUT_S)
    assert reset.interrupted and reset.jump is not None


def test_pause_tree_through_ros_and_the_episode_after_it(supervisor, uninterrupted):
    paused = supervisor.run(SEED, "pause_restore", k=25, timeout_s=EPISODE_TIMEOUT_S)
    assert paused.interrupted and paused.jump is not None
    again = supervisor.run(SEED, "uninterrupted", k=25, timeout_s=EPISODE_TIMEOUT_S)
    assert again.actions == uninterrupted.actions, "an episode after the interrupt trees is not the same"
