"""π0.5's prompt, built on the device: the instruction's tokens, the discretised state as tokens, a fixed ending.

Why on the device: LeRobot's π0.5 preprocessor writes the normalised state into
the text, ``"Task: {task}, State: {b_1} {b_2} ... {b_n};\\nAction: "`` with
``b_i = digitize(state_i, 256 bins over [-1, 1)) - 1`` (so ``-1 .. 255``), and
tokenises the whole string every step. Doing that on the host would put a
device-to-host copy of the state into every replan, which a captured graph
cannot contain. A tokenizer that cuts the text at the spaces before the numbers
(and treats the numbers alone) gives the same tokens as three parts joined:

    tokens(head)  +  piece(b_1) + ... + piece(b_n)  +  tokens(ending)

``head`` is ``"Task: {task}, State:"`` (tokenised once per instruction, on the
host), ``piece(b)`` the tokens of ``" {b}"`` in that context (a table of 257
rows), the ending ``";\\nAction: "``. On the device a plan looks the bins up in
the table, places them with a cumulative sum and one scatter, and truncates to
the preprocessor's ``max_length`` as it does.

Whether the checkpoint's tokenizer splits that way is **checked, not assumed**:
the table is read from the tokenizer in context and the joined tokens are
compared with the tokenizer's own output for prompts holding every bin value
and random states (at load) and for each new instruction; a tokenizer that
merges across the parts is refused with ``InvalidArgument``.
"""
from __future__ import annotations

import random

import torch
from torch import Tensor, nn

from flashrt_ros.runtime.errors import InvalidArgument

BINS = 256
ENDING = ";\nAction: "
PROBE_TASK = "pick up the object"


def clean_task(task: str) -> str:
    """LeRobot's cleaning of the task text before it goes into the prompt."""
    return task.strip().replace("_", " ").replace("\n", " ")


def prompt_text(task: str, bins: list[int]) -> str:
    """The prompt LeRobot's ``Pi05PrepareStateTokenizerProcessorStep`` writes."""
    return f"Task: {clean_task(task)}, State: {' '.join(str(b) for b in bins)}{ENDING}"


def head_text(task: str) -> str:
    return f"Task: {clean_task(task)}, State:"


