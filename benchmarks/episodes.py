"""Whole episodes of our engine, timed step by step, and their summary (π0 / π0.5 benchmark).

Why apart from ``benchmarks.race``: the race times LeRobot and ours in one process through its
``Side`` objects; the π benchmark runs each LeRobot side in a reference process of its own and
summarizes its raw episodes with the same function as ours, so both sides are counted alike.
"""
from __future__ import annotations

import time

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.stats import percentile

PERIOD_MS = 20.0   # a 50 Hz control period: the share of steps longer than it is reported


def our_episode(engine: PolicyEngine, observations: list[dict], steps: int) -> dict:
    """One episode from a reset: per-step ms (up to the action on the host) and whether each step replanned."""
    times, replans = [], []
    t_start = time.perf_counter()
    engine.capsules.reset()
    for i in range(steps):
        replan = engine.next_step_replans()          # host mirror: no device read
        replans.append(True if replan is None else replan)
        t0 = time.perf_counter()
        engine.step(observations[i % len(observations)])
        times.append((time.perf_counter() - t0) * 1e3)
    return {"episode_ms": (time.perf_counter() - t_start) * 1e3, "times": times, "replans": replans}


def summarize(episodes: list[dict]) -> dict:
    """Median episode time, replan / pop percentiles and the share of steps over the 20 ms period."""
    times = [t for e in episodes for t in e["times"]]
    replan = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if r]
    pop = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if not r]

    def pct(xs: list[float], q: float) -> float:
        return percentile(xs, q) if xs else float("nan")
    return {"episode_ms": percentile([e["episode_ms"] for e in episodes], 50),
            "episodes": [round(e["episode_ms"], 3) for e in episodes],
            "replan_p50_ms": pct(replan, 50), "replan_p99_ms": pct(replan, 99), "replans": len(replan),
            "pop_p50_ms": pct(pop, 50), "pop_p99_ms": pct(pop, 99), "pops": len(pop),
            "over_period": sum(t > PERIOD_MS for t in times) / max(len(times), 1)}
