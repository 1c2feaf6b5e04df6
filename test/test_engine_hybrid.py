"""KV-only restore: wrong on the hybrid model (recurrent state is load-bearing), right on pure attention."""
import pytest

from flashrt_ros.engine import LLMEngine
from flashrt_ros.models.registry import load_model

PROMPT = "Recurrent state is part of the execution state."
N = 16


def engine_for(source: str) -> LLMEngine:
    model, tok, _, fp = load_model(source, seed=0)
    return LLMEngine(model, tok, max_context=160, prefill_chunk=16, fingerprint_inputs=fp)


def continuation_after_restore(engine: LLMEngine, groups) -> tuple[list[int], list[int]]:
    """(true continuation, continuation after a detour and a restore of ``groups``)."""
    engine.generate(PROMPT, max_new_tokens=4, stop_ids=[])
    engine.capsules.snapshot("cut", overwrite=True)
    truth = engine.generate([], max_new_tokens=N, stop_ids=[]).token_ids
    engine.generate(" a detour that rewrites the live state", max_new_tokens=4, stop_ids=[])
    engine.capsules.restore("cut", groups=groups)
    return truth, engine.generate([], max_new_tokens=N, stop_ids=[]).token_ids


@pytest.fixture(scope="module")
def hybrid():
    return engine_for("random-hybrid-tiny")


def test_hybrid_model_declares_recurrent_and_conv_state(hybrid):
    groups = {s.group for s in hybrid.arena.specs}
    assert {"kv", "recurrent", "conv", "meta"} <= groups


def test_kv_only_restore_diverges_on_hybrid(hybrid):
    truth, kv_only = continuation_after_restore(hybrid, groups={"kv", "meta"})
    assert kv_only != truth


def test_full_restore_matches_on_hybrid(hybrid):
    hybrid.capsules.reset()
    truth, full = continuation_after_restore(hybrid, groups=None)
    assert full == truth


def test_kv_only_restore_matches_on_pure_attention_llama():
    engine = engine_for("random-llama-tiny")
    truth, kv_only = continuation_after_restore(engine, groups={"kv", "meta"})
    assert kv_only == truth
