"""CPU smoke test of ``python -m benchmarks.speculative --quick``: it runs end to end, the oracle rows reach
the acceptance they were set to, every speculative run emits the plain run's tokens, the tables are written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import speculative as bench


@pytest.mark.parametrize("rate_kind", ["drafted", "position"])
def test_quick_run_controls_acceptance_and_matches_plain_decoding(tmp_path: Path, rate_kind: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert bench.main(["--quick", "--device", "cpu", "--contexts", "24", "--new-tokens", "32", "--tokens", "3",
                           "--bandwidth-mib", "4", "--rate-kind", rate_kind, "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads((tmp_path / "speculative_cpu.json").read_text())
    rows = result["rows"]
    assert [(r["mode"], r["rate"]) for r in rows] == [("plain", None), ("oracle", 1.0), ("oracle", 0.7),
                                                       ("oracle", 0.4), ("mtp", None)]
    for row in rows[1:]:
        assert row["tokens_match_plain"] is True and row["tokens_per_s"] > 0
    for row in rows[1:4]:
        assert row["acceptance"] == pytest.approx(row["expected_acceptance"])
        if rate_kind == "drafted":
            assert abs(row["acceptance"] - row["rate"]) < 0.1     # 32 tokens: the last, cut step counts
    assert rows[1]["acceptance"] == 1.0 and rows[1]["tokens_per_step"] == pytest.approx(4.0, abs=0.2)
    assert rows[0]["floor_ms"] > 0 and rows[0]["step_over_floor"] > 0 and rows[3]["rollback_ms"] > 0
    assert result["provenance"]["git"]["commit"]
    text = (tmp_path / "speculative_cpu.md").read_text()
    assert "| 24 | oracle | 3 | 70% |" in text and "## Decode step vs the weight-read floor" in text


def test_identity_check_on_the_trained_model_passes_and_catches_a_broken_rollback(tmp_path: Path) -> None:
    """``benchmarks.speculative_identity`` (the device run of issue #57's token identity), small on CPU: every row
    identical or a counted near-tie, and the same run's broken rollback changes prompts (else it exits 1)."""
    from benchmarks import speculative_identity as identity
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert identity.main(["--device", "cpu", "--max-k", "2", "--prompts", "3", "--new-tokens", "32",
                              "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads((tmp_path / "speculative_identity_cpu.json").read_text())
    (part,) = result["dtypes"]
    verdicts = [r["verdict"] for r in part["rows"] if "verdict" in r]
    assert len(verdicts) == 6 and set(verdicts) <= {"identical", "near-tie"}
    assert part["broken_rollback_prompts_changed"] >= 2 and result["verdict"] == "pass"
    assert all(r["acceptance"] > 0.2 for r in part["rows"] if "acceptance" in r)
