"""launch_testing test of launch/mujoco_demo.launch.py (runs where ROS 2 launch is installed).

On a bare machine launch/launch_testing are not installable from PyPI, so this module is
skipped with that reason; test_mujoco_demo.py runs the same three nodes in one process.
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
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.launch_test
def generate_test_description():
    demo = launch.actions.IncludeLaunchDescription(
        PythonLaunchDescriptionSource(os.path.join(HERE, "..", "launch", "mujoco_demo.launch.py")))
    return launch.LaunchDescription([demo, launch_testing.actions.ReadyToTest()])


class TestDemoResumesBitIdentically(unittest.TestCase):
    def test_supervisor_reports_bit_identical(self, proc_output):
        proc_output.assertWaitFor("BIT-IDENTICAL", timeout=300)
