"""The node's ``~/status`` for condition nodes: one watch per client, and the conditions on it."""
from __future__ import annotations

import weakref
from typing import Any

from flashrt_ros.interface.qos import STATUS_QOS, STATUS_TOPIC


class StatusWatch:
    """The latest ``~/status`` of one node (transient-local: the last message arrives on subscribing)."""

    def __init__(self, client: Any) -> None:
        from flashrt_ros.msg import EngineStatus
        self.latest: Any = None
        self._sub = client.node.create_subscription(EngineStatus, f"{client.namespace}/{STATUS_TOPIC}",
                                                    self._on_status, STATUS_QOS.profile())

    def _on_status(self, msg: Any) -> None:
        self.latest = msg


_watches: "weakref.WeakKeyDictionary[Any, StatusWatch]" = weakref.WeakKeyDictionary()


def status_watch(client: Any) -> StatusWatch:
    """One ``StatusWatch`` per client (created on first use)."""
    watch = _watches.get(client)
    if watch is None:
        watch = _watches[client] = StatusWatch(client)
    return watch


def check_status(status: Any, condition: str) -> tuple[bool, str]:
    """Evaluate ``condition`` (``inputs_fresh`` or ``policy_paused``) on an EngineStatus; (holds, why)."""
    if status is None:
        return False, "no ~/status received yet"
    if status.lifecycle_state != "active":
        return False, f"node is {status.lifecycle_state}"
    if status.engine_kind != "policy":
        return False, f"{condition} applies to a policy node (this one hosts {status.engine_kind})"
    if condition == "inputs_fresh":
        return status.inputs_state == "fresh", f"inputs {status.inputs_state}: {status.inputs_detail}".rstrip(": ")
    if condition == "policy_paused":
        return status.paused, "policy paused" if status.paused else "policy not paused"
    raise ValueError(f"unknown condition {condition!r} (inputs_fresh or policy_paused)")
