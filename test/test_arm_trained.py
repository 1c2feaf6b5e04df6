"""The committed trained arm policies (ACT, Diffusion Policy): they load, reach, and resume exactly.

CI-sized: a few seeded episodes in-process (the engine the node hosts and the MuJoCo
arm, ``benchmarks.arm_interrupts``); the full evaluation is
``python -m benchmarks.arm_interrupts`` (docs/benchmarks/arm_interrupts.md).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

pytest.importorskip("mujoco", reason="mujoco is not installed (scripts/setup_sim.sh installs it)")

from benchmarks.arm_interrupts import ArmEpisodes  # noqa: E402
from flashrt_ros.models.lerobot.checkpoint import read_checkpoint  # noqa: E402
from flashrt_ros.sim.arm_policy import TRAINED  # noqa: E402

TARGET_SEEDS = tuple(range(8))          # a fixed set of targets (seeds draw start pose and target)


@pytest.fixture(scope="module", params=sorted(TRAINED))
def episodes(request):
    torch.set_num_threads(1)
    runner = ArmEpisodes(TRAINED[request.param])
    yield request.param, runner
    runner.close()


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_committed_checkpoint_is_lerobot_format_small_and_fp16(name):
    path = TRAINED[name]
    ckpt = read_checkpoint(path)                     # our strict reader: config, weights, processors
    assert ckpt.policy_type == name
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F16"}, dtypes
    size = sum(p.stat().st_size for p in path.iterdir())
    assert size < 8e6, f"{path}: {size / 1e6:.1f} MB"
    log = json.loads((path / "training_log.json").read_text())
    assert log["steps"] > 0 and log["loss_curve"] and log["machine"]["cpu"]


# ACT (the demo's policy) reached 98 % of 50 evaluation seeds, the Diffusion Policy 78 % (95 % CI
# 65-87 %; it stops a median 2.8 cm from the target, close to the 3 cm radius, so a different CPU's
# rounding can flip a seed): docs/benchmarks/arm_interrupts.md.
REQUIRED = {"act": 0.8, "diffusion": 0.5}


def test_trained_policy_reaches_most_fixed_targets_uninterrupted(episodes):
    name, runner = episodes
    results = [runner.run(seed, "uninterrupted") for seed in TARGET_SEEDS]
    reached = [r.seed for r in results if r.success]
    assert len(reached) >= REQUIRED[name] * len(TARGET_SEEDS), \
        f"{name} reached only seeds {reached} of {TARGET_SEEDS}"


def test_sim_restored_interrupt_is_bit_identical_to_uninterrupted(episodes):
    name, runner = episodes
    for seed in TARGET_SEEDS[:2]:
        plain = runner.run(seed, "uninterrupted")
        restored = runner.run(seed, "override_sim_restored")
        assert restored.interrupted, f"{name} seed {seed}: the task ended before the interrupt"
        assert restored.actions == plain.actions, f"{name} seed {seed}: actions differ after the restore"
        assert (restored.success, restored.steps_to_success) == (plain.success, plain.steps_to_success)
