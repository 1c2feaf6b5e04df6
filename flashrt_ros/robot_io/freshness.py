"""The inputs of one control tick, taken together, and the stale-data rule.

Why: a policy stepped on a dead sensor's last frame keeps commanding the robot
as if nothing happened. So every tick takes the *latest* sample of every
required input and refuses to step when

* an input has never arrived, or
* an input's latest sample was received more than its age limit ago
  (receipt time on this machine's monotonic clock: no clock sync needed), or
* the samples do not belong together: their capture stamps (the header stamp
  where the message has one, else the receipt time) spread over more than
  ``sync_tolerance_s`` (0 = no such check).

The age limit is ``max_age_s`` when one is given. Without one (0) it is derived
per input so that it flags only data that really are late: 2.5 control
periods, or 2.5 of the input's own measured period (the median interval
between its last 32 receipts) when that is longer; before an input's second
sample, 2.5 control periods or 0.5 s. A fixed 1.5 control periods flapped stale
with sensors at the control rate: one frame later than half a period stopped
the robot. No derived limit exceeds ``ceiling_s``: a camera degrading from 30 to
1 Hz used to be accepted with 2.5 s-old frames once its median interval had
followed it down (about 17 slow intervals); with the ceiling it stops the
policy instead.

With ``require_new`` a tick also waits until every input has a sample it has
not stepped on yet (lock-step with a simulator: one step per observation).
Thread-safe: subscriptions put, the control tick takes.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

#: the derived age limit, in control periods and in measured input periods
AGE_PERIODS = 2.5
#: the derived limit of an input whose period is not measured yet (one sample) is at least this
UNMEASURED_AGE_S = 0.5
#: no derived limit exceeds this (the ``max_observation_age_ceiling_s`` parameter's default)
DEFAULT_CEILING_S = 0.5
INTERVALS_KEPT = 32


@dataclass
class Sample:
    value: Any
    received_s: float         # monotonic receipt time
    stamp_s: float            # capture time used for the sync check
    serial: int               # per input, increments on every put


@dataclass
class Take:
    """What a tick got: ``values`` when it may step, else ``None`` and why not."""

    values: dict[str, Any] | None
    stale: list[str] = field(default_factory=list)     # inputs missing or too old
    reason: str = ""                                    # empty when values is not None

    @property
    def ok(self) -> bool:
        return self.values is not None


class LatestInputs:
    """Latest sample per input name; ``take`` applies the freshness and sync rules."""

    def __init__(self, names: Sequence[str], max_age_s: float, sync_tolerance_s: float = 0.0, *,
                 control_period_s: float = 0.0, ceiling_s: float = DEFAULT_CEILING_S) -> None:
        """``max_age_s`` > 0: a fixed limit; 0: derived per input from ``control_period_s`` (> 0) and
        the input's measured period, never above ``ceiling_s``."""
        if not names:
            raise ValueError("at least one input is required")
        if max_age_s < 0 or (max_age_s == 0 and control_period_s <= 0):
            raise ValueError("max_age_s must be > 0, or 0 with a control period > 0 (derived)")
        self.names = list(names)
        self.max_age_s, self.sync_tolerance_s = float(max_age_s), float(sync_tolerance_s)
        self.derived = max_age_s == 0
        self._floor = AGE_PERIODS * control_period_s
        self.ceiling_s = float(ceiling_s)
        if self.derived and self.ceiling_s < self._floor:
            raise ValueError(f"max_observation_age_ceiling_s {self.ceiling_s:g} s is below the derived limit's floor, "
                             f"{AGE_PERIODS:g} control periods ({self._floor:.3f} s): every tick would be stale; "
                             "raise it, or set max_observation_age_s")
        self._limits = {n: self.max_age_s if not self.derived else self._derived(UNMEASURED_AGE_S)
                        for n in self.names}
        self._intervals: dict[str, deque[float]] = {n: deque(maxlen=INTERVALS_KEPT) for n in self.names}
        self._periods: dict[str, float] = {}
        self._latest: dict[str, Sample] = {}
        self._serials = {n: 0 for n in self.names}
        self._taken: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, name: str, value: Any, received_s: float, stamp_s: float | None = None) -> None:
        with self._lock:
            previous = self._latest.get(name)
            if previous is not None and received_s > previous.received_s:
                self._measure(name, received_s - previous.received_s)
            self._serials[name] += 1
            self._latest[name] = Sample(value, received_s, received_s if stamp_s is None else stamp_s,
                                        self._serials[name])

    def _measure(self, name: str, interval_s: float) -> None:
        """One more interval between receipts of ``name``: its period (median) and, derived, its limit."""
        kept = self._intervals[name]
        kept.append(interval_s)
        ordered = sorted(kept)
        period = ordered[len(ordered) // 2]
        self._periods[name] = period
        if self.derived:
            self._limits[name] = self._derived(AGE_PERIODS * period)

    def _derived(self, from_period_s: float) -> float:
        return min(self.ceiling_s, max(self._floor, from_period_s))

    def limits(self) -> dict[str, float]:
        """The age limit of every input now (seconds)."""
        with self._lock:
            return dict(self._limits)

    def periods(self) -> dict[str, float]:
        """The measured period of every input with two samples or more (seconds)."""
        with self._lock:
            return dict(self._periods)

    def discard_pending(self) -> None:
        """Count every sample held now as stepped on: only later ones are new (``require_new``)."""
        with self._lock:
            for name, sample in self._latest.items():
                self._taken[name] = sample.serial

    def received(self, name: str) -> int:
        """How many samples of input ``name`` have arrived (a harness waits on it)."""
        with self._lock:
            return self._serials[name]

    def has_new(self) -> bool:
        """Every input has a sample that no successful take has used yet."""
        with self._lock:
            return all(n in self._latest and self._latest[n].serial != self._taken.get(n)
                       for n in self.names)

    def take(self, now_s: float, *, require_new: bool = False, consume: bool = True) -> Take:
        """The latest values if the rules allow a step now; ``consume=False`` only checks."""
        with self._lock:
            missing = [n for n in self.names if n not in self._latest]
            if missing:
                return Take(None, missing, f"no message yet on {', '.join(missing)}")
            ages = {n: now_s - self._latest[n].received_s for n in self.names}
            stale = [n for n in self.names if ages[n] > self._limits[n]]
            if stale:
                worst = max(stale, key=ages.get)
                capped = self.derived and self._limits[worst] >= self.ceiling_s
                limit = (f"max_observation_age_s {self.max_age_s:.3f} s" if not self.derived else
                         f"its age limit {self._limits[worst]:.3f} s, derived: max_observation_age_s 0"
                         + (", capped by max_observation_age_ceiling_s" if capped else ""))
                return Take(None, stale, f"stale: {', '.join(stale)} (oldest {ages[worst]:.3f} s > {limit})")
            if require_new and any(self._latest[n].serial == self._taken.get(n) for n in self.names):
                return Take(None, [], "waiting for new samples")
            stamps = [self._latest[n].stamp_s for n in self.names]
            if self.sync_tolerance_s > 0 and max(stamps) - min(stamps) > self.sync_tolerance_s:
                return Take(None, list(self.names), f"inputs out of sync: stamps spread "
                                      f"{max(stamps) - min(stamps):.3f} s > sync_tolerance_s "
                                      f"{self.sync_tolerance_s:.3f} s")
            if consume:
                for n in self.names:
                    self._taken[n] = self._latest[n].serial
            return Take({n: self._latest[n].value for n in self.names})
