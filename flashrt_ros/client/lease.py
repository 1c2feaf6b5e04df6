"""The client half of goal leases: renew the goals this process sent while it lives.

Why: a goal must not outlive its client. A ``flashrt bt run`` killed with SIGKILL
cannot cancel its goal; the node then ends the goal itself once the lease is no
longer renewed (the node's ``flashrt_ros.ros.goals``). Every ``lease_s / 4`` a thread of its
own publishes one ``GoalHeartbeat`` naming all of this client's running goals.

Why a thread of its own: renewals used to come from a timer on the client's node,
so they stopped whenever nothing spun that node: a tree's tick thread busy with a
long tick, a busy executor, or a loaded machine. A live client then lost its goal
("LEASE_EXPIRED" mid-mission, seen in CI). The renewal thread depends on nothing
but the process being alive (it waits on an event, so it gets the interpreter
lock back within Python's switch interval of any Python work). A process that
hangs keeps renewing: ``flashrt bt run``'s watchdog ends a tick stuck for
``TICK_STALL_S``, and its goals then end within the lease.
"""
from __future__ import annotations

import atexit
import threading
from typing import Any

from flashrt_ros.interface.goals import goal_id_hex
from flashrt_ros.interface.qos import HEARTBEAT_QOS, HEARTBEAT_TOPIC

#: The lease the CLI, ``flashrt bt run`` and ``FlashRTClient`` ask for by default (seconds):
#: after its client dies, a goal ends within this plus one control period.
DEFAULT_LEASE_S = 2.0


class LeaseRenewer:
    """Publishes heartbeats for the goals ``hold`` was called for, until ``release``, from a thread
    of its own (started on the first ``hold``, stopped by ``close``)."""

    def __init__(self, node: Any, namespace: str, lease_s: float) -> None:
        if lease_s < 0:
            raise ValueError(f"lease_s must be >= 0 (0: no lease), got {lease_s}")
        self.node, self.topic, self.lease_s = node, f"{namespace}/{HEARTBEAT_TOPIC}", float(lease_s)
        self.period_s = self.lease_s / 4.0
        self._goals: set[str] = set()
        self._lock = threading.Lock()
        self._publisher: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, goal_id: Any) -> None:
        """Renew ``goal_id`` from now on (called when the goal is sent)."""
        if self.lease_s <= 0:
            return
        with self._lock:
            self._goals.add(goal_id_hex(goal_id))
            if self._publisher is None:           # created on first use: clients that send no goal publish nothing
                from flashrt_ros.msg import GoalHeartbeat
                self._publisher = self.node.create_publisher(GoalHeartbeat, self.topic, HEARTBEAT_QOS.profile())
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._renew, daemon=True,
                                                name=f"flashrt-lease {self.topic}")
                self._thread.start()
                atexit.register(self._stop_thread)     # a client never closed: the thread ends before ROS does

    def release(self, goal_id: Any) -> None:
        """Stop renewing ``goal_id`` (its result is in, or it was rejected)."""
        with self._lock:
            self._goals.discard(goal_id_hex(goal_id))

    @property
    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._goals)

    def _renew(self) -> None:
        """The renewal thread: one heartbeat every ``period_s`` until ``close`` (or the node is gone)."""
        while not self._stop.wait(self.period_s):
            if not self.beat():
                return

    def beat(self) -> bool:
        """One heartbeat naming every held goal; False once the node (or ROS) is gone."""
        goals = self.held
        with self._lock:
            publisher = self._publisher
        if not goals or publisher is None:
            return publisher is not None
        from flashrt_ros.msg import GoalHeartbeat
        try:
            publisher.publish(GoalHeartbeat(goal_ids=goals))
        except Exception:  # noqa: BLE001 - destroyed node, rclpy shut down: nothing left to renew for
            return False
        return True

    def _stop_thread(self) -> None:
        """End the renewal thread (waits for a heartbeat being sent); renews nothing after."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(1.0, 4 * self.period_s))
        atexit.unregister(self._stop_thread)

    def close(self) -> None:
        """Stop the renewal thread, then drop the publisher."""
        self._stop_thread()
        with self._lock:
            self._goals.clear()
            self._thread = None
            if self._publisher is not None:
                self.node.destroy_publisher(self._publisher)
                self._publisher = None
