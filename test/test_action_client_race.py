"""A FlashRTClient made on a node that an executor already spins leaves that executor spinning.

rclpy (ros2/rclpy#1589) makes a new ActionClient visible to its node's executors (and wakes
them) before the client has its lock. An executor rebuilding its wait set in that window
raised ``AttributeError: 'ActionClient' object has no attribute '_lock'``, and a thread running
``executor.spin()`` ended there: in 1 of 10 fresh-clone runs ``test_arm_trees_ros``'s supervisor
(which makes its clients after starting its executor) then had ``/arm/flashrt/reset`` answer
nothing for 120 s. The window is microseconds wide, so the tests hold it open: the node's
``add_waitable`` returns only after the executor has counted the new client's entities.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest
import rclpy
from rclpy.action.client import ActionClient
from rclpy.executors import MultiThreadedExecutor
from std_srvs.srv import Trigger

from flashrt_ros.client import FlashRTClient
from flashrt_ros.client.action_client import RaceFreeActionClient
from waiting import scaled, wait_until


class SpinningNode:
    """A node spun by ``executor.spin()`` in a thread, as a user's script does it."""

    def __init__(self) -> None:
        self.context = rclpy.Context()
        self.context.init()
        self.node = rclpy.create_node("action_client_race", context=self.context)
        self.executor = MultiThreadedExecutor(num_threads=2, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.executor.shutdown()
        self.thread.join(scaled())
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def spinning() -> Iterator[SpinningNode]:
    s = SpinningNode()
    yield s
    s.close()


def hold_the_window_open(s: SpinningNode, monkeypatch: Any) -> list[tuple[Any, Any]]:
    """``add_waitable`` waits until the spinning executor has counted the new action client's entities.

    Returns (client, the lock it had when the executor looked) for each client added."""
    looked_at: set[int] = set()
    count = ActionClient.get_num_entities

    def counted_by_the_executor(self: Any) -> Any:
        if threading.current_thread() is s.thread:
            looked_at.add(id(self))
        return count(self)       # rclpy's own client raised here, in the executor's thread

    seen: list[tuple[Any, Any]] = []
    add = s.node.add_waitable

    def add_then_wait_for_the_executor(waitable: Any) -> None:
        add(waitable)            # wakes the executor, which rebuilds its wait set with the new client
        if isinstance(waitable, ActionClient):
            wait_until(lambda: id(waitable) in looked_at or not s.thread.is_alive(),
                       what="the spinning executor to look at the new action client")
            assert s.thread.is_alive(), "the executor's spin thread died on the half-made action client"
            seen.append((waitable, waitable.__dict__.get("_lock")))
    monkeypatch.setattr(ActionClient, "get_num_entities", counted_by_the_executor)
    monkeypatch.setattr(s.node, "add_waitable", add_then_wait_for_the_executor)
    return seen


def test_the_executor_keeps_spinning_when_a_client_is_made_under_it(spinning, monkeypatch):
    hold_the_window_open(spinning, monkeypatch)
    FlashRTClient(spinning.node, "/race/flashrt")
    spinning.node.create_service(Trigger, "/race_probe", lambda _req, resp: setattr(resp, "success", True) or resp)
    caller = spinning.node.create_client(Trigger, "/race_probe")
    assert caller.wait_for_service(timeout_sec=scaled())
    future = caller.call_async(Trigger.Request())
    wait_until(future.done, what="a reply through the same executor")
    assert future.result().success


def test_the_lock_an_executor_saw_in_the_window_is_the_one_the_client_keeps(spinning, monkeypatch):
    seen = hold_the_window_open(spinning, monkeypatch)
    client = FlashRTClient(spinning.node, "/race/flashrt")
    assert [w for w, _ in seen] == [client._generate, client._run_policy]
    for waitable, lock_then in seen:
        assert isinstance(waitable, RaceFreeActionClient)
        assert lock_then is not None and waitable._lock is lock_then
