"""Speculative decoding's step bodies: verify ``k`` drafts and the pending token in one forward, keep
what the verdict accepts, and draft the next ``k`` -- all inside one captured step.

Why one step: every piece is fixed-shape device work (the verification forward
over ``k+1`` tokens, the verdict, the gather of the accepted recurrent and conv
state from ``VerifyScratch``, the drafter), so a whole speculative step is one
CUDA graph and one host read (the emitted tokens). Rejected tokens need no undo
outside the step: attention KV rows past the new position are never read, and
the Gated DeltaNet state is picked from the per-token states the verification
kept (``models.hybrid.verification``), not recomputed.

What the arena holds besides the model's state (so capsules and rollbacks cover
it): ``spec.drafts`` and ``spec.draft_probs``, the drafts for the positions after
the pending token and the distributions they were drawn from (the next verdict
needs both), and the drafter's own state (the MTP head's KV cache and
``mtp.hidden``). Every emitting step drafts, so a boundary always holds drafts
for its pending token. Stop ids and the token limit are step *inputs* (like the
prefill feed buffer), the emitted tokens a step *output*: fixed buffers outside
the arena.

Randomness: a verification at rng counter ``c`` draws its residual or bonus
token with the stream indices a plain draw uses (``0 .. V-1``) and its
acceptance uniforms at ``V .. V+k-1``; the counter then advances by the number
of emitted tokens (so greedy speculation leaves it where plain decoding would),
and only then are the next drafts drawn, draft ``j`` at ``(2+j)V ..`` of the
advanced counter -- the counter of the verification that will judge them,
whose own draws use other indices. Drafting before the advance reused the
noise of the drafts just judged (after a plain step, both were drawn at the
same counter): a new draft then tended to repeat an accepted one, and the
output was biased (``test/test_speculative_sampling_power.py``).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from flashrt_ros.engine.drafters import Choose, Drafter, DraftStep
from flashrt_ros.engine.speculation import (MAX_STOP_IDS, draw, greedy_verdict, gumbel, last_emitted,
                                            rejection_verdict, sampling_probs)
from flashrt_ros.engine.state import (HAS_PENDING, LAST_TOKEN, LOGITS, PENDING, RNG_COUNTER, RNG_SEED,
                                      TEMPERATURE, TOKENS, TOP_K, TOP_P)
from flashrt_ros.ops.counter_rng import uniform
from flashrt_ros.runtime.arena import POSITION, BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument

DRAFTS = "spec.drafts"
DRAFT_PROBS = "spec.draft_probs"
GROUP = "speculation"
MAX_SPECULATIVE_TOKENS = 8


def check_speculative_model(model: torch.nn.Module) -> None:
    """Refuse a model without the verification forward (today: the hybrid decoder has it)."""
    needed = ("hidden_states", "logits", "verify_scratch")
    if not all(callable(getattr(model, name, None)) for name in needed):
        raise InvalidArgument(f"speculative decoding needs a model with a verification forward "
                              f"({', '.join(needed)}): the hybrid (Qwen3-Next) decoder; "
                              f"{type(model).__name__} has none")


def speculation_state_specs(tokens: int, vocab_size: int) -> list[BufferSpec]:
    """The engine's speculation buffers (the drafter declares its own)."""
    return [
        BufferSpec(DRAFTS, (tokens,), torch.int64, group=GROUP,
                   doc="draft tokens for the positions after the pending token"),
        BufferSpec(DRAFT_PROBS, (tokens, vocab_size), torch.float32, group=GROUP,
                   doc="the distribution each draft was drawn from (one-hot when chosen greedily)"),
    ]


