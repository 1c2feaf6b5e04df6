"""Double-buffered pinned host inputs: a plan's observation reaches the device without the control step waiting.

Why: a launch step beside the loop (``replan: async | rtc``) used to copy the step's
observation (host tensors) into the planner's device inputs on the control
thread; from pageable host memory such a copy blocks the host until the data
are staged (SmolVLA's three 256x256 cameras: 2.4 MB), which is where the H100's
1-2 ms launch steps went. Here the control thread only copies the observation
into one of two pinned host buffers (a memcpy), and the device copy is queued
on the planner's side stream, behind nothing but the step that launched it. The
two buffers alternate, so a launch never overwrites the buffer whose device copy
may still be queued; an event per buffer says when its copy is done.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch


class PinnedInputs:
    """Two sets of pinned host buffers (one per input) and the event of each set's last device copy."""

    def __init__(self, like: Mapping[str, torch.Tensor]) -> None:
        self.sets = [{name: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for name, t in like.items()}
                     for _ in range(2)]
        self._copied: list[Any] = [None, None]
        self._next = 0

    def stage(self, inputs: Mapping[str, torch.Tensor]) -> int:
        """Copy host ``inputs`` into the next set (waiting, in the rare case, for that set's last device
        copy); returns the set's index. Device-resident inputs are not staged (``copy_to`` reads them)."""
        k, self._next = self._next, self._next ^ 1
        if self._copied[k] is not None:
            self._copied[k].synchronize()         # queued a launch ago: done long since
        for name, value in inputs.items():
            if value.device.type == "cpu":
                self.sets[k][name].copy_(value)
        return k

    def copy_to(self, k: int, inputs: Mapping[str, torch.Tensor], device_inputs: Mapping[str, torch.Tensor],
                stream: torch.cuda.Stream) -> None:
        """Queue set ``k``'s device copies on ``stream`` (the caller is inside ``torch.cuda.stream(stream)``)."""
        for name, value in inputs.items():
            source = self.sets[k][name] if value.device.type == "cpu" else value
            if value.device.type != "cpu":
                value.record_stream(stream)        # the caller's device tensor lives until the copy ran
            device_inputs[name].copy_(source, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        self._copied[k] = event
