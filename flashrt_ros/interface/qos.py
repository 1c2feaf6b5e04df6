"""The QoS and names of what the node and its clients must agree on besides services and actions.

Why declared here: a reader's QoS must be compatible with its writer's, so each profile is one
declaration both sides build from (``QosSpec.profile()``). The profiles are plain data; rclpy is
imported only when one is built (both sides run rclpy; the declarations do not need it).

Services and action feedback: not rclpy's default (reliable, keep-last 10). A service's response
writer keeps one history for all its clients; on a loaded machine, with several clients calling
at once, more than ten responses can be written before a slow client's reader acknowledges the
first, and a reliable writer can only resend what is still in its history, so an evicted response
is lost and its client waits forever (issue #13, defect 10). A deep history (also for the
requests, and for the per-token Generate feedback) keeps every message until it is acknowledged,
within any burst our clients can produce.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QosSpec:
    """A QoS profile by its policies' names (rclpy's ``HistoryPolicy.KEEP_LAST`` is ``keep_last``)."""

    depth: int
    reliability: str = "reliable"           # reliable | best_effort
    durability: str = "volatile"            # volatile | transient_local
    history: str = "keep_last"              # keep_last | keep_all

    def profile(self) -> Any:
        """The ``rclpy.qos.QoSProfile``."""
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        return QoSProfile(history=HistoryPolicy[self.history.upper()], depth=self.depth,
                          reliability=ReliabilityPolicy[self.reliability.upper()],
                          durability=DurabilityPolicy[self.durability.upper()])


#: The capsule services (requests and responses; see the module docstring).
SERVICE_QOS = QosSpec(depth=1000)
#: Action feedback (Generate: one message per token): deep enough that a burst is never evicted
#: before a slow subscriber has it. Compatible with rclpy's action defaults.
FEEDBACK_QOS = QosSpec(depth=1000)

#: ``~/status`` (``flashrt_ros/msg/EngineStatus``): latched, so a reader gets the latest at once.
STATUS_TOPIC = "status"
STATUS_QOS = QosSpec(depth=1, durability="transient_local")
#: ``~/goal_heartbeat`` (``flashrt_ros/msg/GoalHeartbeat``): clients renew their goals' leases.
HEARTBEAT_TOPIC = "goal_heartbeat"
HEARTBEAT_QOS = QosSpec(depth=10)
#: ``~/node_heartbeat`` (``flashrt_ros/msg/NodeHeartbeat``): the node tells its clients it lives, every
#: ``NODE_HEARTBEAT_PERIOD_S``; best effort and volatile (a lost one is replaced by the next; an old one is no news).
NODE_HEARTBEAT_TOPIC = "node_heartbeat"
NODE_HEARTBEAT_QOS = QosSpec(depth=10, reliability="best_effort")
NODE_HEARTBEAT_PERIOD_S = 0.5
#: A client takes its node for gone after this many periods without a heartbeat (2.5 s at the default period).
NODE_SILENT_PERIODS = 5
#: The node reads heartbeats best effort (it matches reliable and best-effort writers alike):
#: a reliable reader delivers in order, so one lost heartbeat would hold every later one back until
#: the writer repairs it (Fast DDS: up to 3 s, longer than the default 2 s lease); a lost heartbeat
#: is replaced by the next one a quarter lease later.
HEARTBEAT_READER_QOS = QosSpec(depth=10, reliability="best_effort")


def resolve_topic(topic: str, node_fqn: str) -> str:
    """A topic name as the node named ``node_fqn`` resolves it (``~/x`` -> ``/robot1/flashrt/x``, ``x`` ->
    ``/robot1/x``, ``/x`` as is): a process that is not that node publishes (``flashrt fake-sensors``)
    or listens (``flashrt watch-commands``) where the node does."""
    if topic.startswith("/"):
        return topic
    if topic.startswith("~"):
        return node_fqn.rstrip("/") + "/" + topic[1:].lstrip("/")
    namespace = node_fqn.rstrip("/").rsplit("/", 1)[0]
    return f"{namespace}/{topic}"
