"""``benchmarks.pi0 --smoke`` (issue 44) runs on a CPU: our engine and LeRobot's π0 (in its reference process)
over whole episodes at reduced sizes, the checked episode's actions compared in the run.

Why a test: the benchmark is run rarely (published sizes need a GPU and minutes), so a change elsewhere
can break it unnoticed; the smoke run keeps it working and checks that both sides agree (fp32, same noise).
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import pi0


def test_smoke_runs_both_sides_and_their_actions_agree(tmp_path: Path) -> None:
    out, md = tmp_path / "pi0.json", tmp_path / "pi0.md"
    pi0.main(["--smoke", "--json", str(out), "--out", str(md)])
    row = json.loads(out.read_text())["pi0|2|float32"]
    ours, lerobot = row["ours"], row["lerobot"]
    assert ours["replans"] > 0 and ours["pops"] > 0 and ours["episode_ms"] > 0
    assert ours["reinstruct_p50_ms"] > 0 and ours["capsule"]["state_bytes"] > 0
    assert lerobot["episode_ms"] > 0 and lerobot["err_vs_ours"] <= 1e-4
    assert "| pi0 | 2 | float32 | ours |" in md.read_text()
