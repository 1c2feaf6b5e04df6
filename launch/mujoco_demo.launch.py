"""The MuJoCo arm demo as three processes: sim, policy node, behaviour-tree supervisor.

    ros2 launch flashrt_ros mujoco_demo.launch.py

The policy node runs the trained ACT checkpoint (flashrt_ros/sim/checkpoints/arm_act,
``policy:=lerobot:<dir>``); ``policy:=diffusion`` picks the Diffusion Policy one.
Needs a ROS 2 distro (launch / launch_ros are not on PyPI); without one, run the same
demo in one process: python examples/mujoco_interrupt_resume.py (docs/robot_io.md).
"""
import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from flashrt_ros.sim.arm_policy import trained_policy_spec


def _policy_node(context, params):
    spec = trained_policy_spec(LaunchConfiguration("policy").perform(context))
    return [ExecuteProcess(cmd=[sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args",
                                "-r", "__ns:=/arm", "--params-file", params.perform(context), "-p", f"policy:={spec}",
                                "-p", "input_environment_state_topic:=/sim/target"],
                           output="screen")]


def generate_launch_description():
    params = PathJoinSubstitution([FindPackageShare("flashrt_ros"), "config", "arm_demo.yaml"])
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "mujoco_interrupt_resume.py")
    return LaunchDescription([
        DeclareLaunchArgument("policy", default_value="act", description="trained checkpoint: act or diffusion"),
        SetEnvironmentVariable("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl")),
        ExecuteProcess(cmd=[sys.executable, "-m", "flashrt_ros.sim.node", "--ros-args",
                            "-r", "__node:=sim", "-p", "seed:=0"], output="screen"),
        OpaqueFunction(function=_policy_node, args=[params]),
        ExecuteProcess(cmd=[sys.executable, example, "--external", "--policy",
                            LaunchConfiguration("policy")], output="screen"),
    ])
