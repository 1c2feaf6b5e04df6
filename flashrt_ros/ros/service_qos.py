"""QoS of the capsule services and the generate feedback, shared by the node and the client.

Why not rclpy's default (reliable, keep-last 10): a service's response writer
keeps one history for all its clients. On a loaded machine, with several
clients calling at once, more than ten responses can be written before a slow
client's reader acknowledges the first; a reliable writer can then only resend
what is still in its history, so an evicted response is lost and its client
waits forever (issue #13, defect 10: one ``verify`` reply in two of four
concurrency runs). A deep history (also for the requests) keeps every response
until it is acknowledged, within any burst our clients can produce.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

SERVICE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)

#: Generate feedback (one message per token): deep enough that a burst of tokens is never
#: evicted before a slow subscriber has it. Compatible with rclpy's action defaults.
FEEDBACK_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.VOLATILE)
