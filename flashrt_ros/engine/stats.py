"""Step latency statistics (p50/p99) for diagnostics.

Why a bounded window: the node reports current behaviour, not the history of
a long-running process, and a fixed deque costs nothing per step.
"""
from __future__ import annotations

import threading
from collections import deque


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
            items = {k: sorted(v) for k, v in self._samples.items()}
            counts = dict(self._counts)
        out = {}
        for kind, xs in items.items():
            if not xs:
                continue
            out[kind] = {
                "count": counts[kind],
                "p50_ms": 1e3 * _quantile(xs, 0.50),
                "p99_ms": 1e3 * _quantile(xs, 0.99),
                "mean_ms": 1e3 * sum(xs) / len(xs),
            }
        return out

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()
            self._counts.clear()


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted list."""
    idx = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[idx]
