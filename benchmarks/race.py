"""One precision of one policy, raced: our engine against every LeRobot mode, same inputs, same noise, checked.

Why in one place: ACT, Diffusion Policy and SmolVLA are raced the same way
(``benchmarks.policies``, ``benchmarks.smolvla``):

* **same inputs**: the same host observations cycle through every side's
  episodes; **same noise**: LeRobot's ``select_action(noise=...)`` gets, at plan
  ``p``, the tensor our counter-based stream draws for plan ``p`` of the episode
  seed (drawn on the device before the episode, untimed); our engine is reset
  with that seed, so neither side changes its code;
* **checked**: the first chunk of every side's first timed episode against
  LeRobot eager fp32 (the reference, with the run's flags), and with
  ``check_steps`` every step up to there (SmolVLA: the whole episode); the max
  error relative to the largest reference action is stored, and a side above the
  precision's tolerance fails the check (ours: the run's exit status is 1;
  a LeRobot mode: it cannot be the headline's baseline);
* **ours in several numerics** (SmolVLA's ``fast`` and ``exact``): each its own
  side (``ours-fast``, ``ours-exact``), raced and checked alike; the first is the
  one the speed-ups and the headline are of;
* **fair**: LeRobot modes are warmed up until torch.compile stops compiling
  (counted), sides alternate within each round (the starting side rotates),
  every side's step is timed from the host observation to the action on the
  host, under ``torch.inference_mode()``;
* **spread**: min / median / max episode, replan and pop percentiles (a replan
  loop tops the episodes' replans up to ``replans``), steps over 20 and 33 ms,
  a bootstrap interval on each speed-up.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from benchmarks.lerobot_side import (LeRobotSide, Mode, build_policy, compile_counters, counter_delta, modes,
                                     warm_up)
from benchmarks.spread import bootstrap_ratio, over_periods, pct, three_numbers
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_interface import RNG_SEED

#: first-chunk error tolerance, relative to the largest reference action: fp32 without / with TF32, bf16
TOLERANCE = {"fp32": 1e-3, "fp32-tf32": 2e-2, "bf16": 1e-1}


def tolerance(precision: str, overrides: dict[str, float] | None = None) -> float:
    """The stated tolerance for ``precision`` (``overrides``: ``--tol-fp32`` / ``--tol-bf16``).

    fp32 is stricter when no TF32 runs (a CPU): TF32 rounds products to 10 mantissa
    bits (2^-11), about what fp16 does; bf16 keeps 8 (2^-9), and Diffusion Policy's
    DDIM update amplifies the network's rounding at the noisy end (test_lerobot_precision
    measured 4.4 % on a tiny model)."""
    if overrides and overrides.get(precision) is not None:
        return overrides[precision]
    if precision == "fp32" and torch.cuda.is_available() and torch.backends.cuda.matmul.allow_tf32:
        return TOLERANCE["fp32-tf32"]
    return TOLERANCE[precision]


def apply_eval_flags(device: torch.device) -> dict[str, Any]:
    """``lerobot_eval``'s flags, for both sides: cudnn.benchmark and TF32 on; steps under inference_mode.

    Set before any engine captures its graphs and before LeRobot compiles, so both
    sides' kernels are chosen under them. For the run only: a ``main`` that sets them runs
    under ``eval_flags_restored`` (a test calling it must not leave TF32 on for the tests after)."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return {"lerobot_eval_flags": True, "inference_mode": "every step of both sides",
            "set": ["cudnn.benchmark=True", "cuda.matmul.allow_tf32=True", "cudnn.allow_tf32=True"],
            "applies_on": device.type}


@contextlib.contextmanager
def eval_flags_restored() -> Iterator[None]:
    """Put cudnn.benchmark and the TF32 flags back as they were after the block (or decorated function)."""
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        yield
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = saved


