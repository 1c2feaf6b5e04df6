"""CPU smoke tests of the benchmark commands: ``python -m benchmarks.llm --quick`` runs end to end, checks itself and
degrades gracefully; ``sessions`` runs; the GPU-only ones refuse clearly without CUDA."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks import llm as bench

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
    prov = result["provenance"]
    assert prov["git"]["commit"] and prov["packages"]["torch"] == torch.__version__ and prov["cpu"]
    assert "cudnn.benchmark" in prov["flags"]
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
    markdown = (tmp_path / "llm.md").read_text()
    assert "n/a" in markdown
    # nothing measured, nothing drawn: a note says why instead of an empty plot
    assert not (tmp_path / "llm_ttft.png").exists() and "llm_ttft.png" not in markdown
    assert any(n.startswith("plot skipped: no row has a measured") for n in result["notes"])


def test_zero_chunk_or_repetitions_are_refused_before_anything_runs(tmp_path: Path) -> None:
    import pytest

    for bad in (["--prefill-chunk", "0"], ["--reps", "0"], ["--capsule-reps", "0"], ["--turn-tokens", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(TINY + ["--out", str(tmp_path)] + bad)
        assert exit_info.value.code == 2, bad
    assert not (tmp_path / "llm.md").exists()


def test_sessions_benchmark_runs_on_cpu_with_the_shared_percentile(monkeypatch, capsys) -> None:
    from benchmarks import sessions

    monkeypatch.setattr(sys, "argv", ["sessions", "--cpu", "--positions", "8", "--reps", "3", "--max-context", "64"])
    assert sessions.main() == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1
    p50, p99 = (float(x) for x in rows[0].split("|")[3:5])
    assert 0 < p50 <= p99


def test_gpu_micro_benchmarks_refuse_without_cuda_and_still_show_help(monkeypatch, capsys) -> None:
    import pytest
    import torch

    from benchmarks import kernel_attention, kernel_decode_overhead, kernel_gemv, kernel_segment_copies

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for module in (kernel_attention, kernel_decode_overhead, kernel_gemv, kernel_segment_copies):
        monkeypatch.setattr(sys, "argv", [module.__name__])
        with pytest.raises(SystemExit) as exit_info:
            module.main()
        assert exit_info.value.code == 2, module.__name__
        assert "needs a CUDA GPU" in capsys.readouterr().err
        monkeypatch.setattr(sys, "argv", [module.__name__, "--help"])
        with pytest.raises(SystemExit) as exit_info:
            module.main()
        assert exit_info.value.code == 0
        assert module.__doc__.splitlines()[0] in capsys.readouterr().out
