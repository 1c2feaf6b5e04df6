"""Plots of ``benchmarks.realtime`` results: what a control step costs per replanning mode, and what a
planning delay does to the trained arm.

    python -m benchmarks.realtime_plot docs/benchmarks/realtime_h100_*.json docs/benchmarks/realtime_arm_cpu.json \\
        --png docs/benchmarks/realtime.png

Why apart: the benchmark writes one JSON per run (a policy, a device); the plot reads any number of them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

MODES = ("sync", "async", "blend", "rtc")
COLOURS = {"sync": "tab:red", "async": "tab:blue", "blend": "tab:green", "rtc": "tab:purple"}


def load(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The loop rows and the arm rows of every JSON."""
    loop, arm = [], []
    for path in paths:
        result = json.loads(path.read_text())
        (loop if result["part"] == "loop" else arm).extend(result["rows"])
    return loop, arm


def loop_panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Step p99 per policy / precision / rate, one bar per mode, against the 1 ms goal and the period."""
    groups = list(dict.fromkeys(f"{r['policy']} {r['dtype'].replace('bfloat16', 'bf16').replace('float32', 'fp32')}"
                                f"\n{r['rate_hz']:g} Hz" for r in rows))
    width = 0.8 / len(MODES)
    for j, mode in enumerate(MODES):
        xs, ys = [], []
        for i, group in enumerate(groups):
            for r in rows:
                label = (f"{r['policy']} {r['dtype'].replace('bfloat16', 'bf16').replace('float32', 'fp32')}"
                         f"\n{r['rate_hz']:g} Hz")
                if label == group and r["mode"] == mode:
                    xs.append(i + (j - (len(MODES) - 1) / 2) * width)
                    ys.append(r["step_p99_ms"])
        if xs:
            ax.bar(xs, ys, width, label=mode, color=COLOURS[mode])
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="goal: p99 1 ms")
    ax.axhline(20.0, color="grey", linestyle=":", linewidth=0.8, label="50 Hz period")
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.set_ylabel("control step p99 (ms)")
    ax.set_title("control step p99 per replanning mode", fontsize=9)
    ax.legend(fontsize=7)


def arm_panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Reached (solid) and on target at the end (dashed) against the simulated delay, per policy and mode."""
    for (policy, mode) in dict.fromkeys((r["policy"], r["mode"]) for r in rows):
        mine = sorted((r for r in rows if r["policy"] == policy and r["mode"] == mode), key=lambda r: r["delay_steps"])
        delays = [r["delay_steps"] for r in mine]
        marker = "o" if policy == "act" else "s"
        ax.plot(delays, [100 * r["reached"] for r in mine], marker=marker, color=COLOURS[mode],
                label=f"{policy} {mode}")
        ax.plot(delays, [100 * r["on_target_at_end"] for r in mine], marker=marker, color=COLOURS[mode],
                linestyle="--", alpha=0.5)
    ax.set_xlabel("simulated inference delay (control steps)")
    ax.set_ylabel("% of episodes (solid: reached, dashed: on target at the end)")
    ax.set_title("trained arm policies with a planning delay", fontsize=9)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)


def plot(paths: Sequence[Path], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    loop, arm = load(paths)
    panels = [p for p, rows in ((loop_panel, loop), (arm_panel, arm)) if rows]
    if not panels:
        raise SystemExit("no loop or arm rows in the given JSON files")
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        panel(ax, loop if panel is loop_panel else arm)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path, nargs="+", help="benchmarks.realtime JSON files (loop and / or arm)")
    ap.add_argument("--png", type=Path, required=True)
    args = ap.parse_args(argv)
    plot(args.json, args.png)
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
