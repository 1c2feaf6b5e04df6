"""Speculative decoding on the hybrid model: lossless, every accept / reject / rollback path, capsules.

Model: ``random-hybrid-tiny`` with a random MTP head (exactness does not need a
trained one: whatever is drafted, the output must be the verifier's). A random
head is almost never right, so the accept paths are driven by an oracle drafter
that proposes the plain run's own continuation with errors at chosen positions.
"""
from __future__ import annotations

import random

import pytest
import torch

from flashrt_ros.engine import LLMEngine, SamplingParams, StoreConfig
from flashrt_ros.engine.drafters import MTPDrafter, OracleDrafter
from flashrt_ros.engine.speculative_steps import DRAFTS
from flashrt_ros.models.hybrid.mtp import MTP_HIDDEN, MTP_KV
from flashrt_ros.models.registry import load_model
from flashrt_ros.runtime.arena import StateArena, core_meta_specs
from flashrt_ros.runtime.errors import InvalidArgument

MAX_CONTEXT = 160
CHUNK = 16
PROMPTS = ["A", "Speculation must not change a single token.", "0123456789abcde",
           "0123456789abcdef", "0123456789abcdefg", "Recurrent state absorbs every token it sees, "
           "rejected ones too, so it must be rolled back.", "ok", "The quick brown fox"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: torch's intra-op threads only add contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded():
    return load_model("random-hybrid-tiny", seed=0, mtp=True)


def make_engine(loaded, tokens: int = 0, drafter=None, **kw) -> LLMEngine:
    model, tok, _, fp = loaded
    kw.setdefault("max_context", MAX_CONTEXT)
    kw.setdefault("prefill_chunk", CHUNK)
    return LLMEngine(model, tok, fingerprint_inputs=fp, speculative_tokens=tokens, drafter=drafter, **kw)


def live_bytes(engine: LLMEngine) -> dict[str, bytes]:
    return {n: engine.arena.live_view(n).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            for n in engine.arena}


def assert_model_state_close(spec: LLMEngine, plain: LLMEngine) -> None:
    """Every buffer the plain engine has (KV, recurrent, conv, transcript, ...) agrees with the speculative one's.

    Up to float32 rounding (a (k+1)-row forward rounds unlike a 1-row one: ~1e-6 relative); a state
    rolled back to the wrong token is off by O(1).
    """
    assert spec.runner.read_scalars() == plain.runner.read_scalars()
    for name in plain.arena:
        if name == "meta.boundary":
            continue
        a, b = spec.arena.live_view(name), plain.arena.live_view(name)
        if a.is_floating_point():
            assert (a - b).norm() <= 1e-4 * b.norm() + 1e-6, name
        else:
            assert torch.equal(a, b), name


def oracle_for(loaded, script, wrong=()) -> OracleDrafter:
    oracle = OracleDrafter(loaded[0].vocab_size, MAX_CONTEXT + 16, "cpu")
    oracle.set_script(script, wrong)
    return oracle


def expected_counts(start: int, new_tokens: int, k: int, wrong: set[int], max_context: int = MAX_CONTEXT,
                    ) -> tuple[int, int]:
    """(drafted, accepted) of a greedy generation whose first token lands at ``start`` (oracle drafter)."""
    position, emitted, drafted, accepted = start, 1, 0, 0
    while emitted < new_tokens and position < max_context:
        if position + k < max_context:
            run = 0
            while run < k and position + 1 + run not in wrong:
                run += 1
            last = min(run, new_tokens - emitted - 1)
            drafted, accepted = drafted + k, accepted + last
            position, emitted = position + last + 1, emitted + last + 1
        else:
            position, emitted = position + 1, emitted + 1
    return drafted, accepted


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_speculation_with_the_mtp_head_equals_plain_decoding(loaded, k):
    plain, spec = make_engine(loaded), make_engine(loaded, k)
    for prompt in PROMPTS:
        plain.capsules.reset()
        spec.capsules.reset()
        for turn in (prompt, " and a second turn", ""):          # prefill at 0, with a pending token, none
            want = plain.generate(turn, max_new_tokens=13, stop_ids=[])
            got = spec.generate(turn, max_new_tokens=13, stop_ids=[])
            assert got.token_ids == want.token_ids, (prompt, turn)
            assert (got.position, got.transcript_length) == (want.position, want.transcript_length)
            assert got.drafted_tokens >= k and got.accepted_tokens <= got.drafted_tokens
        assert spec.transcript() == plain.transcript()
        assert_model_state_close(spec, plain)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_oracle_errors_reach_every_accept_reject_and_rollback_path(loaded, k):
    """All right, all wrong, wrong first / middle / last of a step, random errors: output and the whole
    model state equal plain decoding's, and the acceptance counts are exactly what the pattern implies."""
    prompt, new_tokens = "Roll back exactly to the last accepted token.", 40
    plain = make_engine(loaded)
    want = plain.generate(prompt, max_new_tokens=new_tokens, stop_ids=[])
    script = plain.transcript()
    start = len(script) - new_tokens                              # position of the first emitted token
    span = range(start + 1, start + new_tokens)
    rng = random.Random(k)
    patterns = {"all right": set(), "all wrong": set(span),
                "every (k+1)th": {p for p in span if (p - start) % (k + 1) == 0},
                "every other": {p for p in span if (p - start) % 2 == 0},
                "random 30%": {p for p in span if rng.random() < 0.3},
                "random 70%": {p for p in span if rng.random() < 0.7}}
    for name, wrong in patterns.items():
        spec = make_engine(loaded, k, oracle_for(loaded, script, wrong))
        got = spec.generate(prompt, max_new_tokens=new_tokens, stop_ids=[])
        assert got.token_ids == want.token_ids, name
        assert (got.drafted_tokens, got.accepted_tokens) == expected_counts(start, new_tokens, k, wrong), name
        assert_model_state_close(spec, plain)
    assert expected_counts(start, new_tokens, k, set()) == ((new_tokens - 1 + k) // (k + 1) * k,
                                                            new_tokens - 1 - (new_tokens - 1 + k) // (k + 1))


def test_a_stop_token_inside_accepted_drafts_ends_where_plain_decoding_ends(loaded):
    prompt = "Stop in the middle of a run of accepted drafts."
    plain = make_engine(loaded)
    full = plain.generate(prompt, max_new_tokens=30, stop_ids=[]).token_ids
    script = plain.transcript()
    for stop in (full[5], full[12], full[13]):
        plain.capsules.reset()
        want = plain.generate(prompt, max_new_tokens=30, stop_ids=[stop])
        spec = make_engine(loaded, 4, oracle_for(loaded, script))
        got = spec.generate(prompt, max_new_tokens=30, stop_ids=[stop])
        assert got.stop_reason == want.stop_reason == "stop_token"
        assert got.token_ids == want.token_ids and got.token_ids[-1] == stop
        assert spec.transcript() == plain.transcript()          # the stop token pending, nothing past it consumed
        assert_model_state_close(spec, plain)


@pytest.mark.parametrize("new_tokens", [1, 2, 7, 11])
def test_max_new_tokens_cuts_a_step_without_consuming_past_the_limit(loaded, new_tokens):
    prompt = "Exactly this many tokens."
    plain = make_engine(loaded)
    want = plain.generate(prompt, max_new_tokens=new_tokens, stop_ids=[])
    script = plain.transcript() + [0] * 8
    spec = make_engine(loaded, 3, oracle_for(loaded, script))
    got = spec.generate(prompt, max_new_tokens=new_tokens, stop_ids=[])
    assert got.token_ids == want.token_ids and got.stop_reason == "max_new_tokens"
    assert spec.transcript() == plain.transcript()


def test_near_the_context_end_steps_fall_back_to_plain_decoding_until_context_full(loaded):
    prompt, max_context = "Fill the context to its last row.", 64
    plain = make_engine(loaded, max_context=max_context)
    want = plain.generate(prompt, max_new_tokens=200, stop_ids=[])
    assert want.stop_reason == "context_full"
    script = plain.transcript()
    spec = make_engine(loaded, 4, oracle_for(loaded, script), max_context=max_context)
    got = spec.generate(prompt, max_new_tokens=200, stop_ids=[])
    assert (got.token_ids, got.stop_reason) == (want.token_ids, want.stop_reason)
    start = len(script) - len(want.token_ids)
    assert (got.drafted_tokens, got.accepted_tokens) == expected_counts(start, 200, 4, set(), max_context)
    assert_model_state_close(spec, plain)


# ---------------------------------------------------------------------------------------------- the MTP head


class RecordingMTP(MTPDrafter):
    """Runs the MTP head's bookkeeping and records its drafts, but proposes the oracle's (controlled acceptance)."""

    def __init__(self, model, oracle: OracleDrafter) -> None:
        super().__init__(model)
        self.oracle = oracle
        self.proposals: list[tuple[int, list[int]]] = []      # (pending token's position, MTP drafts)

    def propose(self, arena, step, tokens, choose):
        drafts, _ = super().propose(arena, step, tokens, choose)
        pending = int(step.start) + 1 + (int(step.kept) + 1 if step.kept is not None else 0)
        self.proposals.append((pending, drafts.tolist()))
        return self.oracle.propose(arena, step, tokens, choose)


@torch.no_grad()
def reference_mtp_drafts(model, transcript: list[int], pending: int, k: int) -> list[int]:
    """Greedy MTP drafts after ``transcript[:pending+1]``, recomputed from nothing (fresh arena)."""
    arena = StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT) + model.mtp_state_specs(MAX_CONTEXT + k))
    ids = torch.tensor(transcript[:pending + 1])
    hidden = model.hidden_states(ids[:-1], torch.arange(pending), arena)
    h = model.mtp_hidden(hidden, ids[1:], torch.arange(pending), arena)[-1:]
    drafts = []
    for j in range(k):
        token = model.logits(h)[0].argmax()
        drafts.append(int(token))
        h = model.mtp_hidden(h, token.view(1), torch.tensor([pending + j]), arena)
    return drafts


