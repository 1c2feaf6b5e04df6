"""Step latency statistics (p50/p99) for diagnostics, and the one percentile rule of the project.

Why a bounded window: the node reports current behaviour, not the history of
a long-running process, and a fixed deque costs nothing per step.

Why one ``percentile``: engines, benchmarks and reports all quote p50/p99; with
one rank rule (nearest rank) their numbers are comparable.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from typing import Iterable


class LatencyStats:
    """Keeps the last ``window`` durations per step kind."""

    def __init__(self, window: int = 1024) -> None:
        self.window = window
        self._samples: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._samples.setdefault(kind, deque(maxlen=self.window)).append(seconds)
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def summary(self) -> dict[str, dict[str, float]]:
        """``{kind: {count, p50_ms, p99_ms, mean_ms}}`` over the window (count is all-time)."""
        with self._lock:
            items = {k: list(v) for k, v in self._samples.items()}
            counts = dict(self._counts)
        out = {}
        for kind, xs in items.items():
            if not xs:
                continue
            out[kind] = {
                "count": counts[kind],
                "p50_ms": 1e3 * percentile(xs, 50),
                "p99_ms": 1e3 * percentile(xs, 99),
                "mean_ms": 1e3 * sum(xs) / len(xs),
            }
        return out

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()
            self._counts.clear()


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (``q`` in 0..100) of ``values``, in any order; NaN if empty.

    The smallest value with at least ``q`` percent of the values at or below it:
    always one of the samples, never an interpolation.
    """
    xs = sorted(values)
    if not xs:
        return float("nan")
    rank = math.ceil(q / 100 * len(xs))
    return float(xs[min(len(xs), max(rank, 1)) - 1])
