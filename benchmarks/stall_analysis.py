"""Why a command came late: the node's control timeline set beside the commands a subscriber received.

``benchmarks.robot_rate --timeline`` runs the node with ``FLASHRT_CONTROL_TIMELINE``
(``flashrt_ros.robot_io.control_timeline``): per tick the times it was due, woke,
took and converted its inputs, stepped and published; every GC pause; every plan
beside the loop. All are ``CLOCK_MONOTONIC`` (one clock for every process on the
machine), so a gap the subscriber saw is matched to the tick that ended it.

Each gap over ``1.5`` control periods is attributed to the phase that took the
most time beyond its usual share: ``wake`` (the tick ran late: OS scheduling,
executor, GIL), ``inputs`` (take + conversion), ``step`` (the engine step: a replan),
``publish``, ``delivery`` (publish to receipt: DDS and the subscriber), or
``skipped`` (no tick published in between: a stale tick or an overrun), and
reported with the GC pauses and the plan that overlapped it. A separate probe
process (``os_probe``) measures how late a plain sleeping process wakes on the
same machine: the OS's share, without our interpreter.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

PROBE = """
import time, json, sys
period, seconds = float(sys.argv[1]), float(sys.argv[2])
late = []
end = time.monotonic() + seconds
nxt = time.monotonic() + period
while nxt < end:
    time.sleep(max(0.0, nxt - time.monotonic()))
    late.append(time.monotonic() - nxt)
    nxt += period
