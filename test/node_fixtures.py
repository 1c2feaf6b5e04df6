"""pytest fixtures: rclpy in this process with a background executor."""
from __future__ import annotations

import threading

import pytest
import rclpy
from rclpy.executors import MultiThreadedExecutor


@pytest.fixture(scope="module")
def ros_node():
    """A client node spun by a MultiThreadedExecutor in a background thread."""
    rclpy.init()
    node = rclpy.create_node("flashrt_test_client")
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        executor.shutdown()
        thread.join(5)
        node.destroy_node()
        rclpy.try_shutdown()