def bin_edges() -> Tensor:
    """``linspace(-1, 1, 257)[:-1]``: the edges ``(i - 128) / 128`` are exact in float32 and float64."""
    return (torch.arange(BINS, dtype=torch.float64) - BINS // 2) / (BINS // 2)


def state_bins(state: Tensor, edges: Tensor) -> Tensor:
    """``numpy.digitize(state, edges) - 1`` on the device: int64 in ``[-1, 255]``, compared in float64 as
    numpy compares float32 values with float64 edges."""
    return torch.bucketize(state.to(torch.float64), edges, right=True) - 1


def _common_suffix(rows: list[list[int]]) -> int:
    n = 0
    while all(len(r) > n for r in rows) and len({r[len(r) - 1 - n] for r in rows}) == 1:
        n += 1
    return n


class StatePrompt(nn.Module):
    """The token tables of π0.5's prompt and ``build`` (device ops only, capturable)."""

    def __init__(self, tokenizer, max_length: int, state_dim: int) -> None:
        super().__init__()
        self._tokenizer, self.max_length, self.state_dim = tokenizer, max_length, state_dim
        head = self._encode(head_text(PROBE_TASK))
        rests = []
        for b in range(-1, BINS):
            full = self._encode(prompt_text(PROBE_TASK, [b]))
            if full[: len(head)] != head:
                raise InvalidArgument(self._refusal(f"the tokens of {prompt_text(PROBE_TASK, [b])!r} do not start "
                                                    f"with those of {head_text(PROBE_TASK)!r}"))
            rests.append(full[len(head):])
        n_end = _common_suffix(rests)
        pieces = [r[: len(r) - n_end] for r in rests]
        if min(len(p) for p in pieces) == 0:
            raise InvalidArgument(self._refusal("a state number leaves no token of its own"))
        width = max(len(p) for p in pieces)
        self.register_buffer("piece_ids", torch.tensor([p + [0] * (width - len(p)) for p in pieces]),
                             persistent=False)
        self.register_buffer("piece_len", torch.tensor([len(p) for p in pieces]), persistent=False)
        self.register_buffer("ending", torch.tensor(rests[0][len(rests[0]) - n_end:], dtype=torch.int64),
                             persistent=False)
        self.register_buffer("edges", bin_edges(), persistent=False)
        self._pieces, self._ending = pieces, rests[0][len(rests[0]) - n_end:]
        self._check(PROBE_TASK, head, self._probe_states(every_value=True))

    # --- host side -------------------------------------------------------------------------------
    def head_ids(self, task: str) -> list[int]:
        """The instruction's part of the prompt (``"Task: ..., State:"``, special tokens included), checked
        to join with the state and ending tokens as the tokenizer itself would; truncated to ``max_length``."""
        head = self._encode(head_text(task))
        self._check(task, head, self._probe_states(every_value=False))
        return head[: self.max_length]

    def expected_ids(self, task: str, bins: list[int]) -> list[int]:
        """What the tokenizer makes of the whole prompt (truncated as LeRobot's preprocessor does)."""
        return self._encode(prompt_text(task, bins))[: self.max_length]

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def _probe_states(self, every_value: bool) -> list[list[int]]:
        n, values = self.state_dim, list(range(-1, BINS))
        rng = random.Random(0)
        probes = [[rng.choice(values) for _ in range(n)] for _ in range(4 if every_value else 2)]
        if every_value:                 # every value once, each next to its neighbours, and at both ends
            probes += [values[i: i + n] for i in range(0, len(values), n)]
            probes += [[b] * n for b in (-1, 0, 9, 10, 99, 100, 128, 255)]
        return probes

    def _check(self, task: str, head: list[int], probes: list[list[int]]) -> None:
        for bins in probes:
            joined = head + [t for b in bins for t in self._pieces[b + 1]] + self._ending
            if joined != self._encode(prompt_text(task, bins)):
                raise InvalidArgument(self._refusal(f"the prompt for task {task!r} and state bins {bins[:6]}... "
                                                    "tokenises differently from its parts"))

    @staticmethod
    def _refusal(why: str) -> str:
        return (f"π0.5 builds its prompt's state tokens on the device, which needs a tokenizer that splits the "
                f"prompt before each state number; this one does not: {why}")

    # --- device side -------------------------------------------------------------------------------
    def build(self, head: Tensor, head_len: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Prompt ids ``(max_length,)`` (zeros after the prompt) and its length, from the instruction's
        head ids ``(max_length,)`` / length and the normalised state ``(state_dim,)``."""
        dev, L = head.device, self.max_length
        rows = state_bins(state, self.edges) + 1                      # table rows 0 .. 256
        lens = self.piece_len[rows]
        ends = head_len + torch.cumsum(lens, 0)
        width = self.piece_ids.shape[1]
        capacity = L + self.state_dim * width + self.ending.numel() + 1
        dump = capacity - 1                                           # unused table columns land here
        out = torch.zeros(capacity, dtype=torch.int64, device=dev)
        out[:L] = head
        col = torch.arange(width, device=dev)
        where = torch.where(col[None, :] < lens[:, None], (ends - lens)[:, None] + col[None, :], dump)
        out.scatter_(0, where.flatten(), self.piece_ids[rows].flatten())
        out.scatter_(0, ends[-1] + torch.arange(self.ending.numel(), device=dev), self.ending)
        length = (ends[-1] + self.ending.numel()).clamp(max=L)
        ids = torch.where(torch.arange(L, device=dev) < length, out[:L], 0)
        return ids, length
