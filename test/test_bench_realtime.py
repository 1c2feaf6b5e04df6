"""``benchmarks.realtime`` (issue 40) runs end to end on a CPU at smoke size and its plot reads what it wrote.

The numbers of a smoke run mean nothing; what is checked is that every mode ran the loop, the step kinds
add up to the steps, a plan was merged beside the loop, and the rows carry what the report and the plot
read. Held or late steps are not asserted away: a loaded CI machine may hold one, which is what the
benchmark is there to count. The benchmark checks the same itself, and exits 1 when a check fails.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import realtime, realtime_plot

SMOKE = ["loop", "--policy", "act", "--size", "smoke", "--rates", "20", "--seconds", "1.5", "--warmup", "0.5"]


def test_loop_smoke_writes_rows_markdown_and_a_plot(tmp_path: Path) -> None:
    out, md, png = tmp_path / "loop.json", tmp_path / "loop.md", tmp_path / "loop.png"
    threads = torch.get_num_threads()
    assert realtime.main([*SMOKE, "--modes", "sync", "async", "--json", str(out), "--md", str(md)]) == 0
    assert torch.get_num_threads() == threads, "the run left its thread count on the process"
    result = json.loads(out.read_text())
    assert result["failures"] == []
    assert [r["mode"] for r in result["rows"]] == ["sync", "async"]
    for row in result["rows"]:
        assert row["steps"] > 0 and row["step_p99_ms"] >= row["step_p50_ms"] > 0
        assert sum(k["n"] for k in row["step_ms_by_kind"].values()) == row["steps"]
    assert "sync plan" in result["rows"][0]["step_ms_by_kind"]
    assert result["rows"][1]["merged"] > 0 and "launch" in "".join(result["rows"][1]["step_ms_by_kind"])
    assert result["provenance"]["git"]["commit"]
    text = md.read_text()
    assert "| act | float32 | 20 | async |" in text and "Step time by what the step did" in text
    assert realtime_plot.main([str(out), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_whose_own_check_fails_exits_1_and_says_which(tmp_path: Path, monkeypatch, capsys) -> None:
    """A run beside the loop that merged no plan (here: the row says so) fails the run, as a broken
    replanner would: the exit status is 1 and the output and the JSON name the check."""
    real = realtime.run_loop
    monkeypatch.setattr(realtime, "run_loop", lambda *a, **k: {**real(*a, **k), "merged": 0})
    out = tmp_path / "loop.json"
    assert realtime.main([*SMOKE, "--modes", "async", "--json", str(out)]) == 1
    failed = json.loads(out.read_text())["failures"]
    assert failed == ["act float32 20 Hz async: no plan was merged beside the loop"]
    assert "CHECK FAILED: act float32 20 Hz async: no plan was merged beside the loop" in capsys.readouterr().out