class SpeculativeDecoding:
    """The step bodies and step I/O buffers of speculative decoding with ``tokens`` drafts per step.

    Host-side counters (``drafted``, ``accepted``, ``steps``) are statistics, not
    state: they are not in capsules.
    """

    def __init__(self, model: torch.nn.Module, arena: StateArena, drafter: Drafter, tokens: int) -> None:
        if not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidArgument(f"speculative_tokens must be in 0..{MAX_SPECULATIVE_TOKENS} (got {tokens})")
        check_speculative_model(model)
        self.model, self.arena, self.drafter, self.tokens = model, arena, drafter, tokens
        device = arena.device
        vocab = model.vocab_size
        self.scratch = model.verify_scratch(tokens + 1)
        self.stop_ids = torch.full((MAX_STOP_IDS,), -1, dtype=torch.int64, device=device)
        self.limit = torch.ones((), dtype=torch.int64, device=device)
        self.out = torch.zeros(tokens + 2, dtype=torch.int64, device=device)   # tokens [k+1], then the last index
        self._slots = torch.arange(tokens + 1, device=device)
        self._vocab_ids = torch.arange(vocab, device=device)
        self._accept_ids = vocab + torch.arange(tokens, device=device)
        self._two = torch.full((), 2, dtype=torch.int64, device=device)
        self._stops: tuple[int, ...] = ()
        self.drafted = self.accepted = self.steps = 0

    # ------------------------------------------------------------------ inputs and outputs
    def set_stops(self, stops: Iterable[int]) -> bool:
        """Write the request's stop ids for the in-step cut; False (nothing written) if there are too many."""
        stops = tuple(sorted(set(int(s) for s in stops)))
        if len(stops) > MAX_STOP_IDS:
            return False
        if stops != self._stops:
            padded = list(stops) + [-1] * (MAX_STOP_IDS - len(stops))
            self.stop_ids.copy_(torch.tensor(padded, dtype=torch.int64))
            self._stops = stops
        return True

    def read_output(self) -> list[int]:
        """The tokens the last verification step emitted (one device read)."""
        values = self.out.tolist()
        return values[:values[-1] + 1]

    def count(self, emitted: list[int]) -> None:
        """Add a committed verification step to the counters."""
        self.steps += 1
        self.drafted += self.tokens
        self.accepted += len(emitted) - 1

    def status(self) -> dict[str, Any]:
        """The counters as ``LLMEngine.status()["speculation"]`` reports them (``{"tokens": 0}`` when off)."""
        return {"tokens": self.tokens, "drafter": self.drafter.name, "steps": self.steps,
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0}

    # ------------------------------------------------------------------ bodies (capturable)
    def observe_prefill(self, hidden: torch.Tensor, ids: torch.Tensor, start: torch.Tensor, first: bool) -> None:
        self.drafter.observe_prefill(self.arena, hidden, ids, start, first)

    def after_draw(self, greedy: bool) -> None:
        """The first token was drawn (nothing consumed): draft after it."""
        a = self.arena
        self._propose(DraftStep(None, a[PENDING].view(1), a[POSITION] - 1, None), greedy)

    def after_decode(self, hidden: torch.Tensor, greedy: bool) -> None:
        """One token was consumed (``hidden [1, H]``) and the next drawn: draft after it."""
        a = self.arena
        following = torch.stack((a[LAST_TOKEN], a[PENDING]))
        self._propose(DraftStep(hidden, following, a[POSITION] - self._two, torch.zeros_like(a[POSITION])), greedy)

    def verify(self, greedy: bool) -> None:
        """Feed the pending token and the drafts, keep the accepted prefix, draft again."""
        a, model = self.arena, self.model
        drafts = a[DRAFTS]
        feed = torch.cat((a[PENDING].view(1), drafts))
        start = a[POSITION] - 1
        positions = a[POSITION] + self._slots
        a[TOKENS].index_copy_(0, positions, feed)          # rows past the kept ones are past the position
        hidden = model.hidden_states(feed, positions, a, scratch=self.scratch)
        logits = model.logits(hidden)
        if greedy:
            tokens, accepted = greedy_verdict(drafts, logits)
        else:
            seed, counter = a[RNG_SEED], a[RNG_COUNTER]
            target = sampling_probs(logits, a[TEMPERATURE], a[TOP_K], a[TOP_P])
            tokens, accepted = rejection_verdict(drafts, a[DRAFT_PROBS], target,
                                                 uniform(seed, counter, self._accept_ids),
                                                 gumbel(seed, counter, self._vocab_ids))
        last = last_emitted(tokens, accepted, self.stop_ids, self.limit)
        index = last.view(1)
        self.scratch.keep_prefix(a, last)                  # the rollback of recurrent and conv state
        a[LOGITS].copy_(logits.index_select(0, index).squeeze(0))
        a[LAST_TOKEN].copy_(feed.index_select(0, index).squeeze(0))
        a[PENDING].copy_(tokens.index_select(0, index).squeeze(0))
        a[HAS_PENDING].fill_(1)
        a[POSITION].add_(last + 1)
        self.out[:-1].copy_(tokens)
        self.out[-1].copy_(last)
        a[RNG_COUNTER].add_(last + 1)          # before drafting: see the module's "Randomness"
        self._propose(DraftStep(hidden, torch.cat((feed[:1], tokens)), start, last), greedy)

    def _propose(self, step: DraftStep, greedy: bool) -> None:
        drafts, probs = self.drafter.propose(self.arena, step, self.tokens, self._chooser(greedy))
        self.arena[DRAFTS].copy_(drafts)
        self.arena[DRAFT_PROBS].copy_(probs)

    def _chooser(self, greedy: bool) -> Choose:
        a = self.arena

        def choose(logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
            row = logits[0]
            if greedy:
                token = row.argmax()
                return token, torch.zeros_like(row).scatter_(0, token.view(1), 1.0)
            probs = sampling_probs(row, a[TEMPERATURE], a[TOP_K], a[TOP_P])
            noise = gumbel(a[RNG_SEED], a[RNG_COUNTER], (2 + j) * self._vocab_ids.shape[0] + self._vocab_ids)
            return draw(probs, noise), probs
        return choose
