"""The total time guard: skip a measurement that would not fit, and say so.

Estimates scale the last measured cost of the same kind to the new context
length (exponent 1.5: between the linear recurrent layers and the quadratic
attention ones), so the first context of each kind always runs.
"""
from __future__ import annotations

import time


class TimeBudget:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.start = time.perf_counter()
        self._last: dict[str, tuple[int, float]] = {}
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def estimate(self, kind: str, context: int) -> float:
        if kind not in self._last:
            return 0.0
        c0, s0 = self._last[kind]
        return s0 * (context / c0) ** 1.5

    def allows(self, kind: str, context: int, label: str) -> bool:
        """True if ``kind`` at ``context`` is expected to fit; else records a note."""
        need = self.estimate(kind, context)
        if need <= self.left():
            return True
        self.notes.append(f"skipped {label}: estimated {need:.0f} s > {max(self.left(), 0):.0f} s left "
                          f"of the {self.total_s:.0f} s budget")
        return False

    def record(self, kind: str, context: int, seconds: float) -> None:
        self._last[kind] = (context, seconds)
