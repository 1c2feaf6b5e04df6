"""A per-tick timeline of the control path, Python GC pauses and plans, to find what stalls a command.

Why: a robot sees the gaps between commands on its topic; a gap has a cause
inside the node (the tick woke late: the OS, the executor or the GIL; the inputs
took long; the step took long: a replan; a GC pause held the interpreter; the
publish blocked). Each tick records monotonic times (``time.monotonic``) of its
phases into preallocated arrays, so recording allocates nothing and costs a few
microseconds; ``gc.callbacks`` records every collection (generation, duration,
thread). ``dump`` writes them as JSON for ``benchmarks.robot_rate``'s analysis.

Enabled in a node by the environment variable ``FLASHRT_CONTROL_TIMELINE`` (a file
path, written when the loop stops); a diagnostic, not a parameter.
"""
from __future__ import annotations

import gc
import json
import os
import threading
import time
from typing import Any

import numpy as np

ENV = "FLASHRT_CONTROL_TIMELINE"
#: the columns of one tick: when it was due, when the control thread ran, inputs taken and converted,
#: the engine step done, the command published
PHASES = ("due", "wake", "taken", "converted", "stepped", "published")


class ControlTimeline:
    """Preallocated per-tick marks (``PHASES``), GC pauses and plan spans; thread-safe enough for one writer each."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.ticks = np.full((capacity, len(PHASES)), np.nan)
        self.n = 0
        self.gc = np.full((capacity, 3), np.nan)        # start, end, generation
        self.gc_threads = [""] * capacity
        self.n_gc = 0
        self.plans = np.full((capacity, 2), np.nan)     # start, end of each plan beside the loop
        self.n_plans = 0
        self._gc_start = 0.0
        self._row = np.full(len(PHASES), np.nan)
        self._installed = False

    # --- ticks ----------------------------------------------------------------------------------
    def mark(self, phase: int, t: float | None = None) -> None:
        """Record phase ``phase`` (an index of ``PHASES``) of the tick in progress."""
        self._row[phase] = time.monotonic() if t is None else t

    def end_tick(self) -> None:
        """Close the tick in progress (one that did not publish leaves ``published`` NaN)."""
        if self.n < len(self.ticks):
            self.ticks[self.n] = self._row
            self.n += 1
        self._row[:] = np.nan

    def plan(self, start: float, end: float) -> None:
        if self.n_plans < len(self.plans):
            self.plans[self.n_plans] = (start, end)
            self.n_plans += 1

    # --- garbage collection -------------------------------------------------------------------------
    def install(self) -> None:
        """Record every garbage collection from now on (``gc.callbacks``)."""
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        elif self.n_gc < len(self.gc):
            self.gc[self.n_gc] = (self._gc_start, time.monotonic(), info.get("generation", -1))
            self.gc_threads[self.n_gc] = threading.current_thread().name
            self.n_gc += 1

    # --- output ---------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {"phases": list(PHASES), "ticks": self.ticks[:self.n].tolist(),
                "gc": [[*row, name] for row, name in zip(self.gc[:self.n_gc].tolist(), self.gc_threads)],
                "plans": self.plans[:self.n_plans].tolist()}

    def dump(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.as_dict(), f)
        os.replace(tmp, path)


def from_environment() -> ControlTimeline | None:
    """A timeline if ``FLASHRT_CONTROL_TIMELINE`` names a file, else None (nothing recorded)."""
    return ControlTimeline() if os.environ.get(ENV) else None
