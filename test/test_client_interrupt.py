"""Ctrl-C in the CLI: raised by the client's own waits, never inside rclpy.

A SIGINT lands wherever the main thread is. Raised inside rclpy's executor or action
client, the KeyboardInterrupt could leave a task half-run, and the goal cancel that
follows it could wait for good. Here the signal is sent from inside a timer callback the
client's executor runs: exactly the unsafe spot. A SIGINT the process started with
ignored stays ignored, as Python leaves it.
"""
from __future__ import annotations

import os
import signal

import pytest
import rclpy

from flashrt_ros.client import FlashRTClient


@pytest.fixture
def sigint(request):
    """SIGINT's disposition for the test (a suite started with ``&`` inherits it ignored)."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, before)


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


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_ctrl_c_inside_an_rclpy_callback_is_raised_by_the_wait_after_it(lone_node, sigint):
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
        assert caught.traceback[-1].name == "raise_if_interrupted"
        before = len(ticks)                          # the executor still works after it
        assert client.wait_until(lambda: len(ticks) > before + 2, 60.0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_a_second_ctrl_c_before_the_next_wait_slice_raises_at_once(lone_node, sigint):
    client = FlashRTClient(lone_node, "/nobody/flashrt")
    with client.sigint_at_safe_points():
        os.kill(os.getpid(), signal.SIGINT)          # marked only
        with pytest.raises(KeyboardInterrupt) as caught:
            os.kill(os.getpid(), signal.SIGINT)      # a wait that never comes back: raise now
        assert caught.traceback[-1].name == "on_signal"


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_an_ignored_sigint_stays_ignored(lone_node, sigint):
    client = FlashRTClient(lone_node, "/nobody/flashrt")
    with client.sigint_at_safe_points():
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)
        assert client.wait_until(lambda: False, 0.2) is False      # nothing raised
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_sigterm_is_raised_as_terminated_at_the_next_safe_point(lone_node, sigint):
    from flashrt_ros.client import Terminated
    client = FlashRTClient(lone_node, "/nobody/flashrt")
    before = signal.getsignal(signal.SIGTERM)
    with client.sigint_at_safe_points():
        os.kill(os.getpid(), signal.SIGTERM)         # marked only: the process lives on
        with pytest.raises(Terminated) as caught:
            client.wait_until(lambda: False, 60.0)
        assert caught.traceback[-1].name == "raise_if_interrupted"
    assert isinstance(caught.value, KeyboardInterrupt)      # every Ctrl-C path handles it too
    assert signal.getsignal(signal.SIGTERM) is before