def test_mtp_head_drafts_what_it_predicts_from_the_accepted_transcript(loaded):
    """Whatever was accepted and rolled back (oracle errors), prefill at 0 or later, first draw, decode
    fallback: the head's drafts equal a from-scratch evaluation of the head on the kept transcript."""
    k, max_context = 3, 72
    plain = make_engine(loaded, max_context=max_context)
    plain.generate("A", max_new_tokens=12, stop_ids=[])
    plain.generate("nother turn, fed after a pending token", max_new_tokens=40, stop_ids=[])
    script = plain.transcript()
    wrong = {p for p in range(len(script)) if p % 3 == 0 or p % 7 == 0}
    drafter = RecordingMTP(loaded[0], oracle_for(loaded, script, wrong))
    spec = make_engine(loaded, k, drafter, max_context=max_context)
    spec.generate("A", max_new_tokens=12, stop_ids=[])
    spec.generate("nother turn, fed after a pending token", max_new_tokens=40, stop_ids=[])
    assert spec.transcript() == script
    assert len(drafter.proposals) > 15
    assert {p for p, _ in drafter.proposals} >= {1, max_context - 1}    # the first draw, the last fallback
    for pending, drafts in drafter.proposals:
        assert drafts == reference_mtp_drafts(loaded[0], script, pending, k), pending


