"""In-process harness for robot-I/O tests: a FlashRTNode and a peer node on one executor."""
from __future__ import annotations

import time
import threading
from pathlib import Path
from typing import Any, Callable

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import Float32MultiArray

from flashrt_ros.client.background_executor import BackgroundExecutor
from waiting import wait_until  # noqa: F401 - re-exported: the robot-I/O tests' condition wait


#: Input freshness for tests that are not about the stale-data stop (seconds; see ``policy_node``).
GENEROUS_AGE_S = 5.0


class RosHarness:
    """rclpy, one MultiThreadedExecutor in a thread, a peer node for publishers/clients."""

    def __init__(self) -> None:
        rclpy.init()
        self.executor = MultiThreadedExecutor(num_threads=6)
        self.peer = rclpy.create_node("robot_io_test_peer")
        self.executor.add_node(self.peer)
        self._spinner = BackgroundExecutor(self.executor)
        self.nodes: list[Any] = []

    def policy_node(self, name: str, tmp: Path, **params: Any) -> Any:
        """A configured and activated FlashRTNode (engine_kind=policy) under ``/<name>``.

        ``max_observation_age_s`` defaults to a generous ``GENEROUS_AGE_S`` here, not the node's
        1.5 control periods (75 ms): on a loaded machine a tick can run that late after the
        last receipt, and a test that is not about the stale-data stop then waited 30 s for
        steps that the stop (rightly) refused. Tests of the stop set it themselves.
        """
        from flashrt_ros.ros.node import FlashRTNode
        defaults = {"engine_kind": "policy", "policy": "gru", "device": "cpu",
                    "control_rate_hz": 20.0, "status_period_s": 0.2,
                    "max_observation_age_s": GENEROUS_AGE_S,
                    "capsule_directory": str(tmp / f"{name}_capsules")}
        defaults.update(params)
        node = FlashRTNode("flashrt", namespace=f"/{name}",
                           parameter_overrides=[Parameter(k, value=v) for k, v in defaults.items()])
        self.executor.add_node(node)
        self.nodes.append(node)
        node.trigger_configure()
        assert node._engine is not None, f"{name} did not configure"
        node.trigger_activate()
        assert node._active, f"{name} did not activate"
        return node

    def collect(self, msg_type: type, topic: str, qos: Any = 10) -> list:
        got: list = []
        self.peer.create_subscription(msg_type, topic, got.append, qos)
        return got

    def close(self) -> None:
        self._spinner.stop()              # first: no callback may run on a handle destroyed below
        for node in self.nodes:
            node._release_engine()
            self.executor.remove_node(node)
            node.destroy_node()
        self.peer.destroy_node()
        rclpy.try_shutdown()


class Feeder:
    """Publishes an observation every ``period_s`` from a thread until stopped."""

    def __init__(self, node: Any, topic: str, make: Callable[[int], Any], qos: Any = None,
                 period_s: float = 0.02, msg_type: type = Float32MultiArray) -> None:
        self.pub = node.create_publisher(msg_type, topic, qos or QoSProfile(depth=10))
        self._node, self._make, self.period_s = node, make, period_s
        self.count = 0
        self.times: list[float] = []        # monotonic publish times (to tell late inputs apart)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.pub.publish(self._make(self.count))
            except Exception:  # noqa: BLE001 - the node was torn down under a failed test
                return
            self.times.append(time.monotonic())
            self.count += 1
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        """Stop and destroy the publisher (the 'killed sensor')."""
        self._stop.set()
        self._thread.join(5)
        self._node.destroy_publisher(self.pub)
