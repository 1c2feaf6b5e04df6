"""``benchmarks.pi0 --smoke`` runs on a CPU: our engine (both numerics) and LeRobot's π0 (in its reference process)
over whole episodes at reduced sizes, every side's checked episode compared with LeRobot eager float32 in the run.

Why a test: the benchmark is run rarely (published sizes need a GPU and minutes), so a change elsewhere
can break it unnoticed; the smoke run keeps it working, and its checks must pass (fp32, same noise) and fail
when a side's actions are wrong.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import pi0


def test_smoke_runs_every_side_and_checks_their_actions(tmp_path: Path) -> None:
    out, md = tmp_path / "pi0.json", tmp_path / "pi0.md"
    assert pi0.main(["--smoke", "--json", str(out), "--out", str(md)]) == 0
    row = json.loads(out.read_text())["pi0|2|float32"]
    for side in ("ours-fast", "ours-exact"):
        ours = row[side]
        assert ours["replans"] > 0 and ours["pops"] > 0 and ours["episode_ms"] > 0
        assert ours["reinstruct_p50_ms"] > 0 and ours["capsule"]["state_bytes"] > 0
    # exact: LeRobot's arithmetic (test_lerobot_pi0's bound: two processes may split CPU matmuls differently)
    assert row["ours-exact"]["check"]["episode"] <= 1e-5
    assert row["ours-fast"]["check"]["episode"] <= 1e-4
    assert row["lerobot"]["episode_ms"] > 0 and row["lerobot"]["check"]["episode"] <= 1e-5
    assert "| pi0 | 2 | float32 | ours-fast |" in md.read_text()


def test_a_side_beyond_its_tolerance_fails_the_check() -> None:
    ref = torch.ones(4, 2)
    row = {"reference": {"actions": ref}, "ours-fast": {"actions": ref * 1.01}, "lerobot": {"actions": ref.clone()}}
    failures = pi0.check_row(row, "float32", chunk=2)
    assert len(failures) == 1 and failures[0].startswith("ours-fast float32")
    assert pi0.check_row({"reference": {"error": "boom"}}, "float32", 2)[0].startswith("float32: no float32 reference")
