"""pytest fixtures: rclpy in this process with a background executor."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import rclpy
from rclpy.executors import MultiThreadedExecutor

from flashrt_ros.client.background_executor import BackgroundExecutor
from rosproc import NodeUnderTest


@pytest.fixture(scope="module")
def ros_node():
    """A client node spun by a MultiThreadedExecutor in a background thread."""
    rclpy.init()
    node = rclpy.create_node("flashrt_test_client")
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    spinner = BackgroundExecutor(executor)
    try:
        yield node
    finally:
        spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()


@contextmanager
def active_node(tmp_path: Path, name: str, params: dict[str, str] | None = None) -> Iterator[NodeUnderTest]:
    """A flashrt node in a subprocess, active; afterwards it must stop with status 0, no traceback and
    no unretrieved exception."""
    n = NodeUnderTest(tmp_path, name, params or {})
    try:
        n.wait_active()
        yield n
    except BaseException:
        n.stop()                 # a failing test must not leave its node answering the next one
        raise
    assert n.stop() == 0, n.log.read_text()
    assert "Traceback" not in n.log.read_text(), n.log.read_text()
    assert "never retrieved" not in n.log.read_text(), n.log.read_text()       # a clean shutdown (issue #50)


def client_of(n: NodeUnderTest, ros_node) -> Any:
    """A FlashRTClient for ``n``, spun by the ``ros_node`` fixture's executor."""
    from flashrt_ros.client import FlashRTClient
    return FlashRTClient(ros_node, f"{n.namespace}/flashrt")
