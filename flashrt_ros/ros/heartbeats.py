"""The node half of goal leases: read the clients' heartbeats on a thread of their own.

Why not a subscription on the node's executor: a heartbeat read there waits until
the executor gets to it; with its pool busy (a goal's execute callback, services
waiting for a boundary) or the machine loaded, a live client's heartbeats sat
unread while the lease ran out. Here a thread drains the heartbeat topic every
``POLL_S``, on a hidden node of its own that no executor spins, and tells the
``GoalBook`` up to when it has heard: a lease is judged against that
(``goals.py``), so heartbeats waiting unread never end a goal.

Why best effort (``interface.qos.HEARTBEAT_READER_QOS``): heartbeats are idempotent
and sent every ``lease_s / 4``; a lost one is replaced by the next. A reliable reader
delivers in order, so one lost sample would hold back every later one until the
writer's next DDS heartbeat (3 s by default in Fast DDS: longer than the default 2 s
lease). A best-effort reader matches reliable and best-effort writers alike.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import rclpy

from flashrt_ros.interface.qos import HEARTBEAT_READER_QOS, HEARTBEAT_TOPIC
from flashrt_ros.msg import GoalHeartbeat
from flashrt_ros.ros.goals import GoalBook

#: How often the listener drains the heartbeat topic (s): a killed client's goal ends at most
#: this much later than its lease.
POLL_S = 0.05


class HeartbeatListener:
    """Reads ``<node>/goal_heartbeat`` into ``goals`` from a daemon thread until ``destroy``."""

    def __init__(self, node: Any, goals: GoalBook, poll_s: float = POLL_S) -> None:
        self.topic = node.resolve_topic_name(f"~/{HEARTBEAT_TOPIC}")
        self._goals, self._poll_s, self._log = goals, poll_s, node.get_logger()
        # hidden (leading underscore), and free of the process's remappings (a __node remap
        # would give it the node's own name)
        self._node = rclpy.create_node(f"_{node.get_name()}_heartbeats", namespace=node.get_namespace(),
                                       context=node.context, use_global_arguments=False,
                                       start_parameter_services=False, enable_rosout=False)
        self._sub = self._node.create_subscription(GoalHeartbeat, self.topic, lambda _msg: None,
                                                   HEARTBEAT_READER_QOS.profile())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True, name="flashrt-heartbeats")
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.wait(self._poll_s):
            checked = time.monotonic()
            try:
                while (msg := self._take()) is not None:
                    self._goals.renew(msg.goal_ids)
            except Exception as exc:  # noqa: BLE001 - rclpy shut down or the node destroyed
                if not self._stop.is_set() and self._node.context.ok():
                    self._log.warning(f"goal heartbeats no longer read ({type(exc).__name__}: {exc}); "
                                      "leases fall back to the wall clock")
                self._goals.heard(None)
                return
            self._goals.heard(checked)

    def _take(self) -> Any:
        """The next heartbeat waiting, or None (the executor's own take, without an executor)."""
        with self._sub.handle:
            taken = self._sub.handle.take_message(self._sub.msg_type, self._sub.raw)
        return None if taken is None else taken[0]

    def destroy(self) -> None:
        """Stop the thread, then destroy the hidden node (a second call does nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._goals.heard(None)
        self._node.destroy_node()
