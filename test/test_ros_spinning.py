"""BackgroundExecutor.stop and the node's own shutdown leave no callback behind: no "exception was never
retrieved: cannot use Destroyable because destruction was requested" (``executor.shutdown()`` while
spinning printed it in 1 to 6 of 30 stops of this very loop; the MuJoCo demo printed it at exit, and
every flashrt node after SIGINT or SIGTERM, issue #50)."""
from __future__ import annotations

import gc
import os
import signal

import pytest

import rclpy
from rclpy.executors import MultiThreadedExecutor

from flashrt_ros.client.background_executor import BackgroundExecutor
from rosproc import NodeUnderTest
from waiting import wait_until


def test_stopping_a_busy_executor_leaves_no_unretrieved_exception(capsys):
    gc.collect()           # an earlier test's unretrieved Task (test_ros_safety raises on purpose) is
    capsys.readouterr()    # printed when collected: flush it here, so only this test's stops count
    rclpy.init()
    try:
        for i in range(30):
            node = rclpy.create_node(f"spin_stop_{i}")
            ticks: list[int] = []
            node.create_timer(0.001, lambda: ticks.append(1))     # a callback dispatched all the time
            executor = MultiThreadedExecutor(num_threads=4)
            executor.add_node(node)
            spinner = BackgroundExecutor(executor)
            wait_until(lambda: len(ticks) >= 3, what="the timer to run")
            assert spinner.stop(), "dispatched callbacks did not finish"
            executor.remove_node(node)
            node.destroy_node()
            del executor, spinner
            gc.collect()          # an unretrieved Task exception is printed when the Task is collected
    finally:
        rclpy.try_shutdown()
    assert "never retrieved" not in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_policy_node_stopped_by_a_signal_leaves_a_clean_log(tmp_path, signum):
    """The control timer (50 Hz) always has a handler in the executor's pool: the node's shutdown
    must let it finish before the executor goes (it printed the line above on every stop)."""
    node = NodeUnderTest(tmp_path, "clean_exit", {"engine_kind": "policy", "policy": "gru", "device": "cpu"})
    node.wait_active()                  # the control timer ticks from here on
    os.killpg(node.proc.pid, signum)
    assert node.proc.wait(60) == 0, node.log.read_text()
    log = node.log.read_text()
    assert f"{signal.Signals(signum).name}: ending running goals, then exiting" in log, log
    assert "never retrieved" not in log and "Traceback" not in log and "Destroyable" not in log, log
