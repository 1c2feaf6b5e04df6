"""Optional CUDA-graph replay of engine step bodies.

Why it is safe here: a step body reads and writes only arena buffers and
static inputs, so its addresses never change; capsule restores copy bytes into
those same addresses, so a graph captured once stays valid across snapshots,
restores and rollbacks. Warm-up runs the body for real, so the arena's single
block is saved before and copied back after each warm-up run and after capture:
capturing changes no state.

All runners of an engine share one graph memory pool: steps run one at a time
on one stream and keep nothing outside the arena, so their scratch memory can
be the same bytes.
"""
from __future__ import annotations

from typing import Callable

import torch

from flashrt_ros.runtime.arena import StateArena


class StepRunner:
    """Runs a step body eagerly, or (CUDA, ``enabled``) as a graph captured on first use."""

    def __init__(self, body: Callable[[], None], arena: StateArena, *, enabled: bool,
                 pool: tuple[int, int] | None = None) -> None:
        self.body = body
        self.arena = arena
        self.enabled = enabled and arena.device.type == "cuda"
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if not self.enabled:
            self.body()
            return
        if self.graph is None:
            self.graph = self._capture()
        self.graph.replay()

    def capture(self) -> int:
        """Capture now if enabled and not yet captured; returns 1 if it captured, else 0."""
        if not self.enabled or self.graph is not None:
            return 0
        self.graph = self._capture()
        return 1

    def _capture(self) -> torch.cuda.CUDAGraph:
        saved = self.arena.block.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):          # each warm-up starts from the same state: a prefill body
                self.body()             # advances the position, a second one from there could
                self.arena.block.copy_(saved)       # run past max_context
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.body()
        self.arena.block.copy_(saved)
        torch.cuda.current_stream().synchronize()
        return graph


def chunk_lengths(n: int, max_chunk: int) -> list[int]:
    """How a feed of ``n`` tokens is cut into prefill steps: chunks of ``max_chunk``, then the
    remainder as descending powers of two.

    Why powers of two: with graphs every distinct length is a graph, so at most
    ``log2(max_chunk) + 2`` lengths ever occur. The cut is the same with and
    without graphs and on every device, so boundaries (and the chunked
    recurrent arithmetic, which depends on where chunks split) never depend on
    how the engine runs.
    """
    full, rest = divmod(n, max_chunk)
    lengths = [max_chunk] * full
    bit = 1 << max(rest.bit_length() - 1, 0)
    while rest:
        if rest & bit:
            lengths.append(bit)
            rest -= bit
        bit >>= 1
    return lengths


def prefill_lengths(max_chunk: int) -> list[int]:
    """Every chunk length ``chunk_lengths`` can produce for ``max_chunk``, ascending."""
    powers = [1 << i for i in range(max_chunk.bit_length()) if 1 << i < max_chunk]
    return powers + [max_chunk]
