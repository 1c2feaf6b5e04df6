"""Replanning beside the control loop: does the control step stay within its period, and what does it cost?

Two parts (issue #40):

* ``loop``: a LeRobot checkpoint (ACT, Diffusion, SmolVLA; ``benchmarks.policies`` /
  ``benchmarks.smolvla`` build them with seeded weights) stepped by a real-time loop at each
  ``--rates`` for ``--seconds``, once per replanning mode (sync, async replace, async blend, rtc
  for SmolVLA). Per run: the share of control steps longer than the period, the step time
  p50 / p99 / max, held steps (the last command again: a plan was late, or the queue ran dry),
  the plans' turnaround and delay, the reaction latency (an observation to the first action
  planned from it) and the chunk-switch discontinuity: p99 of ``max |a_t - a_(t-1)|`` over steps
  where a new chunk took over, against the same within a chunk.
* ``arm``: the trained ACT and Diffusion Policy on the MuJoCo arm (in-process, lock-step) with a
  simulated inference delay of ``--delays`` control steps, per mode, ``--episodes`` seeds each:
  sync waits the delay at every replan (the arm holds), async plans beside the loop and merges
  ``delay`` steps later (the virtual clock: ``late: wait``). Reported: reached within the time
  limit (200 control periods, holds included), and "on the target and at rest at the end".
  RTC needs a flow-matching policy: the arm's checkpoints are ACT and Diffusion, so it is not run.

    python -m benchmarks.realtime loop --policy smolvla --size full --device cuda --dtype bfloat16 \\
        --rates 30 50 --seconds 60 --json OUT.json --md OUT.md
    python -m benchmarks.realtime loop --policy act --size smoke --seconds 5     # checks the script runs
    python -m benchmarks.realtime arm --episodes 50 --delays 0 3 6 10 --json OUT.json --md OUT.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from benchmarks.provenance import provenance, summary_line  # noqa: E402
from flashrt_ros.engine.chunk_planner import ReplanConfig  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.models.policy_factory import make_policy  # noqa: E402

MODES = {"sync": dict(mode="sync"), "async": dict(mode="async"), "blend": dict(mode="async", blend_steps=5),
         "rtc": dict(mode="rtc")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# --- part 1: the loop ------------------------------------------------------------------------
def build(policy: str, size: str, directory: Path) -> tuple[list[dict], str | None]:
    """A checkpoint in ``directory``; returns a few observations to cycle and the instruction (VLAs)."""
    if policy == "smolvla":
        from benchmarks.smolvla import TASK, make_checkpoint
        _, _, obs = make_checkpoint(directory, smoke=size == "smoke")
        return variants(obs), TASK
    from benchmarks.policies import make_checkpoint
    _, obs = make_checkpoint(policy, directory, size)
    return variants(obs), None


def variants(obs: dict[str, torch.Tensor], n: int = 8) -> list[dict[str, torch.Tensor]]:
    """``n`` observations around ``obs`` (so consecutive chunks differ), seeded."""
    gen = torch.Generator().manual_seed(7)
    return [{k: (v + 0.05 * i * torch.randn(v.shape, generator=gen)).clamp(0, 1) if v.dim() == 3
             else v + 0.2 * i * torch.randn(v.shape, generator=gen) for k, v in obs.items()} for i in range(n)]


def engine_for(directory: Path, mode: str, device: torch.device, dtype: torch.dtype, period_s: float,
               task: str | None, tmp: Path) -> PolicyEngine:
    policy = make_policy(f"lerobot:{directory}", dtype)
    if task:
        policy.set_default_instruction(task)
    replan = ReplanConfig(period_s=period_s, **MODES[mode])
    return PolicyEngine(policy, device=device, cuda_graph=device.type == "cuda", directory=str(tmp),
                        device_budget_bytes=4 << 30, replan=replan)


def run_loop(engine: PolicyEngine, observations: list[dict], rate: float, seconds: float,
             warmup_s: float) -> dict[str, Any]:
    """Real time: one ``engine.step`` per period; what each step cost and what it did."""
    period = 1.0 / rate
    obs = [{k: v.to(engine.device) for k, v in o.items()} for o in observations]
    engine.capsules.reset()
    for i in range(max(3, int(warmup_s * rate))):      # graphs, first plans, the turnaround estimate
        engine.step(obs[i % len(obs)])
    engine.capsules.reset()
    t0 = time.perf_counter()
    engine.step(obs[-1])                            # the cold start: nothing to execute before a first plan
    cold_start_ms = (time.perf_counter() - t0) * 1e3
    start = dict(engine.counts)
    times, actions, switched = [], [], []
    launches: list[int] = []
    reaction_s: list[float] = []
    by_kind: dict[str, list[float]] = {}             # step times by what the step did (pop, launch, merge, ...)
    deadline = time.perf_counter()
    steps = int(seconds * rate)
    for i in range(steps):
        time.sleep(max(0.0, deadline - time.perf_counter()))   # sleeping, as a ROS timer does: a spinning
        # control thread would hold the GIL and starve a CPU planner thread
        replans = engine.next_step_replans()
        before = dict(engine.counts)
        t0 = time.perf_counter()
        action = engine.step(obs[i % len(obs)])
        t1 = time.perf_counter()
        times.append(t1 - t0)
        actions.append(action.float().cpu())
        merged = engine.counts["merged"] > before["merged"]
        switched.append(bool(replans) or merged)
        if replans:
            reaction_s.append(t1 - t0)
        launched = engine.counts["launched"] > before["launched"]
        kind = ("sync plan" if replans else "held" if engine.counts["held"] > before["held"]
                else "+".join(k for k, hit in (("merge", merged), ("launch", launched)) if hit) or "pop")
        by_kind.setdefault(kind, []).append((t1 - t0) * 1e3)
        if launched:
            launches.append(i)
        if merged and launches:
            reaction_s.append((i - launches.pop(0)) * period + (t1 - t0))
        deadline += period
        if time.perf_counter() > deadline:          # overran: the next step starts at once
            deadline = time.perf_counter()
    nonfinite = sum(not bool(torch.isfinite(a).all()) for a in actions)
    jumps = [float((actions[i] - actions[i - 1]).abs().max()) for i in range(1, len(actions))]
    at_switch = [j for j, s in zip(jumps, switched[1:]) if s]
    within = [j for j, s in zip(jumps, switched[1:]) if not s]
    status = engine.replan_status()
    ms = [t * 1e3 for t in times]
    return {"rate_hz": rate, "steps": steps, "cold_start_ms": cold_start_ms, "over_period_share": sum(t > period for t in times) / steps,
            "step_p50_ms": percentile(ms, 50), "step_p99_ms": percentile(ms, 99), "step_max_ms": max(ms),
            "held": engine.counts["held"] - start["held"], "late": engine.counts["late"] - start["late"],
            "merged": engine.counts["merged"] - start["merged"], "delay_steps": status.get("delay_steps"),
            "turnaround_p50_ms": status.get("turnaround_p50_ms"), "turnaround_p95_ms": status.get("turnaround_p95_ms"),
            "reaction_p50_ms": percentile([r * 1e3 for r in reaction_s], 50) if reaction_s else math.nan,
            "reaction_p99_ms": percentile([r * 1e3 for r in reaction_s], 99) if reaction_s else math.nan,
            "step_ms_by_kind": {k: {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99), "max": max(v)}
                                for k, v in sorted(by_kind.items())},
            "nonfinite_actions": nonfinite,
            "switch_jump_p99": percentile(at_switch, 99) if at_switch else math.nan,
            "within_chunk_jump_p99": percentile(within, 99) if within else math.nan}


def loop_part(args: argparse.Namespace) -> dict[str, Any]:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    tmp = Path(tempfile.mkdtemp(prefix="realtime_"))
    observations, task = build(args.policy, args.size, tmp / "ckpt")
    modes = [m for m in args.modes if m != "rtc" or args.policy == "smolvla"]
    rows = []
    for rate in args.rates:
        for mode in modes:
            engine = engine_for(tmp / "ckpt", mode, device, dtype, 1.0 / rate, task, tmp / f"caps_{mode}_{rate}")
            try:
                row = run_loop(engine, observations, rate, args.seconds, args.warmup)
            finally:
                engine.close()
            row.update(mode=mode, policy=args.policy, size=args.size, dtype=args.dtype)
            print(json.dumps(row), flush=True)
            rows.append(row)
            write(args, {"part": "loop", "rows": rows})     # a run cut short keeps what finished
    return {"part": "loop", "rows": rows}


# --- part 2: the arm --------------------------------------------------------------------------
def arm_episode(engine: PolicyEngine, sim: Any, criterion: Any, seed: int, mode: str, delay: int) -> dict:
    """One episode; ``delay`` control periods of inference, held (sync) or planned beside (async)."""
    from benchmarks.arm_interrupts import arm_observation
    from flashrt_ros.models.policy_interface import RNG_SEED
    sim.reset(seed)
    if RNG_SEED in engine.arena:
        engine.capsules.reset(seed=seed)
    else:
        engine.capsules.reset()
    observe = lambda: arm_observation(sim)  # noqa: E731
    last = sim.joint_positions()
    reached_at = None
    t = 0
    switch_jumps: list[float] = []                   # max |a_t - a_(t-1)| where a new chunk took over
    while t < criterion.time_limit_steps:
        if mode == "sync" and delay and engine.next_step_replans():
            for _ in range(min(delay, criterion.time_limit_steps - t)):   # the arm holds while the plan runs
                sim.step(last)
                t += 1
                if reached_at is None and criterion.reached(sim.tip_xy(), sim.target_xy(), sim.joint_velocities()):
                    reached_at = t
            if t >= criterion.time_limit_steps:
                break
        replans = engine.next_step_replans()
        merged = engine.counts["merged"]
        action = engine.step(observe()).numpy().astype(np.float64)
        if t and (replans or engine.counts["merged"] > merged):
            switch_jumps.append(float(np.max(np.abs(action - last))))
        sim.step(action)
        last = action
        t += 1
        if reached_at is None and criterion.reached(sim.tip_xy(), sim.target_xy(), sim.joint_velocities()):
            reached_at = t
    at_end = criterion.reached(sim.tip_xy(), sim.target_xy(), sim.joint_velocities())
    return {"seed": seed, "reached": reached_at is not None, "reached_at": reached_at, "held_at_end": bool(at_end),
            "distance_m": float(sim.distance_to_target()), "switch_jumps": switch_jumps}


def arm_part(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.arm_interrupts import wilson
    from flashrt_ros.sim.arm import ArmConfig, ArmSim
    from flashrt_ros.sim.arm_policy import trained_policy_spec
    from flashrt_ros.sim.arm_task import ReachCriterion
    criterion, sim = ReachCriterion(), ArmSim(ArmConfig(render=False))
    rows = []
    try:
        for name in args.policies:
            for mode in [m for m in args.modes if m != "rtc"]:
                for delay in args.delays:
                    if mode != "sync" and delay == 0:
                        continue                # a plan beside the loop merges one step later at the earliest
                    cfg = ReplanConfig(**{**MODES[mode], "delay_steps": delay if mode != "sync" else 0,
                                          "late": "wait"})
                    engine = PolicyEngine(make_policy(trained_policy_spec(name)), replan=cfg)
                    try:
                        eps = [arm_episode(engine, sim, criterion, s, mode, delay) for s in range(args.episodes)]
                    finally:
                        engine.close()
                    wins, held = sum(e["reached"] for e in eps), sum(e["held_at_end"] for e in eps)
                    row = {"policy": name, "mode": mode, "delay_steps": delay, "episodes": len(eps),
                           "reached": wins / len(eps), "reached_ci": wilson(wins, len(eps)),
                           "on_target_at_end": held / len(eps), "on_target_at_end_ci": wilson(held, len(eps)),
                           "median_final_distance_m": float(np.median([e["distance_m"] for e in eps])),
                           "switch_jump_p99_rad": percentile([j for e in eps for j in e["switch_jumps"]], 99)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    write(args, {"part": "arm", "rows": rows})
    finally:
        sim.close()
    return {"part": "arm", "rows": rows}


# --- report -------------------------------------------------------------------------------------
STEP_KINDS = ("pop", "launch", "merge", "merge+launch", "held", "sync plan")   # what a loop step did


def markdown(result: dict[str, Any]) -> str:
    p = result["provenance"]
    load = p["load_average"][0] if p.get("load_average") else float("nan")
    lines = [f"# Replanning beside the loop: {result['part']}", "", f"{summary_line(p)}; "
             f"load {load:.2f} at the end", ""]
    if result["part"] == "loop":
        lines += ["| policy | dtype | Hz | mode | cold start ms | steps over the period | step p50 / p99 / max ms | held | late | "
                  "delay steps | plan p50 / p95 ms | reaction p50 / p99 ms | jump p99 at switch / within chunk |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["rows"]:
            lines.append(f"| {r['policy']} | {r['dtype']} | {r['rate_hz']:g} | {r['mode']} | {r['cold_start_ms']:.1f} | "
                         f"{100 * r['over_period_share']:.2f} % | {r['step_p50_ms']:.2f} / {r['step_p99_ms']:.2f} / "
                         f"{r['step_max_ms']:.1f} | {r['held']} | {r['late']} | {r['delay_steps'] or '-'} | "
                         f"{_ms(r['turnaround_p50_ms'])} / {_ms(r['turnaround_p95_ms'])} | "
                         f"{_ms(r['reaction_p50_ms'])} / {_ms(r['reaction_p99_ms'])} | "
                         f"{r['switch_jump_p99']:.4f} / {r['within_chunk_jump_p99']:.4f} |")
        lines += ["", "Step time by what the step did (ms, n / p50 / p99 / max): where a p99 comes from.", "",
                  "| policy | Hz | mode | " + " | ".join(STEP_KINDS) + " |", "| --- | --- | --- |" + " --- |" * len(STEP_KINDS)]
        for r in result["rows"]:
            kinds = r.get("step_ms_by_kind", {})
            cells = [f"{k['n']} / {k['p50']:.2f} / {k['p99']:.2f} / {k['max']:.2f}" if (k := kinds.get(name)) else "-"
                     for name in STEP_KINDS]
            lines.append(f"| {r['policy']} | {r['rate_hz']:g} | {r['mode']} | " + " | ".join(cells) + " |")
    else:
        lines += ["| policy | mode | delay (steps) | reached (95 % CI) | on target at the end (95 % CI) | "
                  "median final distance m | jump p99 at a chunk switch (rad) | episodes |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["rows"]:
            lines.append(f"| {r['policy']} | {r['mode']} | {r['delay_steps']} | {100 * r['reached']:.0f} % "
                         f"({100 * r['reached_ci'][0]:.0f}-{100 * r['reached_ci'][1]:.0f}) | "
                         f"{100 * r['on_target_at_end']:.0f} % ({100 * r['on_target_at_end_ci'][0]:.0f}-"
                         f"{100 * r['on_target_at_end_ci'][1]:.0f}) | {r['median_final_distance_m']:.3f} | "
                         f"{r['switch_jump_p99_rad']:.3f} | {r['episodes']} |")
    return "\n".join(lines) + "\n"


def _ms(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    loop = sub.add_parser("loop")
    loop.add_argument("--policy", choices=("act", "diffusion", "smolvla"), default="act")
    loop.add_argument("--size", choices=("smoke", "cpu", "full"), default="smoke")
    loop.add_argument("--device", default="cpu")
    loop.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    loop.add_argument("--rates", type=float, nargs="+", default=[30.0, 50.0])
    loop.add_argument("--seconds", type=float, default=60.0)
    loop.add_argument("--warmup", type=float, default=2.0)
    loop.add_argument("--modes", nargs="+", default=list(MODES), choices=tuple(MODES))
    arm = sub.add_parser("arm")
    arm.add_argument("--policies", nargs="+", default=["act", "diffusion"], choices=("act", "diffusion"))
    arm.add_argument("--episodes", type=int, default=50)
    arm.add_argument("--delays", type=int, nargs="+", default=[0, 3, 6, 10])
    arm.add_argument("--modes", nargs="+", default=["sync", "async", "blend"], choices=tuple(MODES))
    for p in (loop, arm):
        p.add_argument("--json", type=Path)
        p.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    try:
        result = loop_part(args) if args.part == "loop" else arm_part(args)
    finally:
        torch.set_num_threads(threads)          # a caller in the same process (a test) keeps its own
    result["failures"] = failures(result)
    print(write(args, result))
    if result["failures"]:
        print("CHECK FAILED: " + "; ".join(result["failures"]), flush=True)
        return 1
    return 0


def failures(result: dict[str, Any]) -> list[str]:
    """The run's own checks, which hold on any machine however loaded (timings are reported, not
    checked): every run stepped and its steps add up by kind, every action is finite, a synchronous
    run planned and a run beside the loop merged a plan; every arm row ran its episodes."""
    failed = []
    for r in result["rows"]:
        if result["part"] == "loop":
            name = f"{r['policy']} {r['dtype']} {r['rate_hz']:g} Hz {r['mode']}"
            kinds = r.get("step_ms_by_kind", {})
            if r["steps"] <= 0 or sum(k["n"] for k in kinds.values()) != r["steps"]:
                failed.append(f"{name}: {r['steps']} steps, {sum(k['n'] for k in kinds.values())} counted by kind")
            if r.get("nonfinite_actions"):
                failed.append(f"{name}: {r['nonfinite_actions']} actions not finite")
            if r["mode"] == "sync" and "sync plan" not in kinds:
                failed.append(f"{name}: no step planned")
            if r["mode"] != "sync" and r["merged"] <= 0:
                failed.append(f"{name}: no plan was merged beside the loop")
        else:
            name = f"{r['policy']} {r['mode']} delay {r['delay_steps']}"
            if r["episodes"] <= 0 or not math.isfinite(r["median_final_distance_m"]):
                failed.append(f"{name}: {r['episodes']} episodes, median final distance {r['median_final_distance_m']}")
    return failed


def write(args: argparse.Namespace, result: dict[str, Any]) -> str:
    """The result with its provenance into ``--json`` and ``--md`` (rewritten after every row); the markdown."""
    result["provenance"] = provenance(getattr(args, "device", "cpu"), {"torch_threads": torch.get_num_threads()})
    text = markdown(result)
    for path, content in ((args.json, json.dumps(result, indent=1) + "\n"), (args.md, text)):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    return text


if __name__ == "__main__":
    sys.exit(main())
