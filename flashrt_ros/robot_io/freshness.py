"""The inputs of one control tick, taken together, and the stale-data rule.

Why: a policy stepped on a dead sensor's last frame keeps commanding the robot
as if nothing happened. So every tick takes the *latest* sample of every
required input and refuses to step when

* an input has never arrived, or
* an input's latest sample was received more than ``max_age_s`` ago
  (receipt time on this machine's monotonic clock: no clock sync needed), or
* the samples do not belong together: their capture stamps (the header stamp
  where the message has one, else the receipt time) spread over more than
  ``sync_tolerance_s`` (0 = no such check).

With ``require_new`` a tick also waits until every input has a sample it has
not stepped on yet (lock-step with a simulator: one step per observation).
Thread-safe: subscriptions put, the control tick takes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence


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

    def __init__(self, names: Sequence[str], max_age_s: float, sync_tolerance_s: float = 0.0) -> None:
        if not names:
            raise ValueError("at least one input is required")
        if max_age_s <= 0:
            raise ValueError("max_age_s must be > 0")
        self.names = list(names)
        self.max_age_s, self.sync_tolerance_s = float(max_age_s), float(sync_tolerance_s)
        self._latest: dict[str, Sample] = {}
        self._serials = {n: 0 for n in self.names}
        self._taken: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, name: str, value: Any, received_s: float, stamp_s: float | None = None) -> None:
        with self._lock:
            self._serials[name] += 1
            self._latest[name] = Sample(value, received_s, received_s if stamp_s is None else stamp_s,
                                        self._serials[name])

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
            stale = [n for n in self.names if ages[n] > self.max_age_s]
            if stale:
                worst = max(stale, key=ages.get)
                return Take(None, stale, f"stale: {', '.join(stale)} (oldest {ages[worst]:.3f} s > "
                                         f"max_observation_age_s {self.max_age_s:.3f} s)")
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