late.sort()
print(json.dumps({"n": len(late), "p50_ms": 1e3 * late[len(late) // 2], "p99_ms": 1e3 * late[int(0.99 * len(late))],
                  "max_ms": 1e3 * late[-1]}))
"""


def start_os_probe(period_s: float, seconds: float) -> subprocess.Popen:
    """A process that sleeps to a deadline every ``period_s`` and reports how late it woke."""
    return subprocess.Popen([sys.executable, "-c", PROBE, str(period_s), str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def probe_result(proc: subprocess.Popen) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=30)
        return json.loads(out)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: report, never fail the run
        proc.kill()
        return {"error": str(exc)}


def analyse(timeline_path: Path, commands: list[float], window: tuple[float, float], period_s: float) -> dict[str, Any]:
    """Gaps over 1.5 periods in ``window`` with their causes; per-phase percentiles; GC pauses."""
    tl = json.loads(timeline_path.read_text())
    ticks = np.array(tl["ticks"], dtype=float).reshape(-1, 6)
    start, end = window
    ticks = ticks[(ticks[:, 1] >= start - 1) & (ticks[:, 1] <= end + 1)]
    gcs = [g for g in tl["gc"] if start <= g[0] <= end]
    plans = np.array(tl.get("plans") or [], dtype=float).reshape(-1, 2)
    phases = {"wake": ticks[:, 1] - ticks[:, 0], "inputs": ticks[:, 3] - ticks[:, 1],
              "step": ticks[:, 4] - ticks[:, 3], "publish": ticks[:, 5] - ticks[:, 4]}
    done = ticks[~np.isnan(ticks[:, 5])]
    published = done[:, 5]
    cmds = np.array([t for t in commands if start <= t <= end])
    gaps = []
    for a, b in zip(cmds, cmds[1:]):
        if b - a <= 1.5 * period_s:
            continue
        gaps.append(_attribute(a, b, ticks, done, published, gcs, plans, period_s, start))
    causes: dict[str, int] = {}
    for g in gaps:
        causes[g["cause"]] = causes.get(g["cause"], 0) + 1
    gc_ms = [1e3 * (g[1] - g[0]) for g in gcs]
    return {
        "phase_ms": {p: _pcts(v) for p, v in phases.items()},
        "gaps_over_1_5_periods": len(gaps), "causes": causes,
        "worst_gaps": sorted(gaps, key=lambda g: -g["gap_ms"])[:8],
        "gc": {"count": len(gcs), "by_generation": {str(n): sum(1 for g in gcs if int(g[2]) == n) for n in (0, 1, 2)},
               "max_ms": max(gc_ms, default=0.0), "p99_ms": float(np.percentile(gc_ms, 99)) if gc_ms else 0.0,
               "threads": sorted({g[3] for g in gcs})},
        "plans": int(((plans[:, 0] >= start) & (plans[:, 0] <= end)).sum()) if len(plans) else 0,
    }


def _attribute(a: float, b: float, ticks: np.ndarray, done: np.ndarray, published: np.ndarray, gcs: list,
               plans: np.ndarray, period_s: float, start: float) -> dict[str, Any]:
    """The cause of one gap ``a -> b`` between two received commands.

    The commands are matched to the node's publications before them. If the node published them
    less than 1.5 periods apart, the gap arose after the publish (``delivery``: DDS, the
    subscriber's process). Otherwise: a tick in between that published nothing (``no step``:
    stale inputs, a pause) or, for the tick that ended the gap, the phase that took longest
    (``wake`` late, ``inputs``, ``step``, ``publish``); ``gc`` when GC pauses fill half the gap."""
    ia, ib = np.searchsorted(published, a, side="right") - 1, np.searchsorted(published, b, side="right") - 1
    parts: dict[str, float] = {}
    if ia < 0 or ib <= ia:
        cause = "unmatched"
    else:
        pa, pb = published[ia], published[ib]
        row = done[ib]
        parts = {"node_gap": pb - pa, "wake": row[1] - row[0], "inputs": row[3] - row[1], "step": row[4] - row[3],
                 "publish": row[5] - row[4], "delivery": b - pb}
        between = ticks[(ticks[:, 1] > pa) & (ticks[:, 1] < row[1])]
        if pb - pa <= 1.5 * period_s:
            cause = "delivery"
        elif np.isnan(between[:, 5]).any():
            cause = "no step"
        else:
            cause = max(("wake", "inputs", "step", "publish"), key=parts.get)
    overlapping_gc = [g for g in gcs if g[1] >= a - period_s and g[0] <= b]
    gc_ms = sum(1e3 * (g[1] - g[0]) for g in overlapping_gc)
    if gc_ms > 0.5 * (b - a - period_s) * 1e3:
        cause = "gc"
    plan = bool(len(plans)) and bool(np.any((plans[:, 1] >= a) & (plans[:, 0] <= b)))
    return {"at_s": round(a - start, 3), "gap_ms": round(1e3 * (b - a), 1), "cause": cause,
            "parts_ms": {p: round(1e3 * float(v), 1) for p, v in parts.items()}, "gc_ms": round(gc_ms, 1),
            "gc_generations": sorted({int(g[2]) for g in overlapping_gc}), "plan_running": plan}


def _pcts(values: np.ndarray) -> dict[str, float]:
    v = 1e3 * values[~np.isnan(values)]
    if not len(v):
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"p50": round(float(np.percentile(v, 50)), 2), "p99": round(float(np.percentile(v, 99)), 2),
            "max": round(float(v.max()), 2)}


def markdown(a: dict[str, Any], probe: dict[str, Any] | None) -> str:
    lines = ["| phase | p50 / p99 / max (ms) |", "| --- | --- |"]
    for name, p in a["phase_ms"].items():
        lines.append(f"| {name} | {p['p50']} / {p['p99']} / {p['max']} |")
    gc = a["gc"]
    lines.append(f"| GC pauses | {gc['count']} ({gc['by_generation']}), p99 {gc['p99_ms']:.1f} ms, "
                 f"max {gc['max_ms']:.1f} ms, threads {', '.join(gc['threads']) or '-'} |")
    if probe:
        lines.append(f"| OS probe (a sleeping process's wake-up lateness) | {probe.get('p50_ms', float('nan')):.2f} / "
                     f"{probe.get('p99_ms', float('nan')):.2f} / {probe.get('max_ms', float('nan')):.2f} |")
    lines.append(f"| gaps > 1.5 periods | {a['gaps_over_1_5_periods']}: {a['causes']} |")
    for g in a["worst_gaps"]:
        lines.append(f"| gap {g['gap_ms']} ms at {g['at_s']} s | {g['cause']} {g['parts_ms']}, GC {g['gc_ms']} ms "
                     f"{g['gc_generations']}, plan running: {g['plan_running']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Analyse a run again: ``python -m benchmarks.stall_analysis DIR`` (the run's directory, with
    timeline.json and commands.json)."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("directory", type=Path)
    args = p.parse_args(argv)
    run = json.loads((args.directory / "commands.json").read_text())
    result = analyse(args.directory / "timeline.json", run["commands"], tuple(run["window"]), run["period_s"])
    print(markdown(result, run.get("os_probe_ms")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
