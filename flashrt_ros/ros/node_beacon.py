"""The node's own heartbeat: ``~/node_heartbeat`` every ``NODE_HEARTBEAT_PERIOD_S``, from a thread of its own.

Why: a client waiting for a goal's result or a service's reply had no way to tell a
slow node from a dead one. DDS notices a SIGKILLed participant only when its lease
runs out (Fast DDS: 20 s by default), and ``~/status`` comes from a timer on the
node's executor, which a long step or a busy pool delays. A thread that only
publishes keeps its beat whatever the executor does, so silence means the process
is gone (or frozen); ``instance_id`` (new at each start) tells a restarted node from
the one that took the goal; ``lifecycle_state`` lets a client wait for activation
instead of being refused; ``goal_ids`` names the goals running (a client whose
acceptance reply was lost learns its goal runs). The client half is
``flashrt_ros.client.node_watch``.
"""
from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

from flashrt_ros.interface.qos import NODE_HEARTBEAT_PERIOD_S, NODE_HEARTBEAT_QOS, NODE_HEARTBEAT_TOPIC
from flashrt_ros.msg import NodeHeartbeat


class NodeBeacon:
    """Publishes ``NodeHeartbeat`` for ``node`` until ``destroy``; ``state`` and ``goal_ids`` are read per beat."""

    def __init__(self, node: Any, state: Callable[[], str], goal_ids: Callable[[], list[str]],
                 period_s: float = NODE_HEARTBEAT_PERIOD_S) -> None:
        self.instance_id = uuid.uuid4().hex
        self.period_s = float(period_s)
        self._state, self._goal_ids, self._log = state, goal_ids, node.get_logger()
        self._pub = node.create_publisher(NodeHeartbeat, f"~/{NODE_HEARTBEAT_TOPIC}", NODE_HEARTBEAT_QOS.profile())
        self._node = node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="flashrt-node-heartbeat")
        self._thread.start()

    def message(self) -> NodeHeartbeat:
        return NodeHeartbeat(instance_id=self.instance_id, lifecycle_state=self._state(), period_s=self.period_s,
                             goal_ids=list(self._goal_ids()))

    def _beat(self) -> None:
        while True:
            try:
                self._pub.publish(self.message())
            except Exception as exc:  # noqa: BLE001 - rclpy shut down or the node destroyed: the beat ends
                if not self._stop.is_set() and self._node.context.ok():
                    self._log.warning(f"node heartbeat stopped ({type(exc).__name__}: {exc})")
                return
            if self._stop.wait(self.period_s):
                return

    def destroy(self) -> None:
        """Stop the thread (clients then see silence), then drop the publisher; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._node.destroy_publisher(self._pub)
