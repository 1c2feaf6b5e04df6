"""Capsules of the LLM engine: restore is byte-exact and continuation is token-identical.

Model: ``random-llama-tiny`` (2 layers, byte tokenizer). Besides tokens, the
tests compare the raw bytes of every live buffer, which is a far stronger check
than tokens of a small random model.
"""
import pytest
import torch

from flashrt_ros.engine import LLMEngine, SamplingParams, StoreConfig
from flashrt_ros.engine.state import HAS_PENDING, TOKENS
from flashrt_ros.models.registry import load_model
from flashrt_ros.runtime.arena import BOUNDARY, POSITION
from flashrt_ros.runtime.errors import ContextOverflow

PROMPT = "The capsule holds every byte of live state."


@pytest.fixture(scope="module")
def tiny():
    return load_model("random-llama-tiny", seed=0)


def make_engine(tiny, **kw) -> LLMEngine:
    model, tok, _, fp = tiny
    kw.setdefault("max_context", 192)
    kw.setdefault("prefill_chunk", 16)
    return LLMEngine(model, tok, fingerprint_inputs=fp, **kw)


def live_bytes(engine: LLMEngine) -> dict[str, bytes]:
    return {n: engine.arena.live_view(n).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            for n in engine.arena}


def test_restore_is_byte_exact(tiny):
    engine = make_engine(tiny)
    engine.generate(PROMPT, max_new_tokens=6, stop_ids=[])
    engine.capsules.snapshot("here")
    before = live_bytes(engine)
    engine.generate(" and then something else entirely", max_new_tokens=9, stop_ids=[])
    assert live_bytes(engine) != before
    engine.capsules.restore("here")
    assert live_bytes(engine) == before
    assert engine.capsules.verify("here", against_live=True).ok


def test_greedy_continuation_after_restore_matches_uninterrupted(tiny):
    straight = make_engine(tiny)
    full = straight.generate(PROMPT, max_new_tokens=20, stop_ids=[]).token_ids
    expected_state = live_bytes(straight)

    engine = make_engine(tiny)
    head = engine.generate(PROMPT, max_new_tokens=8, stop_ids=[]).token_ids
    engine.capsules.snapshot("mid")
    engine.generate(" derail the transcript", max_new_tokens=5, stop_ids=[])
    engine.capsules.restore("mid")
    tail = engine.generate([], max_new_tokens=12, stop_ids=[]).token_ids
    assert head + tail == full
    assert live_bytes(engine) == expected_state


def test_seeded_sampling_continuation_after_restore_is_identical(tiny):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    straight = make_engine(tiny)
    full = straight.generate(PROMPT, max_new_tokens=24, sampling=params, stop_ids=[]).token_ids
    assert len(set(full)) > 8, "sampling should produce varied tokens"

    engine = make_engine(tiny)
    head = engine.generate(PROMPT, max_new_tokens=10, sampling=params, stop_ids=[]).token_ids
    engine.capsules.snapshot("mid")
    # Draws with another seed and settings move the random stream and the sampling buffers.
    engine.generate([], max_new_tokens=6, sampling=SamplingParams(temperature=1.5, seed=99), stop_ids=[])
    engine.capsules.restore("mid")
    tail = engine.generate([], max_new_tokens=14, stop_ids=[]).token_ids   # sampling=None: the capsule's
    assert head + tail == full


def test_forked_branches_each_reproduce_their_continuation(tiny):
    engine = make_engine(tiny)
    engine.generate(PROMPT, max_new_tokens=4, stop_ids=[])
    engine.capsules.snapshot("root")
    engine.capsules.fork("root", "other")
    branch_a = engine.generate(" red", max_new_tokens=10, stop_ids=[],
                               sampling=SamplingParams(temperature=1.0, seed=1)).token_ids
    engine.capsules.snapshot("a_end")
    engine.capsules.restore("other")
    branch_b = engine.generate(" blue", max_new_tokens=10, stop_ids=[],
                               sampling=SamplingParams(temperature=1.0, seed=2)).token_ids
    assert branch_a != branch_b
    engine.capsules.restore("root")
    assert engine.generate(" red", max_new_tokens=10, stop_ids=[],
                           sampling=SamplingParams(temperature=1.0, seed=1)).token_ids == branch_a
    assert engine.capsules.verify("a_end", against_live=True).ok
    engine.capsules.restore("other")
    assert engine.generate(" blue", max_new_tokens=10, stop_ids=[],
                           sampling=SamplingParams(temperature=1.0, seed=2)).token_ids == branch_b


