"""Replanning in the node's log: how chunks are planned, and what became of the plans.

Why in the log: a user running ``flashrt serve`` watches its terminal, not
``/diagnostics``. With ``replan: async | rtc`` a plan that is late, or a queue
that runs dry before a plan lands, makes the robot hold its last command; the
log says so as it happens (a warning), with the planning delay and how long a
merged chunk lasts at it, so the user sees whether to lower the control rate or
plan faster. Quiet otherwise: one line on activate, then one line at most every
``period_s`` and only when plans ran since the last one.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

#: counters of PolicyEngine.replan_status() reported as "since the last line"
COUNTS = ("launched", "merged", "late", "held", "dropped")
#: those whose growth is a warning: a plan was not done when due, the robot held its last command
TROUBLE = ("late", "held")


def describe(replan: Mapping[str, Any]) -> str:
    """``async: delay 3 steps (plan p95 120.3 ms), a merged chunk lasts 47 steps`` (``sync`` alone)."""
    mode = str(replan.get("mode", ""))
    if "delay_steps" not in replan:
        return mode
    text = f"{mode}: delay {int(replan['delay_steps'])} steps"
    p95 = replan.get("turnaround_p95_ms")
    if p95 is not None and p95 == p95:                      # NaN before the first plan
        text += f" (plan p95 {float(p95):.1f} ms)"
    if "chunk_steps" in replan:
        text += f", a merged chunk lasts {int(replan['chunk_steps'])} steps"
    return text


class ReplanLog:
    """Feeds on the engine's ``replan_status()`` at every status publication; logs as described above."""

    def __init__(self, logger: Any, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self.period_s, self._clock = logger, period_s, clock
        self._last: dict[str, int] | None = None       # the counters at the last line
        self._last_at = 0.0
        self._lock = threading.Lock()                  # status is published from several threads

    def started(self, replan: Mapping[str, Any]) -> None:
        """The activate line: the mode (and for plans beside the loop, how late plans are handled)."""
        if not replan.get("mode"):
            return
        self._last, self._last_at = _counts(replan), self._clock()
        self._logger.info(f"replan {describe(replan)}")

    def update(self, replan: Mapping[str, Any]) -> None:
        with self._lock:
            self._update(replan)

    def _update(self, replan: Mapping[str, Any]) -> None:
        if self._last is None or "delay_steps" not in replan:
            return                                      # not started, or sync: nothing runs beside the loop
        now, counts = self._clock(), _counts(replan)
        delta = {k: counts[k] - self._last.get(k, 0) for k in COUNTS}
        trouble = any(delta[k] > 0 for k in TROUBLE)
        if not any(delta.values()) or (now - self._last_at < self.period_s):
            return
        self._last, self._last_at = counts, now
        since = ", ".join(f"{delta[k]} {'held steps' if k == 'held' else k}" for k in COUNTS)
        line = f"replan {describe(replan)}; since the last report: {since}"
        if trouble:
            self._logger.warning(line + " (a late plan makes the robot hold its last command, or the step "
                                 "wait with replan_late: wait: lower the control rate, or plan faster)")
        else:
            self._logger.info(line)


def _counts(replan: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(replan.get(k, 0) or 0) for k in COUNTS}
