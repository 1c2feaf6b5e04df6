"""How a command stream arrives: rate, gaps between messages, staleness.

Why: the first thing a user checks on a robot is whether the controller gets
its commands at the control rate and without holes (``flashrt watch-commands``).
Gaps are measured between receipts (this machine's monotonic clock); staleness
is how old the latest command is when the report is made (a stopped stream
shows here first) and, for stamped messages (JointState, JointTrajectory), how
long after its header stamp a message arrived (same machine: same clock). No ROS
here: the CLI feeds receipt times and stamps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from flashrt_ros.engine.stats import percentile


@dataclass(frozen=True)
class StreamSummary:
    count: int
    span_s: float                     # first to last receipt
    rate_hz: float                    # (count - 1) / span_s; 0 with fewer than two messages
    gap_p50_ms: float
    gap_p99_ms: float
    gap_max_ms: float
    age_s: float                      # time since the latest receipt, at ``now``
    delay_p50_ms: float | None        # receipt - header stamp (None: no stamped message)
    delay_max_ms: float | None

    def line(self) -> str:
        """One line for a terminal."""
        if self.count == 0:
            return "no message" + (f" (latest {self.age_s:.1f} s ago)" if self.age_s != float("inf") else "")
        text = (f"{self.rate_hz:.1f} Hz ({self.count} in {self.span_s:.1f} s), gaps p50 {self.gap_p50_ms:.1f} ms "
                f"p99 {self.gap_p99_ms:.1f} ms max {self.gap_max_ms:.1f} ms, latest {self.age_s * 1e3:.0f} ms ago")
        if self.delay_p50_ms is not None:
            text += f", stamp to receipt p50 {self.delay_p50_ms:.1f} ms max {self.delay_max_ms:.1f} ms"
        return text


def summarize(receipts: Sequence[float], now: float, delays: Sequence[float] = (),
              before: float | None = None) -> StreamSummary:
    """``receipts``: monotonic receipt times (s), in order; ``delays``: receipt - stamp (s) of stamped
    ones; ``before``: the receipt just before these (a report window's), so the first gap counts too."""
    if not receipts:
        return StreamSummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, float("inf") if before is None else now - before,
                             None, None)
    times = ([before] if before is not None else []) + list(receipts)
    gaps = [(b - a) * 1e3 for a, b in zip(times, times[1:])] or [0.0]
    span = times[-1] - times[0]
    rate = len(gaps) / span if span > 0 else 0.0
    stamped = [d * 1e3 for d in delays]
    return StreamSummary(len(receipts), receipts[-1] - receipts[0], rate, percentile(gaps, 50),
                         percentile(gaps, 99), max(gaps, default=0.0), max(0.0, now - receipts[-1]),
                         percentile(stamped, 50) if stamped else None, max(stamped) if stamped else None)


class CommandGaps:
    """The gaps between the commands the control loop publishes while it steps, as the node reports them
    (``command_gap_max_ms`` / ``command_gap_p99_ms`` on ``~/status``): a tick that published nothing during a goal
    (stale inputs, a late plan) lengthens a gap; a loop that stops on purpose (no goal, paused) starts afresh."""

    def __init__(self, keep: int = 1000) -> None:
        from collections import deque
        self._last: float | None = None
        self.max_ms = 0.0
        self._recent: deque[float] = deque(maxlen=keep)

    def published(self, at_s: float) -> None:
        if self._last is not None:
            gap = (at_s - self._last) * 1e3
            self.max_ms = max(self.max_ms, gap)
            self._recent.append(gap)
        self._last = at_s

    def idle(self) -> None:
        """The loop does not step on purpose: the next command opens no gap."""
        self._last = None

    def p99_ms(self) -> float:
        return percentile(list(self._recent), 99) if self._recent else 0.0
