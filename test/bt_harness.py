"""Shared set-up of the behaviour-tree tests against a real policy node (CPU, run_mode=goal).

run_mode=goal: the policy steps only while a RunPolicy goal runs, so the state
between goals stands still and positions can be compared exactly.
"""
from __future__ import annotations

import threading
from typing import Any

import pytest

from node_fixtures import active_node, ros_node  # noqa: F401 - fixture
from rosproc import NodeUnderTest
from waiting import wait_until

POLICY_PARAMS = {"engine_kind": "policy", "policy": "gru", "device": "cpu", "qos_deadline_factor": "0.0",
                 "run_mode": "goal"}


def observation(i: int) -> list[float]:
    """A deterministic observation stream (indexed by the publisher's count)."""
    return [0.1 * (i % 7), -0.2, 0.0, 0.05, 0.5, -0.5]


class ObservationFeed:
    """Publishes constant observations at ~100 Hz from a thread, so the policy's inputs stay fresh.

    The policy's actions depend only on its state and the observation, and the
    observation is constant, so an interrupted and an uninterrupted run see the same inputs.
    """

    def __init__(self, ros_node: Any, node: NodeUnderTest) -> None:
        from std_msgs.msg import Float32MultiArray
        self._msg = Float32MultiArray(data=observation(3))
        self._pub = ros_node.create_publisher(Float32MultiArray, f"{node.namespace}/flashrt/observation", 10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._pub.publish(self._msg)

    def close(self, ros_node: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        ros_node.destroy_publisher(self._pub)


class ActionLog:
    """Every action the node publishes, in order."""

    def __init__(self, ros_node: Any, node: NodeUnderTest) -> None:
        from std_msgs.msg import Float32MultiArray
        self.actions: list[list[float]] = []
        self._lock = threading.Lock()
        self._sub = ros_node.create_subscription(Float32MultiArray, f"{node.namespace}/flashrt/action",
                                                 self._on_action, 1000)

    def _on_action(self, msg: Any) -> None:
        with self._lock:
            self.actions.append(list(msg.data))

    def snapshot(self) -> list[list[float]]:
        with self._lock:
            return list(self.actions)

    def connected(self) -> bool:
        """Whether the node's action publisher is matched (before it, actions would be missed)."""
        return self._sub.get_publisher_count() > 0


@pytest.fixture(scope="module")
def policy_node(tmp_path_factory, request):
    """A policy node (run_mode=goal) named after the test module's NODE_NAME."""
    name = request.module.NODE_NAME
    with active_node(tmp_path_factory.mktemp(name), name, POLICY_PARAMS) as n:
        yield n


@pytest.fixture(scope="module")
def policy_env(policy_node, ros_node):  # noqa: F811
    """(client, action log) of the policy node: observations fed all along, actions recorded."""
    from flashrt_ros.client import FlashRTClient
    feed = ObservationFeed(ros_node, policy_node)
    actions = ActionLog(ros_node, policy_node)
    client = FlashRTClient(ros_node, f"{policy_node.namespace}/flashrt")
    wait_until(lambda: client.run_policy_ready() and client.wait_for("snapshot", 0.0), 60, "the node's servers")
    yield client, actions
    feed.close(ros_node)
