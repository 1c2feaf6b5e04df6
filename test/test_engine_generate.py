"""Generation API of the LLM engine: stop reasons, streaming text, chat turns, prefill chunking, status."""
import pytest
import torch

from flashrt_ros.engine import LLMEngine, SamplingParams
from flashrt_ros.engine.state import LOGITS
from flashrt_ros.models.registry import load_model
from flashrt_ros.models.tokenizer import ByteTokenizer, StreamDecoder
from flashrt_ros.runtime.arena import BOUNDARY, POSITION


@pytest.fixture(scope="module")
def tiny():
    return load_model("random-llama-tiny", seed=2)


def make_engine(tiny, **kw) -> LLMEngine:
    model, tok, _, fp = tiny
    kw.setdefault("max_context", 160)
    return LLMEngine(model, tok, fingerprint_inputs=fp, **kw)


def test_stop_token_ends_generation_and_is_left_pending(tiny):
    probe = make_engine(tiny)
    tokens = probe.generate("stop here", max_new_tokens=12, stop_ids=[]).token_ids
    stop = tokens[4]
    first = tokens.index(stop)
    engine = make_engine(tiny)
    result = engine.generate("stop here", max_new_tokens=12, stop_ids=[stop])
    assert result.stop_reason == "stop_token"
    assert result.token_ids == tokens[: first + 1]
    assert engine.transcript()[-1] == stop                       # in the transcript, as the pending token
    assert engine.generate("", max_new_tokens=0).stop_reason == "max_new_tokens"


def test_streamed_pieces_concatenate_to_the_text(tiny):
    engine = make_engine(tiny)
    pieces: list[str] = []
    result = engine.generate("stream", max_new_tokens=20, stop_ids=[],
                             sampling=SamplingParams(temperature=1.0, seed=5),
                             on_token=lambda t, s, _n: pieces.append(s))
    assert result.stop_reason == "max_new_tokens" and len(pieces) == 20
    assert result.text.startswith("".join(pieces))               # a split UTF-8 tail may be held back
    assert len(result.text) - len("".join(pieces)) <= 1


def test_stream_decoder_never_splits_a_character():
    tok = ByteTokenizer()
    text = "grün 青 ok"
    decoder = StreamDecoder(tok)
    pieces = [decoder.push(i) for i in tok.encode(text)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_chunked_prefill_matches_one_chunk(tiny):
    ids = list(range(10, 60))
    logits = []
    for chunk in (7, 64):
        engine = make_engine(tiny, prefill_chunk=chunk)
        engine.prefill(ids)
        logits.append(engine.arena[LOGITS].clone())
        assert int(engine.arena[POSITION]) == len(ids)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_every_prefill_chunk_and_token_commits_a_boundary(tiny):
    engine = make_engine(tiny, prefill_chunk=8)
    start = int(engine.arena[BOUNDARY])
    engine.generate([5] * 20, max_new_tokens=4, stop_ids=[])
    # 1 request setup + 3 prefill chunks (8+8+4) + 4 emitted tokens
    assert int(engine.arena[BOUNDARY]) == start + 1 + 3 + 4


def test_chat_turns_continue_the_transcript(tiny):
    engine = make_engine(tiny)
    tok = tiny[1]
    engine.generate("hi", chat=True, max_new_tokens=3, stop_ids=[])
    first = engine.transcript()
    assert tok.decode(first).startswith("user\nhi")
    engine.generate("again", chat=True, max_new_tokens=2, stop_ids=[])
    second = engine.transcript()
    assert second[: len(first)] == first
    assert second[len(first)] == 2                               # <|im_end|> closes the assistant turn
    assert tok.decode(second[len(first):]).startswith("\nuser\nagain")


def test_status_reports_position_sampling_and_latency(tiny):
    engine = make_engine(tiny)
    engine.generate("status", max_new_tokens=5, stop_ids=[], sampling=SamplingParams(temperature=0.5, seed=9))
    status = engine.status()
    assert status["position"] == len("status") + 4 and status["has_pending"]
    assert status["sampling"]["seed"] == 9 and status["sampling"]["counter"] == 5
    assert status["latency"]["decode"]["count"] == 4
    assert status["latency"]["decode"]["p99_ms"] >= status["latency"]["decode"]["p50_ms"] > 0
    assert status["last_generation"]["stop_reason"] == "max_new_tokens"
    assert status["store"]["ring"]["available"] > 0


def test_reset_is_a_cold_start_with_a_monotonic_boundary(tiny):
    engine = make_engine(tiny)
    cold = engine.generate("same", max_new_tokens=6, stop_ids=[]).token_ids
    boundary = int(engine.arena[BOUNDARY])
    engine.capsules.reset()
    assert int(engine.arena[BOUNDARY]) > boundary and engine.transcript() == []
    assert engine.generate("same", max_new_tokens=6, stop_ids=[]).token_ids == cold
