"""BackgroundExecutor.stop leaves no callback behind: no "exception was never retrieved: cannot use
Destroyable because destruction was requested" (``executor.shutdown()`` while spinning printed it
in 1 to 6 of 30 stops of this very loop; the MuJoCo demo printed it at exit)."""
from __future__ import annotations

import gc

import rclpy
from rclpy.executors import MultiThreadedExecutor

from flashrt_ros.client.background_executor import BackgroundExecutor
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
