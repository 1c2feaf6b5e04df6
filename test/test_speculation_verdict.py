"""The verdict rules of speculative decoding: exact greedy acceptance, distribution-preserving sampling."""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.engine.sampling import sample_token
from flashrt_ros.engine.speculation import (
    greedy_verdict,
    gumbel,
    last_emitted,
    rejection_verdict,
    sampling_probs,
)


def _chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's goodness of fit (cells with expected count >= 5; the rest pooled)."""
    n = observed.sum()
    expected = expected_probs * n
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)]).double()
    exp = torch.cat([expected[big], expected[~big].sum().view(1)]).double()
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))


def test_greedy_verdict_accepts_the_prefix_that_matches_the_argmax() -> None:
    vocab, k = 7, 3
    targets = torch.tensor([4, 1, 6, 2])
    logits = torch.nn.functional.one_hot(targets, vocab).float()
    for drafts, accepted in (([4, 1, 6], 3), ([4, 1, 0], 2), ([4, 0, 6], 1), ([0, 1, 6], 0)):
        tokens, got = greedy_verdict(torch.tensor(drafts), logits)
        assert int(got) == accepted
        assert tokens.tolist() == targets.tolist()      # the emitted ones: tokens[:accepted + 1]
    assert greedy_verdict(torch.tensor([4, 1, 6]), logits)[0].shape == (k + 1,)


def test_last_emitted_cuts_at_the_first_stop_and_at_the_limit() -> None:
    tokens = torch.tensor([5, 9, 3, 9])
    stops = torch.tensor([9, -1, -1])
    big = torch.tensor(100)
    assert int(last_emitted(tokens, torch.tensor(3), stops, big)) == 1        # the stop token is emitted
    assert int(last_emitted(tokens, torch.tensor(0), stops, big)) == 0        # a stop past the verdict is not seen
    assert int(last_emitted(tokens, torch.tensor(3), torch.tensor([-1]), big)) == 3
    assert int(last_emitted(tokens, torch.tensor(3), torch.tensor([-1]), torch.tensor(2))) == 1
    assert int(last_emitted(tokens, torch.tensor(3), stops, torch.tensor(1))) == 0


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.6), (0.0, 0, 1.0)])
def test_sampling_probs_is_the_distribution_sample_token_draws(temperature, top_k, top_p) -> None:
    logits = torch.tensor([0.3, 2.0, -1.0, 1.2, 1.9, -0.4])
    t, k, p = torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p)
    probs = sampling_probs(logits, t, k, p)
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    seed = torch.tensor(12345)
    draws = torch.stack([sample_token(logits, t, k, p, seed, torch.tensor(c)) for c in range(4000)])
    counts = torch.bincount(draws, minlength=6).float()
    assert torch.equal(counts > 0, probs > 0)                 # the same support
    if temperature > 0:
        assert _chi_square_p_value(counts, probs) > 1e-3


def _simulate(target: torch.Tensor, draft: torch.Tensor, k: int, streams: int, steps: int,
              seed: int, always_accept: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``steps`` speculative steps on ``streams`` independent streams of a stationary model.

    Returns the counts of every emitted token and of consecutive pairs in each stream's output
    (across step boundaries: a pair inside one step alone would be a biased selection).
    """
    vocab = target.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    outputs: list[list[int]] = [[] for _ in range(streams)]
    target_rows = target.expand(streams, k + 1, vocab)
    draft_rows = draft.expand(streams, k, vocab)
    for _ in range(steps):
        drafts = torch.multinomial(draft_rows.reshape(-1, vocab), 1, generator=gen).view(streams, k)
        uniforms = torch.rand(streams, k, generator=gen)
        if always_accept:
            uniforms = torch.zeros_like(uniforms)
        noise = -torch.log(-torch.log(torch.rand(streams, vocab, generator=gen).clamp_min(1e-12)))
        tokens, accepted = rejection_verdict(drafts, draft_rows, target_rows, uniforms, noise)
        for out, row, n in zip(outputs, tokens.tolist(), accepted.tolist()):
            out.extend(row[:n + 1])
    tokens_seen, pairs = torch.zeros(vocab), torch.zeros(vocab, vocab)
    for out in outputs:
        for a, b in zip(out, out[1:]):
            tokens_seen[a] += 1
            pairs[a, b] += 1
    return tokens_seen, pairs


def test_speculative_sampling_emits_exactly_the_target_distribution() -> None:
    """Drafts from a distribution unlike the target (and with mass where the target has none):
    every emitted token is distributed as the target, and consecutive ones independently."""
    target = torch.tensor([0.35, 0.25, 0.2, 0.12, 0.08, 0.0])
    draft = torch.tensor([0.05, 0.1, 0.15, 0.2, 0.25, 0.25])
    singles, pairs = _simulate(target, draft, k=3, streams=400, steps=40, seed=0)
    assert singles.sum() > 20000 and singles[5] == 0
    assert _chi_square_p_value(singles, target) > 1e-3
    assert _chi_square_p_value(pairs.flatten(), torch.outer(target, target).flatten()) > 1e-3
    # the test has power: accepting every draft emits the draft distribution, and fails it
    biased, _ = _simulate(target, draft, k=3, streams=100, steps=10, seed=1, always_accept=True)
    assert _chi_square_p_value(biased, target) < 1e-9


def test_a_one_hot_drafter_is_accepted_with_the_target_probability_of_its_token() -> None:
    """A deterministic drafter (q one-hot, as the oracle and greedy drafting under sampling) is a special case."""
    target = torch.tensor([0.5, 0.3, 0.2])
    draft = torch.tensor([0.0, 1.0, 0.0])                # always proposes token 1
    singles, _ = _simulate(target, draft, k=2, streams=400, steps=30, seed=2)
    assert _chi_square_p_value(singles, target) > 1e-3


def test_counter_based_noise_makes_the_verdict_a_pure_function_of_seed_and_counter() -> None:
    target = sampling_probs(torch.randn(3, 50, generator=torch.Generator().manual_seed(3)), torch.tensor(1.0),
                            torch.tensor(0), torch.tensor(1.0))
    draft = target[:2].roll(1, dims=-1)
    drafts = torch.tensor([7, 9])
    seed, counter = torch.tensor(99), torch.tensor(5)

    def verdict():
        return rejection_verdict(drafts, draft, target, torch.rand(2, generator=torch.Generator().manual_seed(0)),
                                 gumbel(seed, counter, torch.arange(50)))
    first, again = verdict(), verdict()
    assert all(torch.equal(x, y) for x, y in zip(first, again))
