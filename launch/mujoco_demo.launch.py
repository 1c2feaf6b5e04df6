"""The MuJoCo arm demo as three processes: sim, policy node, behaviour-tree supervisor.

    ros2 launch flashrt_ros mujoco_demo.launch.py

Needs a ROS 2 distro (launch / launch_ros are not on PyPI); without one, run the same
demo in one process: python examples/mujoco_interrupt_resume.py (docs/robot_io.md).
"""
import os
import sys

from launch import LaunchDescription
from launch.actions import ExecuteProcess, SetEnvironmentVariable
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    params = PathJoinSubstitution([FindPackageShare("flashrt_ros"), "config", "arm_demo.yaml"])
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "mujoco_interrupt_resume.py")
    return LaunchDescription([
        SetEnvironmentVariable("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl")),
        ExecuteProcess(cmd=[sys.executable, "-m", "flashrt_ros.ros.sim_node", "--ros-args",
                            "-r", "__node:=sim", "-p", "seed:=0"], output="screen"),
        ExecuteProcess(cmd=[sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args",
                            "-r", "__ns:=/arm", "--params-file", params], output="screen"),
        ExecuteProcess(cmd=[sys.executable, example, "--external"], output="screen"),
    ])