def test_rollback_of_n_boundaries_is_byte_exact_vs_a_snapshot_taken_then(tiny):
    engine = make_engine(tiny, store_config=StoreConfig(rollback_depth=8))
    engine.generate(PROMPT, max_new_tokens=5, stop_ids=[])
    engine.capsules.snapshot("then")
    then = live_bytes(engine)
    boundary = int(engine.arena[BOUNDARY])
    engine.generate([], max_new_tokens=6, stop_ids=[])          # six decode steps = six boundaries
    assert int(engine.arena[BOUNDARY]) == boundary + 6
    position = engine.capsules.rollback(6)
    assert position == int(engine.arena[POSITION])
    assert live_bytes(engine) == then
    assert engine.capsules.verify("then", against_live=True).ok
    with pytest.raises(Exception):
        engine.capsules.rollback(50)                                      # deeper than the ring


def test_interrupted_generation_stops_at_a_restorable_boundary(tiny):
    straight = make_engine(tiny)
    full = straight.generate(PROMPT, max_new_tokens=16, stop_ids=[]).token_ids

    engine = make_engine(tiny)
    seen: list[int] = []
    result = engine.generate(PROMPT, max_new_tokens=16, stop_ids=[], on_token=lambda t, s, _n: seen.append(t),
                             should_stop=lambda: len(seen) >= 5)
    assert result.stop_reason == "cancelled" and result.token_ids == seen == full[:5]
    assert engine.transcript()[-5:] == seen                      # committed state == what was reported
    engine.capsules.snapshot("stopped")
    engine.generate(" noise", max_new_tokens=3, stop_ids=[])
    engine.capsules.restore("stopped")
    assert engine.generate([], max_new_tokens=11, stop_ids=[]).token_ids == full[5:]


def test_cancel_during_prefill_leaves_a_committed_prefix(tiny):
    engine = make_engine(tiny, prefill_chunk=8)
    calls = []
    result = engine.generate("x" * 40, max_new_tokens=4, should_stop=lambda: calls.append(1) or len(calls) > 2)
    assert result.stop_reason == "cancelled" and result.token_ids == []
    assert int(engine.arena[POSITION]) == 16                      # two chunks of 8 committed
    engine.capsules.snapshot("partial")
    assert engine.capsules.get("partial").position == 16


def test_a_failing_step_is_undone(tiny):
    engine = make_engine(tiny)
    engine.generate(PROMPT, max_new_tokens=3, stop_ids=[])
    before = live_bytes(engine)

    def boom(token, piece, _n):
        raise RuntimeError("client went away")

    with pytest.raises(RuntimeError):
        engine.generate([], max_new_tokens=3, stop_ids=[], on_token=boom)
    assert live_bytes(engine) == before


def test_context_overflow_and_context_full(tiny):
    engine = make_engine(tiny, max_context=24)
    with pytest.raises(ContextOverflow):
        engine.generate("y" * 30, max_new_tokens=1)
    assert int(engine.arena[POSITION]) == 0                       # nothing was fed
    result = engine.generate("z" * 20, max_new_tokens=50, stop_ids=[])
    assert result.stop_reason == "context_full"
    assert int(engine.arena[POSITION]) == 24 and int(engine.arena[HAS_PENDING]) == 1
    assert len(result.token_ids) == 5                             # 4 consumed after the prompt + 1 pending


def test_restored_capsule_knows_its_transcript(tiny):
    engine = make_engine(tiny)
    result = engine.generate(PROMPT, max_new_tokens=7, stop_ids=[])
    engine.capsules.snapshot("t")
    text_ids = engine.transcript()
    engine.capsules.reset()
    assert engine.transcript() == []
    engine.capsules.restore("t")
    assert engine.transcript() == text_ids
    tok = tiny[1]
    assert tok.decode(text_ids) == PROMPT + tok.decode(result.token_ids)
    assert engine.arena[TOKENS][: len(text_ids) - 1].tolist() == text_ids[:-1]


def test_save_load_round_trip_through_disk(tiny, tmp_path):
    engine = make_engine(tiny, store_config=StoreConfig(directory=tmp_path / "caps"))
    engine.generate(PROMPT, max_new_tokens=5, stop_ids=[])
    engine.capsules.snapshot("disk")
    want = engine.generate([], max_new_tokens=6, stop_ids=[]).token_ids
    engine.capsules.save("disk")

    fresh = make_engine(tiny, store_config=StoreConfig(directory=tmp_path / "caps"))
    assert fresh.fingerprint == engine.fingerprint
    fresh.capsules.load("disk")
    fresh.capsules.restore("disk", verify=True)
    assert fresh.generate([], max_new_tokens=6, stop_ids=[]).token_ids == want
