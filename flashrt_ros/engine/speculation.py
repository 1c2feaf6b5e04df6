"""The verdict of speculative decoding: which drafted tokens the verifier accepts, and what comes next.

Why these rules: speculation must not change what the engine generates. Greedy:
a draft is accepted while it equals the verifier's argmax, and the token after
the accepted prefix is the verifier's argmax there, so the output is the
verifier's own greedy continuation. Sampled: standard speculative sampling
(Leviathan et al. 2023; Chen et al. 2023): draft ``d_i`` drawn from ``q_i`` is
accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection
the next token is drawn from ``max(0, p_i - q_i)`` renormalised, and after ``k``
acceptances from ``p_k``. Every emitted token is then distributed exactly as
``p`` (the target distribution with temperature, top-k and top-p applied, as
``sampling.sample_token`` draws), whatever the drafter proposes.

Everything here is fixed-shape tensor code without host reads (capturable); the
random numbers come from the arena's counter-based stream
(``ops.counter_rng``), so a restored capsule replays the same verdicts. The
functions accept leading batch dimensions (the tests vectorise over streams).
"""
from __future__ import annotations

import torch

from flashrt_ros.ops.counter_rng import uniform

#: Stop ids the in-step truncation can watch (a request with more falls back to plain decoding).
MAX_STOP_IDS = 32


def sampling_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """The distribution ``sample_token`` draws from, ``[..., V]`` float32 in vocabulary order.

    ``softmax(logits / T)`` restricted to the top-k tokens, then to the top-p
    nucleus of that (the most likely token always kept), renormalised; one-hot
    at the argmax where ``temperature == 0``.
    """
    vocab = logits.shape[-1]
    scaled = logits.float() / temperature.clamp_min(1e-6)
    values, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp_max(vocab), torch.full_like(top_k, vocab))
    values = values.masked_fill(rank >= k, float("-inf"))
    probs = values.softmax(dim=-1)
    keep = (probs.cumsum(dim=-1) - probs) < top_p
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    kept = kept / kept.sum(dim=-1, keepdim=True)
    sampled = torch.zeros_like(kept).scatter_(-1, order, kept)
    greedy = torch.zeros_like(kept).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(temperature > 0, sampled, greedy)


def gumbel(seed: torch.Tensor, counter: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise, one per ``index``, from draw ``counter`` of the arena's stream."""
    return -torch.log(-torch.log(uniform(seed, counter, index)))


def draw(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """A token from ``probs [..., V]`` (need not sum to one) by Gumbel-max with ``noise [..., V]``."""
    return (probs.log() + noise).argmax(dim=-1)


def greedy_verdict(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [..., k+1], accepted [...])`` for drafts ``[..., k]`` and verifier logits ``[..., k+1, V]``.

    ``tokens[i]`` for ``i <= accepted`` are the emitted tokens: the accepted
    drafts, then the verifier's token after them.
    """
    targets = logits.argmax(dim=-1)
    accepted = (drafts == targets[..., :-1]).long().cumprod(dim=-1).sum(dim=-1)
    return targets, accepted


def rejection_verdict(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                      accept_uniforms: torch.Tensor, bonus_noise: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling: ``(tokens [..., k+1], accepted [...])``.

    ``drafts [..., k]`` drawn from ``draft_probs [..., k, V]`` (one-hot for a
    deterministic drafter); ``target_probs [..., k+1, V]`` the verifier's
    distributions (``sampling_probs``); ``accept_uniforms [..., k]`` in (0, 1);
    ``bonus_noise [..., V]`` Gumbel noise for the token after the accepted prefix.
    """
    p_draft = target_probs[..., :-1, :].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    q_draft = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    accept = accept_uniforms * q_draft < p_draft                   # probability min(1, p / q)
    accepted = accept.long().cumprod(dim=-1).sum(dim=-1)
    vocab = target_probs.shape[-1]
    q_padded = torch.cat((draft_probs, torch.zeros_like(draft_probs[..., :1, :])), dim=-2)
    residual = (target_probs - q_padded).clamp_min(0.0)             # row k: p_k itself
    pick = accepted[..., None, None].expand(*accepted.shape, 1, vocab)
    row = residual.gather(-2, pick).squeeze(-2)
    # p == q exactly leaves nothing to draw from; that row's draft is always accepted, but be safe
    row = torch.where(row.sum(dim=-1, keepdim=True) > 0, row, target_probs.gather(-2, pick).squeeze(-2))
    bonus = draw(row, bonus_noise)
    slots = torch.arange(drafts.shape[-1] + 1, device=drafts.device)
    padded = torch.cat((drafts, drafts[..., -1:]), dim=-1)
    tokens = torch.where(slots == accepted.unsqueeze(-1), bonus.unsqueeze(-1), padded)
    return tokens, accepted


def last_emitted(tokens: torch.Tensor, accepted: torch.Tensor, stop_ids: torch.Tensor,
                 limit: torch.Tensor) -> torch.Tensor:
    """Index of the last token the step emits: ``accepted``, cut at the first stop token and at ``limit``.

    ``stop_ids [S]`` (padding -1 never matches), ``limit`` >= 1 the tokens the
    request may still emit. Cutting *before* the state update makes the step end
    exactly where plain decoding would: the stop (or last allowed) token pending.
    """
    slots = torch.arange(tokens.shape[-1], device=tokens.device)
    is_stop = (tokens.unsqueeze(-1) == stop_ids).any(dim=-1) & (slots <= accepted.unsqueeze(-1))
    first_stop = torch.where(is_stop, slots, torch.full_like(slots, tokens.shape[-1])).amin(dim=-1)
    return torch.minimum(torch.minimum(accepted, first_stop), limit - 1)
