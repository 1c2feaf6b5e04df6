"""Real-Time Chunking at parity with LeRobot 0.4.4's ``RTCProcessor`` (CPU, fp32).

Three levels: the prefix weights for every schedule, one guided velocity on the same inputs
(``RTCProcessor.denoise_step`` around the same velocity function), and a whole SmolVLA chunk
planned with guidance against ``SmolVLAPolicy.predict_action_chunk`` with ``rtc_config``
enabled, same weights, instruction, noise, leftover and delay.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lerobot_reference import case_features, lerobot, max_relative_error, observations, processors
from smolvla_reference import TINY, make_smolvla_checkpoint, write_vlm_directory
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.models.policy_interface import Guidance
from flashrt_ros.models.rtc import SCHEDULES, guided_velocity, leftover_target, prefix_weights
from flashrt_ros.ops.counter_rng import normal

TASK = "pick up the red cube"
TOLERANCE = 1e-5


def rtc_processor(schedule: str, horizon: int = 10, max_weight: float = 10.0):
    lerobot()
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from lerobot.policies.rtc.modeling_rtc import RTCProcessor
    return RTCProcessor(RTCConfig(enabled=True, prefix_attention_schedule=RTCAttentionSchedule(schedule.upper()),
                                  execution_horizon=horizon, max_guidance_weight=max_weight))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_prefix_weights_equal_lerobots(schedule):
    proc = rtc_processor(schedule)
    for total in (5, 16, 50):
        for delay in (0, 1, 3, 7):
            for horizon in (1, 4, 10, 50):
                ours = prefix_weights(delay, horizon, total, schedule)
                theirs = proc.get_prefix_weights(delay, horizon, total)
                assert torch.equal(ours, theirs.to(torch.float32)), (schedule, total, delay, horizon)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_one_guided_velocity_equals_rtc_processor_denoise_step(schedule):
    torch.manual_seed(0)
    chunk, dim, actions = 16, 6, 4
    proc = rtc_processor(schedule, horizon=10, max_weight=5.0)
    w = torch.randn(dim, dim) / dim ** 0.5

    def velocity(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w) - 0.3 * x

    queue = torch.randn(12, actions)
    for left, delay in ((12, 3), (7, 2), (3, 5), (1, 0)):
        target = leftover_target(queue, torch.tensor(left), chunk, dim)
        weights = prefix_weights(delay, min(10, left), chunk, schedule)
        for step, time in enumerate((1.0, 0.9, 0.5, 0.1)):
            x = torch.randn(chunk, dim)
            ours = guided_velocity(x, time, velocity(x), target, weights, 5.0)
            theirs = proc.denoise_step(x_t=x.clone(), prev_chunk_left_over=queue[12 - left:], inference_delay=delay,
                                       time=time, original_denoise_step_partial=velocity, execution_horizon=10)
            assert torch.equal(ours, theirs), (schedule, left, delay, time, (ours - theirs).abs().max())


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    return write_vlm_directory(tmp_path_factory.mktemp("smolvlm2_tiny"), TINY)


@pytest.mark.parametrize("delay, left", [(2, 6), (3, 4)])
def test_a_guided_smolvla_chunk_equals_lerobots_predict_action_chunk_with_rtc(tmp_path, vlm_dir, delay, left):
    case = dict(cameras=1, hw=(32, 32), state=4, env=0, action=3, norm="MEAN_STD", cfg=dict(n_action_steps=6))
    directory, ref, config = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm_dir)
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    ref.config.rtc_config = RTCConfig(enabled=True, execution_horizon=8, max_guidance_weight=10.0,
                                      prefix_attention_schedule=RTCAttentionSchedule.LINEAR)
    ref.init_rtc_processor()
    obs = observations(case_features(case), 1, seed=7)[0]
    gen = torch.Generator().manual_seed(11)
    queue = torch.randn(config.n_action_steps, case["action"], generator=gen)      # normalised, as queued
    pre, _ = processors(config, directory)
    noise = normal(torch.tensor(0), torch.tensor(0), config.chunk_size * config.max_action_dim)
    with torch.no_grad():
        ref.reset()
        theirs = ref.predict_action_chunk(pre({**{k: v.clone() for k, v in obs.items()}, "task": TASK}),
                                          noise=noise.view(1, config.chunk_size, config.max_action_dim),
                                          inference_delay=delay, prev_chunk_left_over=queue[-left:].unsqueeze(0),
                                          execution_horizon=8)[0]
    engine = PolicyEngine(make_policy(f"lerobot:{directory}"), directory=str(tmp_path / "capsules"))
    from flashrt_ros.engine.vla import set_instruction
    set_instruction(engine, TASK)
    policy = engine.policy
    guide = Guidance(queue, torch.tensor(left), prefix_weights(delay, min(8, left), config.chunk_size, "linear"),
                     max_weight=10.0)
    with torch.no_grad():
        policy.plan(obs, engine.arena, guide)
        ours = engine.arena[policy.QUEUE].clone()
        policy.plan(obs, engine.arena)          # the same plan without guidance (noise counter moved on)
    n = config.n_action_steps
    err = max_relative_error(ours, theirs[:n])
    print(f"delay {delay}, {left} left: max relative error {err:.2e}")
    assert err <= TOLERANCE
    with torch.no_grad():
        ref.config.rtc_config = None
        ref.init_rtc_processor()
        unguided = ref.predict_action_chunk(pre({**{k: v.clone() for k, v in obs.items()}, "task": TASK}),
                                            noise=noise.view(1, config.chunk_size, config.max_action_dim))[0]
    assert (unguided[:n] - theirs[:n]).abs().max() > 1e-3, "the guidance changes the chunk"


@pytest.mark.parametrize("mode", ["async", "rtc"])
def test_smolvla_plans_beside_the_loop_and_a_capsule_in_flight_continues_exactly(tmp_path, vlm_dir, mode):
    """The prefix KV, noise counter and queue a plan writes ride in the capsule (async.copy.*)."""
    from flashrt_ros.engine.chunk_planner import ACTIVE, ReplanConfig
    from flashrt_ros.engine.vla import set_instruction
    case = dict(cameras=1, hw=(32, 32), state=4, env=0, action=3, norm="MEAN_STD", cfg=dict(n_action_steps=6))
    directory, _, _ = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm_dir)
    engine = PolicyEngine(make_policy(f"lerobot:{directory}"), directory=str(tmp_path / "capsules"),
                          replan=ReplanConfig(mode=mode, delay_steps=2, late="wait", rtc_horizon=4))
    set_instruction(engine, TASK)
    obs = observations(case_features(case), 20, seed=3)
    first = [engine.step(o) for o in obs[:5]]
    assert int(engine.arena[ACTIVE]) == 1
    engine.capsules.snapshot("in_flight")
    once = [engine.step(o) for o in obs[5:]]
    engine.capsules.restore("in_flight")
    again = [engine.step(o) for o in obs[5:]]
    assert all(torch.equal(a, b) for a, b in zip(once, again))
    assert engine.replan_status()["merged"] >= 3 and len(first) == 5
