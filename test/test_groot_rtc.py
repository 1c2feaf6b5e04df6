"""GR00T N1.5 planning beside the loop with Real-Time Chunking (``replan: rtc``), against LeRobot (CPU, tiny, fp32).

LeRobot 0.4.4's GR00T takes no RTC, and its RTC (``RTCProcessor``, the RTC ``ActionQueue``) is written for π's
flow, which falls from noise at time 1; GR00T's rises from noise at t = 0. The reference
(``groot_reference.reference.rtc_run``) therefore guides LeRobot's own GR00T denoising loop, unchanged otherwise,
with LeRobot's ``RTCProcessor`` called in π's frame (time ``1 - t``, velocity ``-v``), and runs LeRobot's RTC queue
bookkeeping the way its real-robot example does (``rtc_reference.lerobot_rtc_run``). The engine makes every choice
itself (when to plan, the leftover it guides toward, the delay, the horizon, where the merged chunk starts); every
guided chunk and the queue after every step must equal the reference's bit for bit (the same float32 operations in
the same order: ``guided_rising_velocity`` is ``guided_velocity`` mapped by exact negations).

``n_action_steps`` is the whole 16-row chunk, as LeRobot's RTC queue keeps it. Our queue keeps the chunk's last
``n_action_steps`` rows (LeRobot's bounded deque), and with fewer than 16 the guidance is laid on those rows: the
last test checks that a shorter queue is pulled toward its leftover too.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from host_reads import no_host_reads
from rtc_reference import engine_run
from tiny_groot import reference_observations, run
from flashrt_ros.engine.chunk_planner import ReplanConfig
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction
from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.policy_interface import Guidance
from flashrt_ros.models.rtc import prefix_weights
from flashrt_ros.runtime.arena import StateArena

HORIZON, STEPS, PLANS = 16, 36, 8
#: fast vs exact, max |difference| over the largest |action|: test_groot_fast.py's bound and its reasons (fast only
#: rounds differently; the guidance adds a few float32 operations a flow step)
FAST_BOUND = 1e-5
#: (delay, horizon, schedule, max weight): a horizon cut to the leftover's length by LeRobot, and one shorter than it
RTC_CASES = {"linear_cut": dict(delay=3, horizon=8, schedule="linear", max_weight=10.0),
             "exp_short": dict(delay=4, horizon=2, schedule="exp", max_weight=5.0)}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """LeRobot's tiny GR00T, one checkpoint per RTC case, each with our counter stream's noise (seed 0)."""
    from groot_reference import Case, reference_inputs, reference_record, run_reference
    from safetensors.torch import save_file

    from flashrt_ros.ops.counter_rng import normal
    root = tmp_path_factory.mktemp("groot_rtc")
    m = 8                                                          # TINY's max_action_dim
    noise = torch.stack([normal(torch.tensor(0), torch.tensor(p), HORIZON * m).view(1, HORIZON, m)
                         for p in range(PLANS)])
    save_file({"noise": noise}, str(root / "noise.safetensors"))
    built = {name: Case(directory=str(root / name), attn="sdpa", n_action_steps=HORIZON, steps=STEPS,
                        noise_file=str(root / "noise.safetensors"), rtc=rtc) for name, rtc in RTC_CASES.items()}
    run_reference(list(built.values()), root / "spec")
    return {name: (case, reference_inputs(case), reference_record(case)) for name, case in built.items()}


def rtc_engine(directory: str, rtc: dict, capsules: Path, task: str, numerics: str = "exact") -> PolicyEngine:
    cfg = ReplanConfig(mode="rtc", delay_steps=rtc["delay"], late="wait", rtc_horizon=rtc["horizon"],
                       rtc_schedule=rtc["schedule"], rtc_max_weight=rtc["max_weight"])
    engine = PolicyEngine(load_lerobot_policy(directory, numerics=numerics), directory=str(capsules), replan=cfg)
    set_instruction(engine, task)
    return engine


@pytest.mark.parametrize("name", sorted(RTC_CASES))
def test_the_engines_rtc_plans_equal_lerobots_rtc_on_lerobots_groot(name, cases, tmp_path):
    case, inputs, rec = cases[name]
    engine = rtc_engine(case.directory, case.rtc, tmp_path / "capsules", case.task)
    ours, our_queues, launched = engine_run(engine, reference_observations(case, inputs))
    theirs = rec["rtc_chunks"]
    their_queues = [q[:n] for q, n in zip(rec["rtc_remaining"], rec["rtc_remaining_len"].tolist())]
    assert launched == theirs.shape[0] and len(ours) >= 2, (launched, len(ours), theirs.shape[0])
    for i, chunk in enumerate(ours):                                   # the plans merged within the run
        assert torch.equal(chunk[:, :case.action], theirs[i]), (i, (chunk[:, :case.action] - theirs[i]).abs().max())
    assert [q.shape[0] for q in our_queues] == [q.shape[0] for q in their_queues], "the queues' lengths"
    for k, (a, b) in enumerate(zip(our_queues, their_queues)):
        assert torch.equal(a[:, :case.action], b), k
    plain = rec["action_pred"]                                         # the unguided episode's chunks: the
    assert not torch.equal(theirs[0], plain[1, 0, :, :case.action]), "guidance changed the chunk"  # same noise


def test_a_queue_shorter_than_the_chunk_is_guided_on_the_rows_it_runs(tmp_path):
    """``n_action_steps`` 5 of a 16-row chunk: the queue is the chunk's rows 11..15 and the guidance is laid on
    them. At the first step a plan made beside the loop changes (delay 2), ``rtc``'s action is pulled toward the
    one the old chunk had for that step (the sync run's), which the unguided ``async`` plan is not."""
    from tiny_groot import N, tiny_checkpoint
    directory = tiny_checkpoint(tmp_path / "ckpt")
    runs = {}
    for mode in ("sync", "async", "rtc"):
        cfg = ReplanConfig(mode=mode, delay_steps=2, late="wait", rtc_horizon=N, rtc_max_weight=10.0)
        engine = PolicyEngine(load_lerobot_policy(directory), directory=str(tmp_path / mode), replan=cfg)
        set_instruction(engine, "pick up the red cube")
        runs[mode] = run(engine, 0, 2 * N)
        engine.close()
    merged = next(k for k in range(2 * N) if not torch.equal(runs["async"][k], runs["sync"][k]))
    assert 0 < merged < N and torch.equal(runs["rtc"][:merged], runs["sync"][:merged]), merged
    jump = {mode: float((runs[mode][merged] - runs["sync"][merged]).abs().max()) for mode in ("async", "rtc")}
    print(f"GR00T, step {merged}: the first merged action from the old chunk's: async {jump['async']:.3f}, "
          f"rtc {jump['rtc']:.3f}")
    assert jump["rtc"] < 0.2 * jump["async"], jump


def test_a_guided_fast_plan_equals_exact_and_reads_nothing_on_the_host(cases, tmp_path, monkeypatch):
    """``fast`` (fixed shapes, capturable) guided beside the loop: the same 36-step RTC episode as ``exact`` within
    ``FAST_BOUND``, and a guided plan's body reads nothing on the host (a CUDA graph can hold it)."""
    case, inputs, _rec = cases["linear_cut"]
    runs = {}
    for numerics in ("exact", "fast"):
        engine = rtc_engine(case.directory, case.rtc, tmp_path / numerics, case.task, numerics)
        runs[numerics] = torch.stack([engine.step(o) for o in reference_observations(case, inputs)])
        engine.close()
    error = float((runs["fast"] - runs["exact"]).abs().max() / runs["exact"].abs().max())
    print(f"GR00T RTC, fast vs exact: {error:.3g} of the largest action")
    assert error <= FAST_BOUND
    policy = load_lerobot_policy(case.directory, numerics="fast")
    policy.set_default_instruction(case.task)
    arena = StateArena(policy.state_specs())
    policy.init_state(arena)
    obs = reference_observations(case, inputs)
    with torch.no_grad():
        policy.plan({k: v.float() / 255 if v.dtype == torch.uint8 else v for k, v in obs[0].items()}, arena)
    guide = Guidance(arena[policy.QUEUE].clone(), torch.tensor(5), prefix_weights(3, 5, HORIZON, "linear"), 10.0)
    with no_host_reads(monkeypatch), torch.no_grad():
        policy.plan({k: v.float() / 255 if v.dtype == torch.uint8 else v for k, v in obs[1].items()}, arena, guide)
