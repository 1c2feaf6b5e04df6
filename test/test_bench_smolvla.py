"""``benchmarks.smolvla --smoke`` runs on a CPU: our engine in both numerics and LeRobot's SmolVLA over whole
episodes at CI sizes, every side's first timed episode checked against LeRobot eager float32 in the run.

Why a test: the benchmark is run rarely (the published size needs a GPU), so a change elsewhere can break it
unnoticed; the smoke run keeps it working and its checks must pass (fp32, same noise); that a side of ours beyond
the tolerance fails the run is ``test_bench_race.py``'s. LeRobot's compiled modes are left out here (their compile
takes minutes on a CPU; the GPU run has them). Behaviour only: no timing is asserted.
"""
from __future__ import annotations

import json
from pathlib import Path


def _run(tmp_path: Path, *extra: str) -> tuple[int, dict, str]:
    from lerobot_reference import lerobot
    lerobot()                                     # skips without the LeRobot reference
    from benchmarks import smolvla
    out, js = tmp_path / "smolvla.md", tmp_path / "smolvla.json"
    code = smolvla.main(["--smoke", "--lerobot-modes", "eager,autocast", "--out", str(out), "--json", str(js),
                         *extra])
    return code, json.loads(js.read_text()), out.read_text()


def test_smoke_races_both_numerics_and_checks_every_side_over_the_episode(tmp_path: Path) -> None:
    code, result, text = _run(tmp_path, "--dtypes", "float32")
    assert code == 0, result["failures"]
    r = result["results"]["smolvla fp32"]
    assert r["ours_sides"] == ["ours-fast", "ours-exact"]
    assert set(r["sides"]) == {"ours-fast", "ours-exact", "LeRobot eager"}
    for side in ("ours-fast", "ours-exact"):
        check = r["sides"][side]["first_chunk"]
        assert check["passed"] and check["episode_steps"] == result["settings"]["steps"]
        assert max(check["max_rel"], check["episode_max_rel"]) <= r["tolerance_rel"] == 1e-3     # CPU: no TF32
        assert r["sides"][side]["redraw_p50_ms"] > 0 and r["sides"][side]["replans"] > 0
    assert r["sides"]["ours-exact"]["first_chunk"]["episode_max_rel"] <= 1e-5
    assert r["sides"]["ours-fast"]["first_chunk"]["episode_max_rel"] <= 1e-5
    assert r["headline"]["fastest"] == "LeRobot eager" and "speedup" in r["sides"]["ours-exact"]
    assert "| smolvla fp32 | ours-fast |" in text and "| smolvla fp32 | ours-exact |" in text

