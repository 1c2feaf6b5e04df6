"""Sampled speculative decoding checked at every position of many streams, with the check's power shown.

Why this and not only a chi-square at one position: bugs in the noise plumbing couple the draws of
different positions. A draft drawn with the Gumbel noise the next verification's residual or bonus draw
uses passes a 1,000-sample goodness of fit of the second token over a flat 256-token distribution, yet an
accepted draft's large noise value makes the next token repeat it. And this check found one in the engine:
drafts drawn before the counter advanced reused the noise of the drafts just judged (after a plain step
both were drawn at one counter), so a new draft tended to repeat an accepted one two or three tokens back.

The statistics: each emitted token ``x_i`` has a known plain distribution ``p_i = p(. | prompt, x_<i)`` (one
reference forward over the stream's own transcript, with the request's temperature / top-k / top-p). Its
randomised probability integral transform ``u_i = F_i(x_i - 1) + V * p_i(x_i)`` (token-id order, ``V``
uniform from a seeded generator) is, for a sampler that draws exactly from ``p``, independent and uniform
on (0, 1) across positions and streams (Rosenblatt). Pooled over every position of every stream:

- uniformity: Pearson's chi-square of the ``u`` deciles;
- independence of neighbours: ``sum z_i z_{i+1} / sqrt(n)`` with ``z = Phi^-1(u)``, standard normal;
- recurrences, the symptom of shared noise: tokens equal to one of the ``RECUR_WINDOW`` before them,
  against their expectation ``sum p_i(those tokens)`` (variance ``sum p (1 - p)``), as a z-score.

Bounds are fixed here, before any run: chi-square p > 1e-3, |z| < 4. The runs are deterministic (seeded
counter RNG), so a pass is not luck that varies between machines. Both plumbing bugs, put back on purpose,
must push the recurrence z-score past 4 in the same settings (it reaches 8 to 125).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from flashrt_ros.engine import LLMEngine, SamplingParams
from flashrt_ros.engine import speculative_steps
from flashrt_ros.engine.speculation import draw, gumbel, sampling_probs
from flashrt_ros.engine.state import RNG_COUNTER, RNG_SEED, TEMPERATURE, TOP_K, TOP_P
from flashrt_ros.models.registry import load_model
from flashrt_ros.runtime.arena import POSITION, StateArena, core_meta_specs
from test_speculation_verdict import _chi_square_p_value

MAX_CONTEXT = 160
STREAMS, NEW_TOKENS = 200, 16
UNIFORM_P_MIN = 1e-3
Z_MAX = 4.0
RECUR_WINDOW = 8
#: (drafts k, sampling): the random head's drafts overlap the verifier's distribution here (acceptance
#: ~25-50 %), so drafts are both accepted and rejected at every position
SETTINGS = [(2, SamplingParams(temperature=1.5)), (4, SamplingParams(temperature=1.5, top_p=0.95))]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded():
    return load_model("random-hybrid-tiny", seed=0, mtp=True)


@dataclass
class StreamCheck:
    """The three statistics over every emitted token of every stream."""

    tokens: int
    acceptance: float
    uniform_p: float
    neighbour_z: float
    recurrence_z: float


def plain_distributions(model, ids: list[int], first: int, sampling: SamplingParams) -> torch.Tensor:
    """``p(. | ids[:i])`` for every ``i`` in ``first .. len(ids)-1``: one forward on a fresh arena."""
    arena = StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT))
    with torch.no_grad():
        logits = model(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1), arena, last_only=False)
    return sampling_probs(logits[first - 1:], torch.tensor(sampling.temperature), torch.tensor(sampling.top_k),
                          torch.tensor(sampling.top_p)).double()


def check_streams(loaded, k: int, sampling: SamplingParams) -> StreamCheck:
    model, tok, _, fp = loaded
    engine = LLMEngine(model, tok, fingerprint_inputs=fp, speculative_tokens=k, max_context=MAX_CONTEXT,
                       prefill_chunk=16)
    engine.generate("Sample", max_new_tokens=0, stop_ids=[])
    engine.capsules.snapshot("prompt", overwrite=True)
    prompt = engine.transcript()
    pit_noise = torch.Generator().manual_seed(0)
    pits, accepted, drafted = [], 0, 0
    recurrences = expected = variance = 0.0
    for seed in range(1, STREAMS + 1):
        engine.capsules.restore("prompt")
        out = engine.generate([], max_new_tokens=NEW_TOKENS, stop_ids=[], sampling=SamplingParams(
            sampling.temperature, sampling.top_k, sampling.top_p, seed))
        accepted, drafted = accepted + out.accepted_tokens, drafted + out.drafted_tokens
        tokens = torch.tensor(out.token_ids)
        probs = plain_distributions(model, prompt + out.token_ids, len(prompt), sampling)
        mass = probs.gather(-1, tokens[:, None])[:, 0]
        assert bool((mass > 0).all()), "a token the plain sampler can never draw was emitted"
        below = probs.cumsum(-1).gather(-1, tokens[:, None])[:, 0] - mass
        pits.append((below + torch.rand(mass.shape, generator=pit_noise, dtype=mass.dtype) * mass)
                    .clamp(1e-12, 1 - 1e-12))
        for i in range(1, tokens.numel()):
            earlier = tokens[max(0, i - RECUR_WINDOW):i].unique()
            chance = float(probs[i, earlier].sum())
            recurrences += float(bool((earlier == tokens[i]).any()))
            expected, variance = expected + chance, variance + chance * (1 - chance)
    every = torch.cat(pits)
    deciles = torch.bincount((every * 10).long().clamp_max(9), minlength=10).float()
    normal = [torch.special.ndtri(u) for u in pits]
    pairs = sum(z.numel() - 1 for z in normal)
    neighbour = sum(float((z[1:] * z[:-1]).sum()) for z in normal) / math.sqrt(pairs)
    return StreamCheck(tokens=every.numel(), acceptance=accepted / max(drafted, 1),
                       uniform_p=_chi_square_p_value(deciles, torch.full((10,), 0.1)), neighbour_z=neighbour,
                       recurrence_z=(recurrences - expected) / math.sqrt(variance))


def draft_with(monkeypatch, counter_and_offset) -> None:
    """Replace the drafts' noise: ``counter_and_offset(steps, arena, j) -> (counter, first stream index)``."""
    cls = speculative_steps.SpeculativeDecoding
    real_verify = cls.verify

    def verify(self, greedy: bool) -> None:
        self._position_before = self.arena[POSITION].clone()   # the verify advances it by the emitted count
        try:
            real_verify(self, greedy)
        finally:
            self._position_before = None

    def chooser(self, greedy: bool):
        a = self.arena

        def choose(logits: torch.Tensor, j: int):
            probs = sampling_probs(logits[0], a[TEMPERATURE], a[TOP_K], a[TOP_P])
            counter, offset = counter_and_offset(self, a, j)
            return draw(probs, gumbel(a[RNG_SEED], counter, offset + self._vocab_ids)), probs
        return choose
    monkeypatch.setattr(cls, "verify", verify)
    monkeypatch.setattr(cls, "_chooser", chooser)


