"""Policy topics: ~/observation in, ~/action out, one engine step per control tick.

Why a tick that uses the *latest* observation: at control rate a stale queue is
worse than a dropped sample, so both topics are keep-last with a deadline of
``qos_deadline_factor`` control periods (parameters). A tick without any
observation yet publishes nothing; a paused policy (``~/pause``) skips ticks
and its state stays exactly where it was.
"""
from __future__ import annotations

import threading
from typing import Any

from rclpy.duration import Duration
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float32MultiArray


class PolicyIO:
    """Owns the observation subscription, the action publisher and the control timer."""

    def __init__(self, node: Any, engine: Any, config: Any, group: Any) -> None:
        self._node, self._engine = node, engine
        period = 1.0 / config.control_rate_hz
        qos = QoSProfile(depth=config.qos_depth, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE)
        if config.qos_deadline_factor > 0:
            qos.deadline = Duration(seconds=period * config.qos_deadline_factor)
        self._latest: list[float] | None = None
        self._lock = threading.Lock()
        self.paused = False
        self.steps = 0
        self._sub = node.create_subscription(Float32MultiArray, "~/observation", self._on_obs, qos,
                                             callback_group=group)
        self._pub = node.create_publisher(Float32MultiArray, "~/action", qos)
        self._timer = node.create_timer(period, self._tick, callback_group=group)

    def _on_obs(self, msg: Float32MultiArray) -> None:
        with self._lock:
            self._latest = list(msg.data)

    def _tick(self) -> None:
        if self.paused:
            return
        with self._lock:
            obs = self._latest
        if obs is None:
            return
        try:
            action = self._engine.step(obs)
        except Exception as exc:  # noqa: BLE001 - a bad observation must not stop the loop
            self._node.get_logger().error(f"policy step failed: {exc}",
                                          throttle_duration_sec=1.0)
            return
        self.steps += 1
        self._pub.publish(Float32MultiArray(data=[float(a) for a in action]))

    def destroy(self) -> None:
        self._node.destroy_timer(self._timer)
        self._node.destroy_subscription(self._sub)
        self._node.destroy_publisher(self._pub)
