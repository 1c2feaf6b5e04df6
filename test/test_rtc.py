"""Real-Time Chunking at parity with LeRobot 0.4.4's ``RTCProcessor`` (CPU, fp32).

Three levels: the prefix weights for every schedule, one guided velocity on the same inputs
(``RTCProcessor.denoise_step`` around the same velocity function), and a SmolVLA engine run with
``replan: rtc`` against LeRobot's own RTC bookkeeping (its ``ActionQueue``, ``get_left_over``,
``predict_action_chunk`` with ``rtc_config`` enabled) on the same weights, instruction, observations
and noise: the engine's choice of when to plan, leftover, delay and horizon is LeRobot's.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lerobot_reference import case_features, lerobot, max_relative_error, observations, processors
from rtc_reference import engine_run, lerobot_rtc_run
from smolvla_reference import TINY, make_smolvla_checkpoint, write_vlm_directory
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.models.rtc import (SCHEDULES, guided_rising_velocity, guided_velocity, leftover_target,
                                   prefix_weights)
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


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_rising_flow_is_the_processor_in_pis_frame(schedule):
    """GR00T's flow rises from noise at t = 0 (``x + dt v``); LeRobot's ``RTCProcessor`` is written for π's, which
    falls from noise at time 1. ``guided_rising_velocity`` equals the processor given ``1 - t`` and ``-v``, negated,
    to the bit; and it is not the processor given ``t`` and ``v`` as they are (the frames differ)."""
    torch.manual_seed(1)
    chunk, dim = 16, 6
    proc = rtc_processor(schedule, horizon=8, max_weight=5.0)
    queue = torch.randn(16, 4)
    for left, delay in ((9, 3), (4, 2)):
        target = leftover_target(queue, torch.tensor(left), chunk, dim)
        weights = prefix_weights(delay, min(8, left), chunk, schedule)
        for t in (0.0, 0.25, 0.5, 0.75):
            x, v = torch.randn(chunk, dim), torch.randn(chunk, dim)
            ours = guided_rising_velocity(x, t, v, target, weights, 5.0)
            theirs = -proc.denoise_step(x_t=x.clone(), prev_chunk_left_over=queue[16 - left:], inference_delay=delay,
                                        time=1 - t, original_denoise_step_partial=lambda _x: -v, execution_horizon=8)
            assert torch.equal(ours, theirs), (schedule, left, delay, t, (ours - theirs).abs().max())
            if schedule != "zeros" or delay:
                as_is = proc.denoise_step(x_t=x.clone(), prev_chunk_left_over=queue[16 - left:],
                                          inference_delay=delay, time=t, original_denoise_step_partial=lambda _x: v,
                                          execution_horizon=8)
                assert not torch.equal(ours, as_is)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    return write_vlm_directory(tmp_path_factory.mktemp("smolvlm2_tiny"), TINY)


@pytest.mark.parametrize("delay, horizon", [(2, 8), (3, 2)])
def test_the_engines_rtc_plans_equal_lerobots_own_real_time_chunking(tmp_path, vlm_dir, delay, horizon):
    """The engine's ``replan: rtc`` path, every choice its own (when to plan, the leftover it guides
    toward, the delay, the horizon, where the merged chunk starts), against LeRobot's RTC bookkeeping
    (``rtc_reference.lerobot_rtc_run``) on the same observations and noise: every guided chunk, and the
    queue after every step. ``n_action_steps = chunk_size``: then LeRobot's RTC queue (a whole chunk)
    and ours (which keeps ``n_action_steps``) run the same actions. Horizon 8 is cut by LeRobot to the
    leftover's length, horizon 2 is shorter than the leftover. Tolerance: relative ``TOLERANCE``
    (the same operations, kernels that may sum in another order)."""
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from flashrt_ros.engine.chunk_planner import ReplanConfig
    from flashrt_ros.engine.vla import set_instruction
    chunk_size, steps = 8, 24
    case = dict(cameras=1, hw=(32, 32), state=4, env=0, action=3, norm="MEAN_STD",
                cfg=dict(chunk_size=chunk_size, n_action_steps=chunk_size))
    directory, ref, config = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm_dir)
    ref.config.rtc_config = RTCConfig(enabled=True, execution_horizon=horizon, max_guidance_weight=10.0,
                                      prefix_attention_schedule=RTCAttentionSchedule.LINEAR)
    ref.init_rtc_processor()
    ref.reset()
    obs = observations(case_features(case), steps, seed=7)
    pre, _ = processors(config, directory)

    def predict(k: int, plan: int, **rtc) -> torch.Tensor:           # plan ``plan``'s noise, as ours draws it
        noise = normal(torch.tensor(0), torch.tensor(plan), chunk_size * config.max_action_dim)
        with torch.no_grad():
            return ref.predict_action_chunk(pre({**{n: v.clone() for n, v in obs[k].items()}, "task": TASK}),
                                            noise=noise.view(1, chunk_size, -1), **rtc)[0]
    theirs, their_queues = lerobot_rtc_run(predict, steps, delay, ref.config.rtc_config)

    engine = PolicyEngine(make_policy(f"lerobot:{directory}"), directory=str(tmp_path / "capsules"),
                          replan=ReplanConfig(mode="rtc", delay_steps=delay, late="wait", rtc_horizon=horizon,
                                              rtc_schedule="linear", rtc_max_weight=10.0))
    set_instruction(engine, TASK)
    ours, our_queues, launched = engine_run(engine, obs)

    assert launched == len(theirs) and len(ours) >= 3, (launched, len(ours), len(theirs))
    errors = [max_relative_error(a, b) for a, b in zip(ours, theirs)]      # the plans merged within the run
    print(f"delay {delay}, horizon {horizon}: {len(ours)} guided chunks, max relative error {max(errors):.2e}")
    assert max(errors) <= TOLERANCE, errors
    assert [q.shape[0] for q in our_queues] == [q.shape[0] for q in their_queues], "the queues' lengths"
    assert max(max_relative_error(a, b) for a, b in zip(our_queues, their_queues)) <= TOLERANCE
    launch = next(k for k, q in enumerate(their_queues) if q.shape[0] <= delay)
    unguided = predict(launch, 1)                      # the first guided plan without its guidance
    assert (unguided - theirs[0]).abs().max() > 1e-3, "the guidance changes the chunk"


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
