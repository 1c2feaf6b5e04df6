"""Drafters of speculative decoding: who proposes the next ``k`` tokens for the verifier.

Why an interface: the verifier's rules (``engine.speculation``) and the rollback
of the hybrid state do not depend on how drafts are made. ``MTPDrafter`` is the
real one (Qwen3-Next's multi-token-prediction head, state in the arena);
``OracleDrafter`` proposes a scripted continuation with errors where told, so
tests reach every accept / reject / rollback path on purpose and benchmarks run
at a controlled acceptance rate.

A drafter runs inside the engine's captured steps: fixed shapes, device tensors
only, no host reads. The step tells it what was consumed (``DraftStep``); it
returns ``k`` tokens and the distributions they were drawn from (one-hot for a
deterministic choice), which the engine keeps in the arena for the next verdict.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument

#: ``choose(logits [1, V], j) -> (token 0-d int64, probs [V])``: how the engine turns draft ``j``'s
#: logits into a token (argmax, or a draw under the request's sampling settings).
Choose = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DraftStep:
    """What a step consumed, for the drafter to catch up and propose from.

    The step consumed ``m >= 0`` tokens at positions ``start+1 .. start+m``
    (``hidden [m, H]``: the main model's final normed hidden states, None when
    ``m == 0``, a first-token draw). ``following [m+1]`` is the token after each
    position ``start .. start+m`` (the consumed ones, then the new pending
    token); rows past ``kept`` (a rejected verification's tail) are garbage.
    ``kept`` (0-d int64, None when ``m == 0``) indexes the last consumed token
    that stays, so the pending token sits at ``start + kept + 2``.
    """

    hidden: torch.Tensor | None
    following: torch.Tensor
    start: torch.Tensor
    kept: torch.Tensor | None


class Drafter(ABC):
    """Proposes draft tokens inside captured steps; may keep state in the arena."""

    name: str = "drafter"

    def state_specs(self, max_context: int, tokens: int) -> list[BufferSpec]:
        """Arena buffers of the drafter's own state, for ``tokens`` drafts per step."""
        return []

    def observe_prefill(self, arena: StateArena, hidden: torch.Tensor, ids: torch.Tensor,
                        start: torch.Tensor, first: bool) -> None:
        """A prefill chunk ``ids [t]`` was consumed at positions ``start ..`` (``first``: start is 0)."""

    @abstractmethod
    def propose(self, arena: StateArena, step: DraftStep, tokens: int, choose: Choose,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(drafts [tokens] int64, probs [tokens, V] float32)`` for the positions after the pending token."""


class MTPDrafter(Drafter):
    """Qwen3-Next's MTP head as drafter (``HybridCausalLM.mtp``).

    The head's row for position ``p`` needs the main model's hidden state at ``p``
    and the token at ``p+1``, so it lags the main model by one row: after every
    step its KV cache holds the rows below ``position - 1`` and ``mtp.hidden``
    the main model's hidden state at ``position - 1``; the next step that
    consumes tokens (or draws the first one) computes that row first. Row
    ``position - 1`` itself may hold draft-time values at a boundary: it is
    always rewritten before it is read, so restores and rollbacks stay exact.
    """

    name = "mtp"

    def __init__(self, model: torch.nn.Module) -> None:
        if getattr(model, "mtp", None) is None:
            raise InvalidArgument("the MTP drafter needs a model loaded with its multi-token-prediction head "
                                  "(a Qwen3-Next checkpoint with mtp.* weights, or random-hybrid-tiny)")
        self.model = model
        self._hidden = model.mtp.hidden_buffer
        self._device = model.embed_tokens.weight.device
        self._aranges: dict[int, torch.Tensor] = {}      # filled on a step's eager warm-up, before capture

    def state_specs(self, max_context: int, tokens: int) -> list[BufferSpec]:
        # draft rows run up to ``tokens - 1`` rows past the last position a step may reach
        return self.model.mtp_state_specs(max_context + tokens)

    def observe_prefill(self, arena: StateArena, hidden: torch.Tensor, ids: torch.Tensor,
                        start: torch.Tensor, first: bool) -> None:
        if first:           # nothing before position 0: rows 0 .. t-2, the last one waits for its next token
            if ids.shape[0] > 1:
                self.model.mtp_hidden(hidden[:-1], ids[1:], self._positions(start, ids.shape[0] - 1), arena)
        else:               # the row left over at start-1, then rows start .. start+t-2
            rows = torch.cat((arena[self._hidden].unsqueeze(0), hidden[:-1]))
            self.model.mtp_hidden(rows, ids, self._positions(start - 1, ids.shape[0]), arena)
        arena[self._hidden].copy_(hidden[-1])

    def propose(self, arena: StateArena, step: DraftStep, tokens: int, choose: Choose,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = arena[self._hidden].unsqueeze(0)
        if step.hidden is not None:
            rows = torch.cat((rows, step.hidden))
        out = self.model.mtp_hidden(rows, step.following, self._positions(step.start, rows.shape[0]), arena)
        pick = step.kept + 1 if step.kept is not None else torch.zeros_like(step.start)
        if step.hidden is not None:
            arena[self._hidden].copy_(step.hidden.index_select(0, step.kept.view(1)).squeeze(0))
        h = out.index_select(0, pick.view(1))                            # predicts the token after the pending one
        position = step.start + pick                                      # that row's position
        drafts, probs = [], []
        for j in range(tokens):
            token, p = choose(self.model.logits(h), j)
            drafts.append(token)
            probs.append(p)
            if j + 1 < tokens:         # the head again, its own output standing in for the hidden state
                h = self.model.mtp_hidden(h, token.view(1), (position + 1 + j).view(1), arena)
        return torch.stack(drafts), torch.stack(probs)

    def _positions(self, start: torch.Tensor, n: int) -> torch.Tensor:
        rows = self._aranges.get(n)
        if rows is None:
            rows = self._aranges[n] = torch.arange(n, device=self._device)
        return start + rows


class OracleDrafter(Drafter):
    """Proposes a scripted transcript (``script[p]`` for position ``p``), wrong where ``wrong[p]``.

    For tests and benchmarks only: with the script set to the verifier's own
    continuation, every correct draft is accepted (greedy), and a wrong one
    (``script[p] + 1`` mod vocab) is rejected, so acceptance patterns are chosen,
    not hoped for. Positions past the script propose token 0. The script lives
    in fixed buffers outside the arena (it is an input, like a prompt): change
    it with ``set_script`` between requests, never during one.
    """

    name = "oracle"

    def __init__(self, vocab_size: int, capacity: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.script = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.wrong = torch.zeros(capacity, dtype=torch.bool, device=device)
        self._offsets = torch.arange(1, 65, device=device)

    def set_script(self, tokens: Sequence[int], wrong_positions: Sequence[int] = ()) -> None:
        """The transcript to propose, by absolute position, and the positions to get wrong."""
        capacity = self.script.shape[0]
        if len(tokens) > capacity:
            raise InvalidArgument(f"script of {len(tokens)} tokens exceeds the capacity {capacity}")
        if any(not 0 <= p < capacity for p in wrong_positions):
            raise InvalidArgument(f"wrong positions must be in 0..{capacity - 1}")
        self.script.zero_()
        self.wrong.zero_()
        self.script[:len(tokens)].copy_(torch.as_tensor(list(tokens), dtype=torch.int64))
        if len(wrong_positions):
            self.wrong[torch.as_tensor(list(wrong_positions), dtype=torch.int64)] = True

    def propose(self, arena: StateArena, step: DraftStep, tokens: int, choose: Choose,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        pending = step.start + 1 + (step.kept + 1 if step.kept is not None else 0)
        where = (pending + self._offsets[:tokens]).clamp_max(self.script.shape[0] - 1)
        scripted = self.script.index_select(0, where)
        drafts = torch.where(self.wrong.index_select(0, where), (scripted + 1) % self.vocab_size, scripted)
        probs = torch.zeros(tokens, self.vocab_size, device=drafts.device).scatter_(1, drafts.unsqueeze(1), 1.0)
        return drafts, probs
