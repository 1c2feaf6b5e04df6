"""Refused or failed requests leave the live state byte-identical; verbs from the engine's own callbacks.

Every refusal path is checked by comparing the whole arena block before and after.
The Generate goal's own fields (sampling, reset, session) are checked through the
node in test_node_services.py (verify against the live state).
"""
from __future__ import annotations

import threading

import pytest

from flashrt_ros.engine import LLMEngine
from flashrt_ros.engine.sampling import SamplingParams
from flashrt_ros.models.registry import load_model
from flashrt_ros.runtime.errors import Busy, ContextOverflow, InvalidArgument

PROMPT = "Refusals change nothing."


@pytest.fixture(scope="module")
def tiny():
    return load_model("random-llama-tiny", seed=1)


def make_engine(tiny, **kw) -> LLMEngine:
    model, tok, _, fp = tiny
    return LLMEngine(model, tok, max_context=64, prefill_chunk=16, fingerprint_inputs=fp, **kw)


def used_engine(tiny) -> LLMEngine:
    engine = make_engine(tiny)
    engine.generate(PROMPT, max_new_tokens=3, stop_ids=[], sampling=SamplingParams(temperature=0.7, seed=4))
    return engine


ENGINE_REFUSALS = {
    "token id out of range": (InvalidArgument, lambda e: e.generate([5, e.model.vocab_size + 3], max_new_tokens=2)),
    "negative token id": (InvalidArgument, lambda e: e.generate([-1], max_new_tokens=2)),
    "huge token id": (InvalidArgument, lambda e: e.generate([2 ** 70], max_new_tokens=2)),
    "prompt over max_context": (ContextOverflow, lambda e: e.generate([1] * 80, max_new_tokens=2)),
    "negative max_new_tokens": (InvalidArgument, lambda e: e.generate("x", max_new_tokens=-1)),
    "chat with token ids": (InvalidArgument, lambda e: e.generate([1, 2], chat=True)),
}
@pytest.mark.parametrize("case", ENGINE_REFUSALS, ids=list(ENGINE_REFUSALS))
def test_refused_engine_request_leaves_the_arena_byte_identical(tiny, case):
    error, call = ENGINE_REFUSALS[case]
    engine = used_engine(tiny)
    before = engine.arena.block.clone()
    with pytest.raises(error):
        call(engine)
    assert engine.arena.block.equal(before)


@pytest.mark.parametrize("prompt, error", [([1] * 80, ContextOverflow), ([-4], InvalidArgument),
                                           ("", InvalidArgument)], ids=["too-long", "bad-id", "empty"])
def test_a_prompt_that_cannot_start_a_fresh_transcript_is_refused_before_any_reset(tiny, prompt, error):
    engine = used_engine(tiny)
    before = engine.arena.block.clone()
    with pytest.raises(error):
        engine.check_fresh_request(prompt, chat=False)
    assert engine.arena.block.equal(before)
    engine.check_fresh_request([1] * 60, chat=False)           # fits an empty transcript of 64


def test_empty_prompt_on_an_empty_context_is_refused_and_changes_nothing(tiny):
    engine = make_engine(tiny)
    before = engine.arena.block.clone()
    with pytest.raises(InvalidArgument, match="nothing to continue"):
        engine.generate("", max_new_tokens=4)
    assert engine.arena.block.equal(before)


def test_the_largest_uint64_seed_is_accepted_and_stored_as_int64(tiny):
    engine = used_engine(tiny)
    engine.generate("more", max_new_tokens=2, sampling=SamplingParams(temperature=0.9, seed=2 ** 64 - 1))
    sampling = engine.status()["sampling"]
    assert sampling["seed"] == -1 and sampling["temperature"] == pytest.approx(0.9)
    again = used_engine(tiny)
    again.generate("more", max_new_tokens=2, sampling=SamplingParams(temperature=0.9, seed=2 ** 64 - 1))
    assert again.transcript() == engine.transcript()          # the same seed, the same draws


def test_restore_from_on_token_is_refused_at_once_and_the_step_is_undone(tiny):
    reference = used_engine(tiny)
    tokens = reference.generate(" go on", max_new_tokens=8, stop_ids=[]).token_ids

    engine = used_engine(tiny)
    engine.capsules.snapshot("a")
    seen: list[int] = []

    def on_token(token: int, piece: str, transcript_length: int) -> None:
        seen.append(token)
        if len(seen) == 5:
            engine.capsules.restore("a")              # inside the step: would run mid-step

    with pytest.raises(Busy, match="inside an engine step"):
        engine.generate(" go on", max_new_tokens=8, stop_ids=[], on_token=on_token)
    # four tokens committed; the fifth step was undone, so continuing reproduces the reference
    assert engine.generate([], max_new_tokens=4, stop_ids=[]).token_ids == tokens[4:]
    assert engine.transcript() == reference.transcript()


def test_restore_from_should_stop_runs_at_once_and_ends_the_generation(tiny):
    engine = used_engine(tiny)
    engine.capsules.timeout_s = None                    # a self-wait would hang forever
    engine.capsules.snapshot("a")
    at_a = engine.transcript()
    expected = used_engine(tiny).generate([], max_new_tokens=5, stop_ids=[]).token_ids
    polls = []

    def should_stop() -> bool:
        polls.append(1)
        if len(polls) == 4:
            engine.capsules.restore("a")
        return False

    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(r=engine.generate(
        " more words", max_new_tokens=10, stop_ids=[], should_stop=should_stop)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "a verb from should_stop waited on its own engine"
    assert outcome["r"].stop_reason == "cancelled"
    assert engine.transcript() == at_a
    status = engine.status()
    assert status["position"] + status["has_pending"] == len(at_a)
    assert engine.generate([], max_new_tokens=5, stop_ids=[]).token_ids == expected
