"""The bookkeeping of a checked VLA race split over several invocations (``benchmarks.pi0``, ``benchmarks.groot``):
which sides run, the rows an earlier invocation wrote, the files rewritten after every side, the end report.

Why one place: a split run must check the sides an earlier invocation wrote as well as its own, and a run cut short
must keep what finished; two copies of that logic would drift apart.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

nan = float("nan")


def choose_sides(spec: str | None, every: tuple[str, ...], smoke: bool) -> list[str]:
    """The sides ``--sides`` names (default: all; ``--smoke``: all but ``compiled``); an unknown one exits."""
    sides = [s for s in (spec or ",".join(x for x in every if not (smoke and x == "compiled"))).split(",") if s]
    unknown = set(sides) - set(every)
    if unknown:
        sys.exit(f"unknown sides {sorted(unknown)}: use {every}")
    return sides


def load_rows(path: Path | None) -> dict:
    """The rows ``path`` already holds (its provenance dropped), checked actions back as tensors: a split run
    checks the sides an earlier invocation wrote too."""
    rows: dict = json.loads(path.read_text()) if path and path.is_file() else {}
    rows.pop("provenance", None)
    for r in rows.values():
        for side in r.values():
            if isinstance(side.get("actions"), list):
                side["actions"] = torch.tensor(side["actions"])
    return rows


def write_rows(rows: dict, text: str, out: Path | None, json_path: Path | None, device: torch.device) -> None:
    """The markdown ``text`` to ``out`` and every row, with the provenance, to ``json_path`` (a run cut short keeps
    the sides that finished)."""
    if out:
        out.write_text(text)
    if json_path:
        from benchmarks.provenance import provenance
        plain = {k: {side: {m: (v.tolist() if isinstance(v, torch.Tensor) else v) for m, v in s.items()}
                     for side, s in r.items()} for k, r in rows.items()}
        json_path.write_text(json.dumps({**plain, "provenance": provenance(device)}, indent=1, default=str))


def print_row(key: str, row: dict) -> None:
    """One row's figures on stdout, without the actions and tracebacks."""
    print(json.dumps({key: {k: {m: v for m, v in s.items() if m not in ("actions", "error")}
                            for k, s in row.items()}}, default=str), flush=True)


def engine_cells(o: dict) -> str:
    """The markdown cells of our engine's extra figures: redraw, cold replan, re-instruction, capsule times,
    memory, load and capture."""
    m = o.get("memory", {})
    return (f"{o['redraw_p50_ms']:.2f} | {o['cold_replan_p50_ms']:.2f} | {o['reinstruct_p50_ms']:.2f} | "
            f"{o['capsule']['snapshot_ms']:.3f} / {o['capsule']['restore_ms']:.3f} | "
            f"{m.get('weights_gib', nan):.2f} / {m.get('engine_gib', nan):.2f} / {m.get('peak_gib', nan):.2f} | "
            f"{o.get('load_s', nan):.0f} / {o.get('capture_s', nan):.1f}")


def report(text: str, failures: list[str], tag: str) -> int:
    """The end of a run: the table, the load average, every failed check; the exit status (1: a check failed)."""
    print(text)
    print(f"load average at the end: {os.getloadavg() if hasattr(os, 'getloadavg') else None}")
    for f in failures:
        print(f"[{tag}] CHECK FAILED: {f}", flush=True)
    return 1 if failures else 0
