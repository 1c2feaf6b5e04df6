"""Ctrl-C in the CLI: raised by the client's own waits, never inside rclpy.

A SIGINT lands wherever the main thread is. Raised inside rclpy's executor or action
client, the KeyboardInterrupt could leave a task half-run, and the goal cancel that
follows it waited for good (a CLI once hung 60 s after Ctrl-C on a generating goal,
`test_cli.py::test_ctrl_c_on_generate_cancels_the_goal_and_exits_130`). Here the signal
is sent from inside a timer callback the client's executor runs: exactly the unsafe spot.
"""
from __future__ import annotations

import os
import signal

import pytest
import rclpy

from flashrt_ros.client import FlashRTClient


@pytest.fixture
def lone_node():
    """A node no executor spins: the client spins it itself, as in the CLI."""
    owns = not rclpy.ok()
    if owns:
        rclpy.init()
    node = rclpy.create_node(f"sigint_probe_{os.getpid()}")
    yield node
    node.destroy_node()
    if owns:
        rclpy.try_shutdown()


def test_ctrl_c_inside_an_rclpy_callback_is_raised_by_the_wait_after_it(lone_node):
    client = FlashRTClient(lone_node, "/nobody/flashrt")
    steps: list[str] = []
    ticks: list[int] = []

    def callback() -> None:
        ticks.append(1)
        if not steps:
            steps.append("signalled")
            os.kill(os.getpid(), signal.SIGINT)     # the handler runs right here, inside the executor
            steps.append("callback ran to its end")

    lone_node.create_timer(0.01, callback)
    with client.sigint_at_safe_points():
        with pytest.raises(KeyboardInterrupt) as caught:
            client.wait_until(lambda: False, 60.0)
        assert steps == ["signalled", "callback ran to its end"]
        assert caught.traceback[-1].name == "_raise_if_interrupted"
        before = len(ticks)                          # the executor still works after it
        assert client.wait_until(lambda: len(ticks) > before + 2, 60.0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_before_the_next_wait_slice_raises_at_once(lone_node):
    client = FlashRTClient(lone_node, "/nobody/flashrt")
    with client.sigint_at_safe_points():
        os.kill(os.getpid(), signal.SIGINT)          # marked only
        with pytest.raises(KeyboardInterrupt) as caught:
            os.kill(os.getpid(), signal.SIGINT)      # a wait that never comes back: raise now
        assert caught.traceback[-1].name == "on_sigint"