def test_the_capsule_holds_the_drafts_and_the_mtp_state(loaded):
    spec = make_engine(loaded, 2)
    groups = {s.name: s.group for s in spec.arena.specs}
    assert groups[DRAFTS] == "speculation" and groups[MTP_KV] == groups[MTP_HIDDEN] == "mtp"
    plain = make_engine(loaded)
    assert not set(plain.arena) & {DRAFTS, MTP_KV, MTP_HIDDEN}


# ---------------------------------------------------------------------------------------------- capsules


@pytest.mark.parametrize("drafter_kind", ["mtp", "oracle"])
def test_restore_mid_speculation_continues_as_uninterrupted_and_as_plain(loaded, drafter_kind):
    prompt = "Interrupt me between two speculative steps."
    plain = make_engine(loaded)
    full = plain.generate(prompt, max_new_tokens=40, stop_ids=[]).token_ids
    script = plain.transcript()

    def fresh() -> LLMEngine:
        drafter = None if drafter_kind == "mtp" else oracle_for(loaded, script, {p for p in range(0, MAX_CONTEXT, 5)})
        return make_engine(loaded, 3, drafter)

    straight = fresh()
    head = straight.generate(prompt, max_new_tokens=14, stop_ids=[])
    tail = straight.generate([], max_new_tokens=26, stop_ids=[])
    expected_state = live_bytes(straight)

    engine = fresh()
    assert engine.generate(prompt, max_new_tokens=14, stop_ids=[]).token_ids == head.token_ids
    engine.capsules.snapshot("mid")
    engine.generate(" a detour that rewrites every buffer", max_new_tokens=9, stop_ids=[])
    engine.capsules.restore("mid")
    again = engine.generate([], max_new_tokens=26, stop_ids=[])
    assert again.token_ids == tail.token_ids
    assert (again.drafted_tokens, again.accepted_tokens) == (tail.drafted_tokens, tail.accepted_tokens)
    assert live_bytes(engine) == expected_state                    # drafts and MTP state included
    assert head.token_ids + again.token_ids == full


