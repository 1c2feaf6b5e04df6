"""Input messages the node refuses: how many, why the latest of each topic was, and a log that never floods.

Why: a camera that sends frames the node cannot read (a step shorter than a row, a packed
YUV image of odd width) sends them at its own rate; logging each one wrote 91 lines in 6 s.
The first refusal of a topic for a reason is logged, repeats of it at most every
``LOG_PERIOD_S`` with the count since; every refusal is counted (``rejected_messages``
on ``~/status``) and the latest reason per topic stays for the inputs' verdict
(``inputs_state: error`` names it, idle or not). Pure Python: the node passes its logger.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

#: repeats of one refusal (topic and reason) are logged at most this often (s)
LOG_PERIOD_S = 10.0


class InputRefusals:
    """Counts and reasons of refused input messages; ``log`` gets each line to write (an error)."""

    def __init__(self, log: Callable[[str], None], period_s: float = LOG_PERIOD_S) -> None:
        self.count = 0
        self.latest: dict[str, str] = {}                              # topic -> why its latest message was refused
        self._log, self._period_s = log, period_s
        self._logged: dict[tuple[str, str], tuple[int, float]] = {}   # (topic, why) -> (unlogged repeats, logged at)
        self._lock = threading.Lock()

    def refuse(self, topic: str, reason: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.count += 1
            self.latest[topic] = reason
            key = (topic, reason)
            if key not in self._logged:
                line = (f"input {topic} refused: {reason} (counted in rejected_messages on ~/status; repeats "
                        f"logged at most every {self._period_s:g} s)")
                self._logged[key] = (0, now)
            else:
                repeats, logged_at = self._logged[key]
                if now - logged_at < self._period_s:
                    self._logged[key] = (repeats + 1, logged_at)
                    return
                line = f"input {topic} still refused: {reason} ({repeats + 1} more since the last line)"
                self._logged[key] = (0, now)
        self._log(line)

    def accepted(self, topic: str) -> None:
        """A message of ``topic`` passed: its latest message is no longer a refused one."""
        with self._lock:
            self.latest.pop(topic, None)

    def reasons(self) -> dict[str, str]:
        with self._lock:
            return dict(self.latest)
