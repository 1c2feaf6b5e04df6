"""One markdown table from several ``benchmarks.robot_rate --json`` runs (a row per run).

    python -m benchmarks.robot_rate_report NAME=run.json ... > table.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = ("| run | replan | load (1 min) before / after | rate | command gap p50 / p99 / max (receipt) | "
          "gaps > 2 periods | node publish gap max | stale flips (status / log) | sensor gaps > age limit | "
          "control overruns | gaps > 1.5 periods by cause |")


def row(name: str, r: dict[str, Any]) -> str:
    g, pub = r["command_gap_ms"], r.get("command_gap_publish_ms", [float("nan")] * 3)
    counts = r.get("replan_counts", {})
    replan = counts.get("mode", r["replan"])
    if counts.get("chosen"):
        replan += f" ({counts['chosen'].split('(')[0].strip()})"
    stalls = r.get("stalls") or {}
    causes = ", ".join(f"{k} {v}" for k, v in sorted(stalls.get("causes", {}).items(), key=lambda kv: -kv[1])) or "-"
    return (f"| {name} | {replan} | {r['load_avg_before'][0]:.1f} / {r['load_avg_after'][0]:.1f} | "
            f"{100 * r['ratio']:.1f} % | {g[0]:.1f} / {g[1]:.1f} / {g[2]:.1f} ms | {r.get('gaps_over_2_periods', '-')} | "
            f"{pub[2]:.1f} ms | {r['stale_flips_window']} / {r.get('stale_log_lines_window', '-')} | "
            f"{r['late_sensor_gaps']} | {r.get('control', {}).get('control_overruns', '-')} | {causes} |")


def main(argv: list[str] | None = None) -> int:
    runs = [a.split("=", 1) for a in (argv if argv is not None else sys.argv[1:])]
    print(HEADER)
    print("|" + " --- |" * HEADER.count(" |"))
    for name, path in runs:
        print(row(name, json.loads(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
