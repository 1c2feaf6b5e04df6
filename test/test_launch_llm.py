"""launch_testing test of launch/flashrt_llm.launch.py (runs where ROS 2 launch is installed).

On a distro: `colcon test --packages-select flashrt_ros` (or `launch_test test/test_launch_llm.py`).
On a bare machine launch/launch_testing are not installable from PyPI, so this module is
skipped with that reason; test_node_*.py cover the same behaviour with rclpy directly.
"""
from __future__ import annotations

import os
import unittest

import pytest

launch_testing = pytest.importorskip(
    "launch_testing", reason="launch_testing is not installed (not on PyPI); runs under colcon test "
    "on a ROS 2 distro")
import launch  # noqa: E402
import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.launch_test
def generate_test_description():
    llm = launch.actions.IncludeLaunchDescription(
        PythonLaunchDescriptionSource(os.path.join(HERE, "..", "launch", "flashrt_llm.launch.py")),
        launch_arguments={"params_file": os.path.join(HERE, "params_tiny_llm.yaml")}.items())
    return launch.LaunchDescription([llm, launch_testing.actions.ReadyToTest()])


class TestNodeBecomesActive(unittest.TestCase):
    def test_node_reports_active(self, proc_output):
        proc_output.assertWaitFor("active: serving capsule services", timeout=120, stream="stderr")


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0, -2, -15])
