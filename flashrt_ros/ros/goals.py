"""The goals a node runs: who owns each, whether its client still lives, what it waits for.

Why one book for both actions (RunPolicy, Generate): a goal must never outlive its
client (a killed ``flashrt bt run`` kept driving the arm), a refused goal must say
which goal holds the node and whose it is, and ``~/status`` shows the running goal.

Leases: a goal sent with ``lease_s > 0`` lives only while its client names it on
``<node>/goal_heartbeat`` at least once every ``lease_s`` (our client sends every
``lease_s / 4``); the lease starts when the goal is accepted. The action servers ask
``lease_expired`` before every step or token and end an expired goal
(``LEASE_EXPIRED``). Pure Python, no ROS: the node feeds it (``heartbeats.py``).

A lease is measured against what the node has *heard*, not against the wall clock
alone: the listener reports (``heard``) the latest time up to which it has taken every
heartbeat that had arrived, and a goal expires only when that time is more than
``lease_s`` past its last renewal. So a node too busy to read its heartbeats (a loaded
machine, a starved thread) never ends a live client's goal for heartbeats waiting
unread; it decides as soon as it has read them. Without a listener (``heard`` never
called) the wall clock is used. The grace is bounded (``MAX_UNREAD_S``): a listener that
stopped reading for longer cannot keep a lease alive (it fails closed).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable


#: How far behind the node's clock the heartbeat listener may have read before a lease is judged against the clock
#: less this: a listener stalled longer (a starved or stuck thread) must not keep a dead client's goal alive (fail
#: closed); a lease then ends at most this much later than its ``lease_s``.
MAX_UNREAD_S = 2.0


@dataclass
class RunningGoal:
    """One accepted goal while it executes."""

    action: str                 # run_policy | generate
    goal_id: str                # 32 hex digits
    owner: str
    lease_s: float              # 0: no lease
    started: float              # monotonic
    renewed: float              # monotonic time of the last heartbeat (or the start)
    state: str = ""             # stepping | waiting: <what> | generating
    steps: int = 0              # policy steps or tokens so far
    heard_until: Callable[[float], float] = field(default=lambda now: now, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def lease_expired(self, now: float | None = None) -> bool:
        """No heartbeat for ``lease_s`` up to the time the node has heard up to (see the module docstring)."""
        if self.lease_s <= 0:
            return False
        now = time.monotonic() if now is None else now
        with self._lock:
            renewed = self.renewed
        judged_at = max(min(now, self.heard_until(now)), now - MAX_UNREAD_S)
        return judged_at - renewed > self.lease_s

    def renew(self, now: float) -> None:
        with self._lock:
            self.renewed = max(self.renewed, now)

    def describe(self, now: float | None = None) -> str:
        """``goal 3f2a... (run_policy) from 'flashrt run-policy (pid 12 on host)', running 4.1 s, 61 steps,
        stepping``: what a refused goal's message says of the running one."""
        now = time.monotonic() if now is None else now
        unit = "steps" if self.action == "run_policy" else "tokens"
        owner = f"'{self.owner}'" if self.owner else "an unnamed client (no owner given)"
        return (f"goal {self.goal_id} ({self.action}) from {owner}, running {now - self.started:.1f} s, "
                f"{self.steps} {unit}" + (f", {self.state}" if self.state else ""))


class GoalBook:
    """The running goal of each action, and the heartbeats that keep their leases."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, RunningGoal] = {}          # action -> its running goal
        self._on_change = on_change                         # a goal began or ended (e.g. publish ~/status)
        self._heard: float | None = None                    # see heard(); None: no listener, the wall clock

    def begin(self, action: str, goal_id: str, owner: str, lease_s: float) -> RunningGoal:
        """Record ``goal_id`` as ``action``'s running goal (the caller holds the action's busy lock)."""
        now = time.monotonic()
        goal = RunningGoal(action, goal_id, owner, max(0.0, float(lease_s)), now, now,
                           heard_until=self.heard_until)
        with self._lock:
            self._running[action] = goal
        self._on_change()
        return goal

    def end(self, goal: RunningGoal) -> None:
        with self._lock:
            if self._running.get(goal.action) is not goal:
                return
            del self._running[goal.action]
        self._on_change()

    def running(self, action: str) -> RunningGoal | None:
        with self._lock:
            return self._running.get(action)

    def current(self) -> RunningGoal | None:
        """The running goal shown on ``~/status`` (a node runs at most one at a time in practice)."""
        with self._lock:
            return next(iter(self._running.values()), None)

    def goal_ids(self) -> list[str]:
        """The running goals' ids (``NodeHeartbeat.goal_ids``)."""
        with self._lock:
            return [g.goal_id for g in self._running.values()]

    def renew(self, goal_ids: Iterable[str], now: float | None = None) -> None:
        """A heartbeat naming ``goal_ids``: renew those that run (others are not ours, or ended)."""
        now = time.monotonic() if now is None else now
        wanted = set(goal_ids)
        with self._lock:
            renewing = [g for g in self._running.values() if g.goal_id in wanted]
        for goal in renewing:
            goal.renew(now)

    def heard(self, until: float | None) -> None:
        """The listener has taken every heartbeat that arrived before ``until`` (monotonic); None: the
        listener stopped, leases fall back to the wall clock."""
        with self._lock:
            self._heard = until if until is None or self._heard is None else max(self._heard, until)

    def heard_until(self, now: float) -> float:
        """The time up to which heartbeats are known read (``now`` without a listener)."""
        with self._lock:
            return now if self._heard is None else self._heard