def test_rollback_of_speculative_steps_replays_them(loaded):
    prompt = "Roll the ring back over speculative steps."
    plain = make_engine(loaded)
    plain.generate(prompt, max_new_tokens=30, stop_ids=[])
    script = plain.transcript()
    engine = make_engine(loaded, 2, oracle_for(loaded, script, {p for p in range(0, MAX_CONTEXT, 4)}),
                         store_config=StoreConfig(rollback_depth=32))
    engine.generate(prompt, max_new_tokens=10, stop_ids=[])
    before = live_bytes(engine)
    first = engine.generate([], max_new_tokens=20, stop_ids=[])
    steps = engine.status()["speculation"]["steps"]
    assert 0 < steps
    after = live_bytes(engine)
    # back over every step of the second call (each a committed boundary), then the same again
    engine.capsules.rollback(len(first.token_ids) - first.accepted_tokens)
    assert live_bytes(engine) == before
    again = engine.generate([], max_new_tokens=20, stop_ids=[])
    assert again.token_ids == first.token_ids and live_bytes(engine) == after


def test_a_speculative_step_whose_report_fails_is_undone_whole(loaded):
    """The client callback raises after two of a step's four tokens: the step is rolled back entirely
    (drafts and MTP state included), and the generation continues as if it had never run."""
    prompt = "Undo a step half reported."
    plain = make_engine(loaded)
    full = plain.generate(prompt, max_new_tokens=20, stop_ids=[]).token_ids
    engine = make_engine(loaded, 3, oracle_for(loaded, plain.transcript()))
    head = engine.generate(prompt, max_new_tokens=5, stop_ids=[]).token_ids
    before = live_bytes(engine)
    reported = []

    def on_token(token, piece, length):
        reported.append(token)
        if len(reported) == 2:
            raise RuntimeError("client went away")
    with pytest.raises(RuntimeError, match="went away"):
        engine.generate([], max_new_tokens=15, stop_ids=[], on_token=on_token)
    assert live_bytes(engine) == before and engine.status()["speculation"]["steps"] == 1
    assert head + engine.generate([], max_new_tokens=15, stop_ids=[]).token_ids == full


def test_sampled_speculation_restores_to_the_same_draws(loaded):
    sampling = SamplingParams(temperature=0.9, top_k=20, seed=7)
    engine = make_engine(loaded, 3)
    engine.generate("Sampled", max_new_tokens=6, stop_ids=[], sampling=sampling)
    engine.capsules.snapshot("s")
    first = engine.generate([], max_new_tokens=25, stop_ids=[])
    engine.generate(" something else", max_new_tokens=5, stop_ids=[], sampling=SamplingParams(temperature=1.5, seed=1))
    engine.capsules.restore("s")
    again = engine.generate([], max_new_tokens=25, stop_ids=[])
    assert again.token_ids == first.token_ids


# ---------------------------------------------------------------------------------------------- sampling


def _plain_probs(model, ids: list[int], sampling: SamplingParams) -> torch.Tensor:
    """The plain engine's sampling distribution after ``ids`` (fresh arena)."""
    from flashrt_ros.engine.speculation import sampling_probs

    arena = StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT))
    with torch.no_grad():
        logits = model(torch.tensor(ids), torch.arange(len(ids)), arena, last_only=True)[0]
    return sampling_probs(logits, torch.tensor(sampling.temperature), torch.tensor(sampling.top_k),
                          torch.tensor(sampling.top_p))


def _sample_outputs(engine: LLMEngine, prompt: str, sampling: SamplingParams, n: int, new_tokens: int,
                    ) -> tuple[list[tuple[int, ...]], int, int]:
    """``n`` generations of ``new_tokens`` tokens after ``prompt`` (seeds 1..n); drafts accepted, drafted."""
    engine.generate(prompt, max_new_tokens=0, stop_ids=[])
    engine.capsules.snapshot("prompt", overwrite=True)
    outputs, accepted, drafted = [], 0, 0
    for seed in range(1, n + 1):
        engine.capsules.restore("prompt")
        out = engine.generate([], max_new_tokens=new_tokens, stop_ids=[],
                              sampling=SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed))
        outputs.append(tuple(out.token_ids))
        accepted, drafted = accepted + out.accepted_tokens, drafted + out.drafted_tokens
    return outputs, accepted, drafted