@dataclass
class RaceSettings:
    steps: int = 200                  # control steps per episode, from a reset
    episodes: int = 10                # timed episodes per side
    warmup: int = 1                   # untimed episodes per side (compiled modes: until compiling stops)
    compile_warmup_max: int = 6       # at most this many warm-up episodes for a compiled mode
    replans: int = 50                 # replanning steps per side at least (episodes + a replan loop)
    seed: int = 7                     # the episodes' noise seed
    compile_mode: str = "reduce-overhead"
    lerobot_modes: tuple[str, ...] | None = None   # None: every default mode of the precision
    tolerances: dict[str, float] = field(default_factory=dict)
    budget_s: float | None = None     # the whole run's wall-clock budget (optional LeRobot modes skipped first)
    check_steps: int | None = None    # steps checked against LeRobot eager fp32 (None: the first chunk)
    jobs_total: int = 1               # races (policy x precision) in the run, for the budget's fair shares
    jobs_done: int = 0
    compile_estimate_s: float = 90.0  # a compiled mode's warm-up, until one is measured (then the last one)
    started: float = field(default_factory=time.perf_counter)


class OurSide:
    """Our ``PolicyEngine`` behind the same surface as ``LeRobotSide``."""

    def __init__(self, engine: PolicyEngine, name: str = "ours") -> None:
        self.engine, self.name = engine, name
        self.seeded = RNG_SEED in engine.arena

    def reset(self, seed: int) -> None:
        self.engine.capsules.reset(**({"seed": seed} if self.seeded else {}))

    def will_replan(self) -> bool:
        replan = self.engine.next_step_replans()       # host mirror; reads the device once after a reset
        return True if replan is None else replan

    def step(self, obs: dict[str, torch.Tensor], noise: torch.Tensor | None) -> torch.Tensor:
        """``engine.step`` (input copy, normalisation, the graph, unnormalisation, commit, sync); action to host."""
        with torch.inference_mode():
            return self.engine.step(obs).cpu()


Side = Any   # OurSide | LeRobotSide


def episode(side: Side, observations: list[dict], steps: int, noise: Callable[[int], torch.Tensor | None],
            seed: int) -> dict[str, Any]:
    """One episode from a reset: per-step ms, which steps replanned, the actions (host), the episode ms."""
    times, replans, actions = [], [], []
    plan = 0
    t_start = time.perf_counter()
    side.reset(seed)
    for i in range(steps):
        replan = side.will_replan()
        z = noise(plan) if replan else None
        t0 = time.perf_counter()
        actions.append(side.step(observations[i % len(observations)], z))
        times.append((time.perf_counter() - t0) * 1e3)
        replans.append(replan)
        plan += replan
    return {"episode_ms": (time.perf_counter() - t_start) * 1e3, "times": times, "replans": replans,
            "actions": torch.stack([a.float().reshape(-1) for a in actions])}


def replan_times(sides: list[Side], observations: list[dict], noise: Callable[[int], torch.Tensor | None],
                 seed: int, n: int) -> dict[str, list[float]]:
    """``n`` replanning steps per side, sides interleaved: a reset (untimed) then one timed step."""
    out: dict[str, list[float]] = {s.name: [] for s in sides}
    for _ in range(n):
        for side in sides:
            side.reset(seed)
            if not side.will_replan():
                raise RuntimeError(f"{side.name}: the first step after a reset does not replan")
            t0 = time.perf_counter()
            side.step(observations[0], noise(0))
            out[side.name].append((time.perf_counter() - t0) * 1e3)
    return out


def summarize(episodes: list[dict], extra_replans: list[float]) -> dict[str, Any]:
    """Episode min / median / max, replan and pop percentiles, steps over each control period."""
    times = [t for e in episodes for t in e["times"]]
    in_episode = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if r]
    replan = in_episode + list(extra_replans)
    pop = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if not r]
    eps = [e["episode_ms"] for e in episodes]
    return {"episode_ms": three_numbers(eps)["median"], "episode": three_numbers(eps),
            "episodes_ms": [round(x, 3) for x in eps],
            "replan_p50_ms": pct(replan, 50), "replan_p99_ms": pct(replan, 99), "replans": len(replan),
            "replans_in_episodes": len(in_episode),
            "pop_p50_ms": pct(pop, 50), "pop_p99_ms": pct(pop, 99), "pops": len(pop),
            "over_period": over_periods(times)}


def first_chunk_error(actions: torch.Tensor, reference: torch.Tensor, chunk: int | None = None) -> dict[str, float]:
    """Max |a - ref| over the first ``chunk`` steps (default: the reference's), absolute and relative to the
    largest reference action there; a longer reference (the checked episode) also over all its steps
    (``episode_max_rel``, ``episode_steps``)."""
    n = min(chunk or reference.shape[0], reference.shape[0])

    def errors(m: int) -> tuple[float, float]:
        diff = (actions[:m].float() - reference[:m].float()).abs().max().item()
        return diff, diff / reference[:m].abs().max().clamp_min(1e-6).item()
    diff, rel = errors(n)
    steps = min(len(actions), reference.shape[0])
    return {"max_abs": diff, "max_rel": rel, "steps": n, "episode_max_rel": errors(steps)[1], "episode_steps": steps}


