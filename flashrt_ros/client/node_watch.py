"""The client half of the node's heartbeat: is the node alive, is it the same process, is it active, what runs.

Why: a client waiting for a goal's result or a reply had no way to tell a slow node
from a dead one, and waited for ever (``flashrt run-policy`` printed nothing for over
ten minutes after the node was SIGKILLed). The node publishes ``~/node_heartbeat``
every ``period_s`` from a thread of its own (``flashrt_ros.ros.node_beacon``); here a
thread of the client's own takes them as they come, on a hidden node no executor
spins, so a client whose executor is busy (a behaviour tree's long tick) still hears
them, and a client starved for a while takes every waiting beat before it judges.

``gone()`` says why a wait must end: no beat for ``NODE_SILENT_PERIODS`` periods
(2.5 s at the default 0.5 s) after one was heard, or a beat from another
``instance_id`` than the one the wait began with (the node restarted: what it ran is
gone). A node never heard says nothing (an older node, or one not started yet: the
callers' own bounded waits apply).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flashrt_ros.interface.qos import (NODE_HEARTBEAT_PERIOD_S, NODE_HEARTBEAT_QOS, NODE_HEARTBEAT_TOPIC,
                                       NODE_SILENT_PERIODS)

#: How often the watch thread takes what arrived (s).
POLL_S = 0.05


@dataclass
class Heard:
    """What the latest beat said, and when it was taken (monotonic); ``instances``: every id heard, in order."""

    at: float | None = None
    instance_id: str = ""
    lifecycle_state: str = ""
    period_s: float = NODE_HEARTBEAT_PERIOD_S
    goal_ids: tuple[str, ...] = ()
    instances: list[str] = field(default_factory=list)

    def silent_s(self, now: float) -> float:
        return float("inf") if self.at is None else now - self.at

    @property
    def silent_limit_s(self) -> float:
        return NODE_SILENT_PERIODS * max(self.period_s, 1e-3)


class NodeWatch:
    """Takes ``<namespace>/node_heartbeat`` on a thread of its own until ``close``."""

    def __init__(self, node: Any, namespace: str, poll_s: float = POLL_S) -> None:
        import rclpy
        from flashrt_ros.msg import NodeHeartbeat
        self.namespace = namespace
        self.topic = f"{namespace}/{NODE_HEARTBEAT_TOPIC}"
        self._lock = threading.Lock()
        self._heard = Heard()
        self._node = rclpy.create_node(f"_{node.get_name()}_node_watch", namespace=node.get_namespace(),
                                       context=node.context, use_global_arguments=False,
                                       start_parameter_services=False, enable_rosout=False)
        self._sub = self._node.create_subscription(NodeHeartbeat, self.topic, lambda _msg: None,
                                                   NODE_HEARTBEAT_QOS.profile())
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = threading.Thread(target=self._listen, daemon=True, name=f"flashrt-node-watch {self.topic}")
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                while (msg := self._take()) is not None:
                    self._note(msg, time.monotonic())
            except Exception:  # noqa: BLE001 - rclpy shut down or the node destroyed: nothing more to hear
                return

    def _take(self) -> Any:
        with self._sub.handle:
            taken = self._sub.handle.take_message(self._sub.msg_type, self._sub.raw)
        return None if taken is None else taken[0]

    def _note(self, msg: Any, now: float) -> None:
        with self._lock:
            h = self._heard
            if not h.instances or h.instances[-1] != msg.instance_id:
                h.instances.append(msg.instance_id)
            h.at, h.instance_id, h.lifecycle_state = now, msg.instance_id, msg.lifecycle_state
            h.period_s = float(msg.period_s) or NODE_HEARTBEAT_PERIOD_S
            h.goal_ids = tuple(msg.goal_ids)

    def heard(self) -> Heard:
        """A copy of what the latest beat said."""
        with self._lock:
            h = self._heard
            return Heard(h.at, h.instance_id, h.lifecycle_state, h.period_s, h.goal_ids, list(h.instances))

    def gone(self, instance_id: str = "", now: float | None = None) -> str | None:
        """Why a wait on the node must end (see the module docstring), or None. ``instance_id``: the node's
        instance when the wait began (a goal's: the one that accepted it)."""
        now = time.monotonic() if now is None else now
        h = self.heard()
        if h.at is None:
            return None
        if instance_id and h.instance_id != instance_id:
            return (f"node {self.namespace} restarted while the call waited (instance {instance_id[:8]} -> "
                    f"{h.instance_id[:8]}): whatever it was doing for this call is gone")
        silent = h.silent_s(now)
        if silent > h.silent_limit_s:
            return (f"node {self.namespace} stopped answering: no heartbeat for {silent:.1f} s (it beats every "
                    f"{h.period_s:g} s; the process died, froze, or its machine or network went away)")
        return None

    def close(self) -> None:
        """Stop the thread, then destroy the hidden node (a second call does nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)
        self._node.destroy_node()
