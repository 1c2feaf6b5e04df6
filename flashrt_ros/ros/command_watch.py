"""Watching a command topic: receipt times and stamps of every message, summarised as it goes.

Why a ROS-side module: ``flashrt watch-commands`` (``cli/robot_tools.py``) runs it, as
``flashrt serve`` runs the node, and its statistics are ``robot_io.command_stats``'s.
The subscription adapts its QoS to the topic's publishers (reliable if they all are),
so it sees what a controller subscribed to the same topic would. Receipt times are this
process's monotonic clock; the stamp-to-receipt delay uses the system clock (same
machine, same clock).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

from flashrt_ros.robot_io.command_stats import StreamSummary, summarize


class NoPublisher(ValueError):
    """No publisher of the topic appeared in time, or its type is not installed (the message says which)."""


class CommandWatch:
    """An rclpy node (its own context) subscribed to ``topic``; ``run`` reports and ends with the whole run."""

    def __init__(self, topic: str, msg_type: str = "", timeout_s: float = 30.0) -> None:
        import rclpy
        from rclpy.signals import SignalHandlerOptions

        from flashrt_ros.interface.topic_types import TopicError, adapted_qos, message_class
        self.topic = topic
        self._context = rclpy.Context()
        rclpy.init(context=self._context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(f"flashrt_watch_commands_{os.getpid()}", context=self._context)
        try:
            self.type_name = msg_type or self._graph_type(timeout_s)
            if not self.type_name:
                raise NoPublisher(f"no publisher on {topic} within {timeout_s:.1f} s (is the node active with "
                                  "output_topic set to it? or give --type)")
            try:
                msg_class = message_class(self.type_name)
            except TopicError as exc:
                raise NoPublisher(str(exc)) from None
            self.receipts: list[float] = []
            self.delays: list[float] = []
            self.node.create_subscription(msg_class, topic, self._receive,
                                          adapted_qos(self.node.get_publishers_info_by_topic(topic)))
        except BaseException:
            self.close()
            raise

    def _receive(self, msg: Any) -> None:
        self.receipts.append(time.monotonic())
        header = getattr(msg, "header", None)
        if header is not None and (header.stamp.sec or header.stamp.nanosec):
            self.delays.append(time.time() - (header.stamp.sec + header.stamp.nanosec * 1e-9))

    def _graph_type(self, timeout_s: float) -> str:
        """The topic's type as its publishers advertise it ('' if none appears within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            types = dict(self.node.get_topic_names_and_types()).get(self.topic)
            if types:
                return types[0]
            if time.monotonic() >= deadline:
                return ""
            time.sleep(0.1)

    def run(self, interval_s: float, duration_s: float, report: Callable[[StreamSummary], None]) -> bool:
        """Spin, calling ``report`` with the last ``interval_s``'s summary (the gap into it included),
        for ``duration_s`` (0: until Ctrl-C); True when Ctrl-C (KeyboardInterrupt) ended it."""
        from rclpy.executors import SingleThreadedExecutor
        executor = SingleThreadedExecutor(context=self._context)
        executor.add_node(self.node)
        start = time.monotonic()
        next_report, shown = start + interval_s, 0
        try:
            while not duration_s or time.monotonic() - start < duration_s:
                executor.spin_once(timeout_sec=min(0.05, max(0.0, next_report - time.monotonic())))
                now = time.monotonic()
                if now >= next_report:
                    count = len(self.receipts)
                    report(summarize(self.receipts[shown:count], now,
                                     before=self.receipts[shown - 1] if shown else None))
                    shown, next_report = count, next_report + interval_s
        except KeyboardInterrupt:
            return True
        finally:
            executor.remove_node(self.node)
            executor.shutdown(timeout_sec=0.0)
        return False

    def whole_run(self) -> StreamSummary:
        return summarize(self.receipts, time.monotonic(), self.delays)

    def close(self) -> None:
        import rclpy
        self.node.destroy_node()
        rclpy.try_shutdown(context=self._context)