def emitted_by_this_verification(steps, arena) -> torch.Tensor | int:
    before = getattr(steps, "_position_before", None)
    return arena[POSITION] - before if before is not None else 0


MUTATIONS = {
    # every draft with the noise of the residual / bonus draw of the verification that will judge it
    "the next verification's noise": lambda steps, a, j: (a[RNG_COUNTER], 0),
    # the engine's bug this check found: a verification's drafts at the counter before its advance, the
    # counter of the drafts it judged when a plain step came before it
    "the counter before the advance": lambda steps, a, j: (
        a[RNG_COUNTER] - emitted_by_this_verification(steps, a), (2 + j) * steps._vocab_ids.shape[0]),
}


@pytest.mark.parametrize("k,sampling", SETTINGS, ids=["k2-T1.5", "k4-T1.5-top_p0.95"])
def test_every_position_of_every_stream_is_drawn_from_the_plain_distribution(loaded, k, sampling):
    check = check_streams(loaded, k, sampling)
    print(f"k={k}: {check}")
    assert check.tokens == STREAMS * NEW_TOKENS
    assert 0.1 < check.acceptance < 0.9, check           # both verdicts at many positions
    assert check.uniform_p > UNIFORM_P_MIN, check
    assert abs(check.neighbour_z) < Z_MAX, check
    assert abs(check.recurrence_z) < Z_MAX, check


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("k,sampling", SETTINGS, ids=["k2-T1.5", "k4-T1.5-top_p0.95"])
def test_the_check_fails_drafts_drawn_with_noise_used_elsewhere(loaded, k, sampling, mutation, monkeypatch):
    """The power of the check above, in the same settings and bounds."""
    draft_with(monkeypatch, MUTATIONS[mutation])
    check = check_streams(loaded, k, sampling)
    print(f"k={k}, drafts with {mutation}: {check}")
    assert check.recurrence_z > Z_MAX, check