def reference_chunk(side: LeRobotSide, observations: list[dict], chunk: int,
                    noise: Callable[[int], torch.Tensor | None], seed: int) -> torch.Tensor:
    """LeRobot eager fp32's first chunk (the check's reference), one untimed run."""
    return episode(side, observations, chunk, noise, seed)["actions"]


def _budget_allows(s: RaceSettings, mode: Mode, estimate_s: float, notes: list[str], label: str) -> bool:
    """Whether warming ``mode`` up fits: a required compiled mode must fit in what is left of the budget; an
    optional one in this job's fair share (the budget split evenly over the run's jobs, unused shares carried
    forward), with room for its episodes (twice the warm-up estimate), so later required modes keep theirs."""
    if s.budget_s is None or (mode.compile_mode is None and not mode.optional):
        return True
    now = time.perf_counter() - s.started
    if mode.optional:
        share_end = s.budget_s * (s.jobs_done + 1) / max(s.jobs_total, 1)
        need, left = 2 * estimate_s, share_end - now
    else:
        need, left = estimate_s, s.budget_s - now
    if need <= left:
        return True
    notes.append(f"skipped {label} {mode.key}: needs about {need:.0f} s, {max(left, 0):.0f} s left of "
                 f"{'this job' if mode.optional else 'the run'}'s share of the {s.budget_s:.0f} s budget")
    return False


def race(kind: str, precision: str, lerobot_eager, directory: Path, engines: PolicyEngine | dict[str, PolicyEngine],
         observations: list[dict], noise: Callable[[int], torch.Tensor | None], reference: torch.Tensor,
         device: torch.device, s: RaceSettings, extra: dict[str, Any] | None = None,
         chunk: int | None = None) -> dict[str, Any]:
    """Build and warm the LeRobot modes of ``precision``, race them against our engine(s), check, summarize.

    ``engines``: ours, or ours by side name (the first the speed-ups are of); ``reference``: LeRobot eager
    fp32's checked steps, of which ``chunk`` (default: all) are the first chunk; ``extra``: keys every
    LeRobot observation gets (SmolVLA's task). Returns the JSON-ready result."""
    label = f"{kind} {precision}"
    notes: list[str] = []
    errors: dict[str, str] = {}
    warm: dict[str, dict] = {}
    sides: list[Side] = []
    ours_sides = [OurSide(e, n) for n, e in (engines if isinstance(engines, dict) else {"ours": engines}).items()]
    run = lambda side: episode(side, observations, s.steps, noise, s.seed)   # noqa: E731
    for mode in modes(kind, precision, s.lerobot_modes, s.compile_mode):
        if not _budget_allows(s, mode, s.compile_estimate_s, notes, label):
            continue
        side = None
        try:
            side = LeRobotSide(kind, mode, build_policy(kind, lerobot_eager, mode), directory, device, extra)
            compiled = mode.compile_mode is not None
            warm[side.name] = warm_up(lambda: run(side), compiled, max(s.warmup, 2 if compiled else 0),
                                      s.compile_warmup_max if compiled else s.warmup)
            if compiled:
                s.compile_estimate_s = warm[side.name]["warmup_s"]
            sides.append(side)
            print(f"[race] {label}: {side.name} warmed up {warm[side.name]['warmup_s']:.1f} s, "
                  f"{warm[side.name]['compiled_frames']} frames compiled", flush=True)
        except Exception as exc:                     # report, keep racing the others
            name = side.name if side is not None else f"LeRobot {mode.key}"
            errors[name] = f"{type(exc).__name__}: {str(exc)[:400]}"
            print(f"[race] {label}: {name} failed: {errors[name]}", flush=True)
    for ours in ours_sides:
        try:
            warm[ours.name] = warm_up(lambda: run(ours), False, s.warmup, s.warmup)
            sides.append(ours)
        except Exception as exc:                     # the run fails (``failures``), the LeRobot rows still count
            errors[ours.name] = f"{type(exc).__name__}: {str(exc)[:400]}"
            print(f"[race] {label}: {ours.name} failed: {errors[ours.name]}", flush=True)

    runs: dict[str, list[dict]] = {side.name: [] for side in sides}
    counters_before = compile_counters()
    for r in range(s.episodes):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order:
            if side.name in errors:
                continue
            try:
                runs[side.name].append(run(side))
            except Exception as exc:
                errors[side.name] = f"{type(exc).__name__}: {str(exc)[:400]}"
                print(f"[race] {label}: {side.name} failed: {errors[side.name]}", flush=True)
    live = [side for side in sides if side.name not in errors and runs[side.name]]
    have = min((sum(sum(e["replans"]) for e in runs[side.name]) for side in live), default=0)
    extra_replans: dict[str, list[float]] = {}
    try:
        extra_replans = replan_times(live, observations, noise, s.seed, max(0, s.replans - have)) if live else {}
    except Exception as exc:
        notes.append(f"replan loop failed, replans from the episodes only: {type(exc).__name__}: {str(exc)[:300]}")
    compiles_during_timing = counter_delta(counters_before, compile_counters())

    tol = tolerance(precision, s.tolerances)
    result: dict[str, Any] = {"policy": kind, "precision": precision, "tolerance_rel": tol, "sides": {},
                              "ours_sides": [o.name for o in ours_sides], "errors": errors, "notes": notes,
                              "compile_counters_during_timing": compiles_during_timing}
    for side in sides:
        eps = runs.get(side.name) or []
        if not eps:
            continue
        check = first_chunk_error(eps[0]["actions"], reference, chunk)
        check["passed"] = bool(max(check["max_rel"], check["episode_max_rel"]) <= tol)
        result["sides"][side.name] = {
            **summarize(eps, extra_replans.get(side.name, [])), **warm.get(side.name, {}),
            "mode": vars(side.mode) if hasattr(side, "mode") else {"key": side.name, "precision": precision},
            "first_chunk": check}
    _speedups(result)
    return result


