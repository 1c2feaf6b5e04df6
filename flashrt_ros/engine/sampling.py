"""Token sampling whose whole random state is two int64 scalars in the arena.

Why counter-based: a stateful generator (``torch.Generator``) lives outside the
arena, so a capsule could not capture it and a restored run would draw other
numbers. Here every draw is a pure function of ``(seed, counter, vocab index)``
(``flashrt_ros.ops.counter_rng``, shared with the policies' noise), so restoring the two
scalars restores the stream exactly, and the step stays capturable: no host
sync, no data-dependent shapes, temperature/top-k/top-p read from tensors.

Sampling is Gumbel-max over the kept set: ``argmax(logits / T + G)`` with
``G = -log(-log(U))`` draws a token with probability ``softmax(logits / T)``
restricted (and renormalised) to the top-k / top-p set.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashrt_ros.ops.counter_rng import uniform
from flashrt_ros.runtime.errors import InvalidArgument

@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, validated on construction (``InvalidArgument``).

    ``temperature`` finite and >= 0 (0 is greedy); ``top_k`` >= 0 (0 disables);
    ``top_p`` finite in (0, 1] (1 disables). ``seed=None`` keeps the engine's
    current random stream (continuing it); a seed (any uint64, or a negative
    int64) restarts the stream at counter 0. Constructing the object is the
    whole check, so an engine can refuse a request before it writes anything.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise InvalidArgument(f"temperature must be a finite number >= 0 (got {self.temperature!r})")
        if not isinstance(self.top_p, (int, float)) or not math.isfinite(self.top_p) \
                or not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument(f"top_p must be in (0, 1] (got {self.top_p!r})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k < 1 << 62:
            raise InvalidArgument(f"top_k must be an integer >= 0 (got {self.top_k!r})")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -(1 << 63) <= self.seed < 1 << 64):
            raise InvalidArgument(f"seed must be a uint64 (or int64) integer (got {self.seed!r})")

    @property
    def seed_int64(self) -> int | None:
        """The seed as the arena stores it: a uint64 reinterpreted as int64 (two's complement)."""
        if self.seed is None:
            return None
        return self.seed - (1 << 64) if self.seed >= 1 << 63 else self.seed

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of ``logits [V]`` as an int64 scalar tensor (first index on ties)."""
    return logits.argmax(dim=-1)


def sample_token(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One token id (int64 scalar tensor) from ``logits [V]``; greedy where ``temperature == 0``."""
    vocab = logits.shape[-1]
    scaled = logits.float() / temperature.clamp_min(1e-6)
    values, order = scaled.sort(descending=True)
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp_max(vocab), torch.full_like(top_k, vocab))
    values = values.masked_fill(rank >= k, float("-inf"))
    probs = values.softmax(dim=-1)
    keep = (probs.cumsum(dim=-1) - probs) < top_p           # the most likely token is always kept
    noise = -torch.log(-torch.log(uniform(seed, counter, order)))
    score = torch.where(keep, values + noise, torch.full_like(values, float("-inf")))
    # gather, not order[idx]: indexing with a 0-d tensor syncs to the host (breaks capture)
    sampled = order.gather(0, score.argmax(dim=-1, keepdim=True)).squeeze(0)
    return torch.where(temperature > 0, sampled, greedy_token(logits))
