"""Spread of episode benchmarks: min / median / max, a bootstrap interval on a speed-up, steps over a period.

Why: a median of three episodes hides how much a side moves between episodes
(LeRobot's eager Diffusion bf16 episodes once measured 2660, 2665 and 1812 ms);
a speed-up needs an interval, and a controller cares about the share of steps
that miss its period, not only the median.
"""
from __future__ import annotations

import random
import statistics
from typing import Sequence

from flashrt_ros.engine.stats import percentile

#: control periods whose misses are counted: 50 Hz and 30 Hz
PERIODS_MS = {"20ms": 20.0, "33ms": 100.0 / 3}


def three_numbers(xs: Sequence[float]) -> dict[str, float]:
    """``{"min", "median", "max", "n"}`` of ``xs`` (NaN when empty)."""
    if not xs:
        nan = float("nan")
        return {"min": nan, "median": nan, "max": nan, "n": 0}
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def pct(xs: Sequence[float], q: float) -> float:
    return percentile(list(xs), q) if xs else float("nan")


def over_periods(times_ms: Sequence[float]) -> dict[str, float]:
    """Share of steps longer than each control period of ``PERIODS_MS``."""
    n = max(len(times_ms), 1)
    return {name: sum(t > period for t in times_ms) / n for name, period in PERIODS_MS.items()}


def bootstrap_ratio(numerator: Sequence[float], denominator: Sequence[float], reps: int = 2000,
                    level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """median(numerator) / median(denominator) and a percentile bootstrap interval on it.

    Each side's episodes are resampled with replacement, independently (the two
    sides are separate samples of episodes); ``level`` is the interval's coverage.
    """
    nan = float("nan")
    if not numerator or not denominator:
        return {"ratio": nan, "low": nan, "high": nan, "level": level, "reps": 0}
    rng = random.Random(seed)
    point = statistics.median(numerator) / statistics.median(denominator)
    ratios = sorted(statistics.median(rng.choices(numerator, k=len(numerator)))
                    / statistics.median(rng.choices(denominator, k=len(denominator))) for _ in range(reps))
    lo = ratios[int((1 - level) / 2 * (reps - 1))]
    hi = ratios[int((1 + level) / 2 * (reps - 1))]
    return {"ratio": point, "low": lo, "high": hi, "level": level, "reps": reps}
