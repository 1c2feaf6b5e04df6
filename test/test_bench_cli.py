"""CPU smoke tests of ``flashrt-bench --quick``: it runs end to end, checks itself, degrades gracefully."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from flashrt_ros.benchmarks import llm as bench

TINY = ["--quick", "--device", "cpu", "--contexts", "32", "--reps", "1", "--capsule-reps", "3",
        "--bandwidth-mib", "4"]


def _result(out: Path) -> dict:
    return json.loads((out / "llm.json").read_text())


def test_quick_run_writes_tables_and_restore_matches_uninterrupted_run(tmp_path: Path) -> None:
    assert bench.main(TINY + ["--out", str(tmp_path)]) == 0
    result = _result(tmp_path)
    rows = {r["model"]: r for r in result["rows"]}
    assert set(rows) == {"hybrid-tiny", "llama-tiny"}
    for row in rows.values():
        assert row["continuation_match"] is True and row["first_token_match"] is True
        assert row["hf_continuation_match"] is True
        assert row["hf_first_token"] == row["first_token"]       # same weights, float32: same greedy token
        # 32 + 8 ids are cut [16, 16, 8] cold and [16, 16] + [8] from the capsule: the same chunks,
        # so the follow-up turn is bit-identical; the 24-id prefix is cut differently (checked, not required)
        assert row["turn_tokens"] == 8 and row["followup_aligned"] is True
        assert row["followup_token_match"] is True and row["followup_logits_max_diff"] == 0.0
        assert row["unaligned_prefix"] == 24 and isinstance(row["unaligned_token_match"], bool)
        assert row["hf_followup_token_match"] is True and row["hf_clone_token_match"] is True
        for key in ("cold_turn_ttft_ms", "followup_ttft_ms", "cold_ttft_ms", "reentry_ttft_ms", "decode_ms",
                    "snapshot_ms", "restore_ms", "copy_floor_ms", "hf_cold_turn_ttft_ms",
                    "hf_followup_deepcopy_ms", "hf_followup_clone_ms", "hf_cold_ttft_ms", "hf_snapshot_ms",
                    "hf_reentry_ttft_ms", "decode_floor_ms"):
            assert row[key] > 0, key
        assert row["capsule_bytes"] > 0
    text = (tmp_path / "llm.md").read_text()
    for heading in ("## Machine", "## Follow-up turn", "### Token identity", "## Re-entry",
                    "## Decode at batch 1", "## Capsules"):
        assert heading in text
    assert text.index("## Follow-up turn") < text.index("## Re-entry")          # the headline leads
    assert "| hybrid-tiny | 32 | 8 |" in text and "torch: " in text


def test_hf_columns_are_na_with_reason_when_transformers_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)        # makes ``import transformers`` fail
    assert bench.main(TINY + ["--models", "hybrid", "--out", str(tmp_path)]) == 0
    result = _result(tmp_path)
    (row,) = result["rows"]
    assert row["continuation_match"] is True and "hf_cold_ttft_ms" not in row
    assert "Qwen3NextForCausalLM unavailable" in result["models"][0]["hf"]
    assert "| n/a |" in (tmp_path / "llm.md").read_text()


def test_time_budget_skips_measurements_with_a_note(tmp_path: Path) -> None:
    assert bench.main(TINY + ["--models", "smollm2", "--time-budget-s", "0", "--out", str(tmp_path)]) == 0
    result = _result(tmp_path)
    assert "cold_ttft_ms" not in result["rows"][0]
    assert any(n.startswith("skipped ours llama-tiny @ 32") for n in result["notes"])
    assert "n/a" in (tmp_path / "llm.md").read_text()


def test_zero_chunk_or_repetitions_are_refused_before_anything_runs(tmp_path: Path) -> None:
    import pytest

    for bad in (["--prefill-chunk", "0"], ["--reps", "0"], ["--capsule-reps", "0"], ["--turn-tokens", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(TINY + ["--out", str(tmp_path)] + bad)
        assert exit_info.value.code == 2, bad
    assert not (tmp_path / "llm.md").exists()