def _speedups(result: dict[str, Any]) -> None:
    """Every other side's episodes over our first side's (bootstrap interval); the headline: the fastest LeRobot
    mode whose check passed, and the eager and fastest compiled ones beside it."""
    sides, first = result["sides"], result["ours_sides"][0]
    ours = sides.get(first)
    if ours is None:
        return
    ours_eps = ours["episodes_ms"]
    for name, side in sides.items():
        if name != first:
            side["speedup"] = bootstrap_ratio(side["episodes_ms"], ours_eps)
            side["replan_speedup"] = side["replan_p50_ms"] / ours["replan_p50_ms"]
    eligible = {n: v for n, v in sides.items() if n not in result["ours_sides"] and v["first_chunk"]["passed"]}
    pick = lambda pred: min((n for n in eligible if pred(eligible[n])),        # noqa: E731
                            key=lambda n: eligible[n]["episode_ms"], default=None)
    result["headline"] = {"fastest": pick(lambda v: True),
                          "eager": pick(lambda v: v["mode"]["compile_mode"] is None),
                          "compiled": pick(lambda v: v["mode"]["compile_mode"] is not None)}


def failures(results: dict[str, dict]) -> list[str]:
    """Why the run fails: any side it reports above the tolerance (a LeRobot mode whose actions are off is no
    baseline to be faster than), or one of ours that did not run."""
    out = []
    for name, r in results.items():
        for side, v in r["sides"].items():
            if side not in r.get("ours_sides", ["ours"]) and not v["first_chunk"]["passed"]:
                out.append(f"{name}: {side}: actions differ from LeRobot eager fp32 by "
                           f"{v['first_chunk']['max_rel']:.3e} (relative) > {r['tolerance_rel']:.0e}")
        for side in r.get("ours_sides", ["ours"]):
            ours = r["sides"].get(side)
            if ours is None:
                out.append(f"{name}: {side} did not run ({r['errors'].get(side, 'no episode')})")
            elif not ours["first_chunk"]["passed"]:
                c = ours["first_chunk"]
                over = (f", {c['episode_max_rel']:.3e} over its {c['episode_steps']} checked steps"
                        if c.get("episode_steps", c["steps"]) > c["steps"] else "")
                out.append(f"{name}: {side}: actions differ from LeRobot eager fp32 by {c['max_rel']:.3e} over the "
                           f"first chunk{over} (relative) > {r['tolerance_rel']:.0e}")
    return out
