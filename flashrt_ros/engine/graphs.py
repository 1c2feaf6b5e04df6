"""Optional CUDA-graph replay of engine step bodies.

Why it is safe here: a step body reads and writes only arena buffers and
static inputs, so its addresses never change; capsule restores copy bytes into
those same addresses, so a graph captured once stays valid across snapshots,
restores and rollbacks. Warm-up runs the body for real, so the arena's single
block is saved before and copied back after capture: capturing changes no state.
"""
from __future__ import annotations

from typing import Callable

import torch

from flashrt_ros.runtime.arena import StateArena


class StepRunner:
    """Runs a step body eagerly, or (CUDA, ``enabled``) as a graph captured on first use."""

    def __init__(self, body: Callable[[], None], arena: StateArena, *, enabled: bool) -> None:
        self.body = body
        self.arena = arena
        self.enabled = enabled and arena.device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if not self.enabled:
            self.body()
            return
        if self.graph is None:
            self.graph = self._capture()
        self.graph.replay()

    def _capture(self) -> torch.cuda.CUDAGraph:
        saved = self.arena.block.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.body()
        self.arena.block.copy_(saved)
        torch.cuda.current_stream().synchronize()
        return graph
