"""The client half of goal leases: renew the goals this process sent while it lives.

Why: a goal must not outlive its client. A ``flashrt bt run`` killed with SIGKILL, or
stuck, cannot cancel its goal; the node then ends the goal itself once the lease
is no longer renewed (the node's ``flashrt_ros.ros.goals``). Every ``lease_s / 4`` a timer on
the client's node publishes one ``GoalHeartbeat`` naming all of this client's
running goals, so renewal needs nothing but an executor spinning that node — the
same thing that delivers the goals' results. A process that stops spinning (dead,
or hung in a tick) stops renewing, and its goals end.
"""
from __future__ import annotations

import threading
from typing import Any

from flashrt_ros.interface.goals import goal_id_hex
from flashrt_ros.interface.qos import HEARTBEAT_QOS, HEARTBEAT_TOPIC

#: The lease the CLI, ``flashrt bt run`` and ``FlashRTClient`` ask for by default (seconds):
#: after its client dies, a goal ends within this plus one control period.
DEFAULT_LEASE_S = 2.0


class LeaseRenewer:
    """Publishes heartbeats for the goals ``hold`` was called for, until ``release``."""

    def __init__(self, node: Any, namespace: str, lease_s: float) -> None:
        if lease_s < 0:
            raise ValueError(f"lease_s must be >= 0 (0: no lease), got {lease_s}")
        self.node, self.topic, self.lease_s = node, f"{namespace}/{HEARTBEAT_TOPIC}", float(lease_s)
        self._goals: set[str] = set()
        self._lock = threading.Lock()
        self._publisher: Any = None
        self._timer: Any = None

    def hold(self, goal_id: Any) -> None:
        """Renew ``goal_id`` from now on (called when the goal is sent)."""
        if self.lease_s <= 0:
            return
        with self._lock:
            self._goals.add(goal_id_hex(goal_id))
            if self._publisher is None:           # created on first use: clients that send no goal publish nothing
                from flashrt_ros.msg import GoalHeartbeat
                self._publisher = self.node.create_publisher(GoalHeartbeat, self.topic, HEARTBEAT_QOS.profile())
                self._timer = self.node.create_timer(self.lease_s / 4.0, self.beat)

    def release(self, goal_id: Any) -> None:
        """Stop renewing ``goal_id`` (its result is in, or it was rejected)."""
        with self._lock:
            self._goals.discard(goal_id_hex(goal_id))

    @property
    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._goals)

    def beat(self) -> None:
        """One heartbeat naming every held goal (the timer's callback)."""
        goals = self.held
        if goals and self._publisher is not None:
            from flashrt_ros.msg import GoalHeartbeat
            self._publisher.publish(GoalHeartbeat(goal_ids=goals))

    def close(self) -> None:
        with self._lock:
            self._goals.clear()
            if self._timer is not None:
                self.node.destroy_timer(self._timer)
                self._timer = None
            if self._publisher is not None:
                self.node.destroy_publisher(self._publisher)
                self._publisher = None