def test_sampled_speculation_with_the_mtp_head_draws_from_the_plain_distribution(loaded):
    """The MTP head drafts from its own distribution (full vocabulary, T = 1.5); the second emitted token
    (the first a verdict decides) follows the plain marginal sum_a p(a) p(. | a), chi-square."""
    from test_speculation_verdict import _chi_square_p_value

    settings = SamplingParams(temperature=1.5)
    engine = make_engine(loaded, 2)
    outputs, accepted, drafted = _sample_outputs(engine, "Sample", settings, 1000, 3)
    assert accepted > 100 and drafted - accepted > 100          # both verdicts, many times
    prompt_ids = engine.transcript()
    model = loaded[0]
    first = _plain_probs(model, prompt_ids, settings)
    marginal = sum(first[a] * _plain_probs(model, prompt_ids + [a], settings) for a in range(model.vocab_size))
    counts = torch.bincount(torch.tensor([out[1] for out in outputs]), minlength=model.vocab_size).float()
    assert _chi_square_p_value(counts, marginal) > 1e-3


def test_sampled_speculation_with_a_deterministic_drafter_draws_from_the_plain_distribution(loaded):
    """Top-3 sampling, drafts = the greedy continuation (one-hot q, accepted with probability p(draft)):
    the first three emitted tokens follow the exact plain joint distribution, chi-square over 27 cells."""
    from test_speculation_verdict import _chi_square_p_value

    settings = SamplingParams(temperature=1.0, top_k=3)
    plain = make_engine(loaded)
    plain.generate("Sample", max_new_tokens=6, stop_ids=[])
    engine = make_engine(loaded, 2, oracle_for(loaded, plain.transcript()))
    outputs, accepted, drafted = _sample_outputs(engine, "Sample", settings, 1000, 3)
    assert accepted > 50 and drafted - accepted > 50
    prompt_ids = plain.transcript()[:-6]
    model = loaded[0]
    exact: dict[tuple[int, ...], float] = {}
    p1 = _plain_probs(model, prompt_ids, settings)
    for a in p1.nonzero().flatten().tolist():
        p2 = _plain_probs(model, prompt_ids + [a], settings)
        for b in p2.nonzero().flatten().tolist():
            p3 = _plain_probs(model, prompt_ids + [a, b], settings)
            for c in p3.nonzero().flatten().tolist():
                exact[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    index = {triple: i for i, triple in enumerate(exact)}
    counts = torch.zeros(len(exact))
    for out in outputs:
        counts[index[out]] += 1
    assert _chi_square_p_value(counts, torch.tensor(list(exact.values()))) > 1e-3


# ---------------------------------------------------------------------------------------------- refusals


def test_speculation_is_refused_clearly_where_it_cannot_run(loaded):
    model, tok, _, _ = load_model("random-llama-tiny", seed=0)
    with pytest.raises(InvalidArgument, match="verification forward"):
        LLMEngine(model, tok, max_context=64, speculative_tokens=2)
    no_head, tok, _, _ = load_model("random-hybrid-tiny", seed=0)
    with pytest.raises(InvalidArgument, match="multi-token-prediction head"):
        LLMEngine(no_head, tok, max_context=64, speculative_tokens=2)
    for bad in (-1, 9, True, 2.0):
        with pytest.raises(InvalidArgument, match="speculative_tokens"):
            make_engine(loaded, bad)
    with pytest.raises(InvalidArgument, match="no room"):
        make_engine(loaded, 4, max_context=5)
    with pytest.raises(InvalidArgument, match="no multi-token-prediction head"):
        load_model("random-llama-tiny", mtp=True)


def test_status_and_result_count_drafted_and_accepted_tokens(loaded):
    plain = make_engine(loaded)
    plain.generate("Count them.", max_new_tokens=21, stop_ids=[])
    spec = make_engine(loaded, 4, oracle_for(loaded, plain.transcript()))
    result = spec.generate("Count them.", max_new_tokens=21, stop_ids=[])
    assert (result.drafted_tokens, result.accepted_tokens) == (16, 16)     # 4 steps of 4 drafts, then + 1 each
    status = spec.status()["speculation"]
    assert status == {"tokens": 4, "drafter": "oracle", "steps": 4, "drafted": 16, "accepted": 16,
                      "acceptance_rate": 1.0}
    assert spec.status()["last_generation"]["accepted_tokens"] == 16
    assert plain.status()["speculation"] == {"tokens": 0}
    assert result.as_dict()["drafted_tokens"] == 16
