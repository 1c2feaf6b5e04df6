"""BackgroundExecutor.stop and the node's own shutdown leave no callback behind: no "exception was never
retrieved: cannot use Destroyable because destruction was requested" (``executor.shutdown()`` while
spinning printed it in 1 to 6 of 30 stops of this very loop; the MuJoCo demo printed it at exit, and
every flashrt node after SIGINT or SIGTERM, issue #50)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rosproc import NodeUnderTest

REPO = Path(__file__).resolve().parents[1]


_STOP_LOOP = """
import faulthandler
faulthandler.enable()        # a native crash (one SIGSEGV in 17 runs, 2026-12-07) prints every thread's stack
import gc, sys
import rclpy
from rclpy.executors import MultiThreadedExecutor
sys.path.insert(0, "test")
from flashrt_ros.client.background_executor import BackgroundExecutor
from waiting import wait_until
rclpy.init()
try:
    for i in range(100):
        node = rclpy.create_node(f"spin_stop_{i}")
        ticks = []
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
print("stopped 100 times")
"""


def test_stopping_a_busy_executor_leaves_no_unretrieved_exception():
    """100 start / stop cycles of a busy executor in a process of its own (what the test measures is that
    process's stderr; in the suite's long-lived process, once after ~40 minutes of other tests and their
    threads, ``destroy_node`` never returned: bounded here, a hang fails the test)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", _STOP_LOOP], cwd=str(REPO), env=env, capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"100 executor stops did not finish in 300 s: {exc.stdout!r} {exc.stderr!r}")
    assert proc.returncode == 0 and "stopped 100 times" in proc.stdout, proc.stdout + proc.stderr
    assert "never retrieved" not in proc.stderr, proc.stderr


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
