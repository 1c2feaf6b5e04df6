"""Runs the launch_testing test test/launch/namespaced_nodes_launch.py under plain pytest.

Why not launch_testing's pytest plugin: it declares hooks with the `path` argument that
pytest 9 removed (ros2/launch#979), so it aborts pytest at start-up (CMakeLists.txt
disables it with `-p no:launch_testing`). We call launch_testing's own runner, which
works under any pytest and is what `launch_test` does. Skips where launch_testing is
not installed (it is not on PyPI): on a ROS 2 distro `colcon test` runs it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("launch_testing", reason="launch_testing is not installed (not on PyPI); "
                    "runs under colcon test on a ROS 2 distro")
pytest.importorskip("launch_ros", reason="launch_ros is not installed (not on PyPI)")
from launch_testing.loader import LoadTestsFromPythonModule  # noqa: E402
from launch_testing.test_runner import LaunchTestRunner  # noqa: E402

LAUNCH_TEST = Path(__file__).resolve().parent / "launch" / "namespaced_nodes_launch.py"


def test_namespaced_launch() -> None:
    spec = importlib.util.spec_from_file_location("namespaced_nodes_launch", LAUNCH_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runner = LaunchTestRunner(test_runs=LoadTestsFromPythonModule(
        module, name="flashrt_ros.namespaced_nodes_launch"), launch_file_arguments=[])
    runner.validate()
    results = runner.run()
    details = [f"{test}: {trace}" for result in results.values()
               for test, trace in (*result.failures, *result.errors)]
    assert results, "no launch test ran"
    assert all(result.wasSuccessful() for result in results.values()), (
        "\n".join(details) or f"launch test failed: {results}")
    assert all(result.testsRun > 0 for result in results.values())
