"""The policy's output: how an action becomes a command message on the output topic.

Why apart from the control loop (``policy_io.py``): like the inputs (``policy_inputs.py``),
decided once on activate from the robot I/O parameters (``output_type``, ``output_topic``,
``output_joint_names``, the QoS), and refused there, naming the parameter, when it cannot carry
the policy's action. Message types: ``std_msgs/Float32MultiArray`` or ``Float64MultiArray``
(a forward command controller), ``sensor_msgs/JointState``, ``trajectory_msgs/JointTrajectory``
(the action now and the actions already planned, ``robot_io.commands.trajectory_points``).
"""
from __future__ import annotations

from typing import Any, Callable

from builtin_interfaces.msg import Duration as DurationMsg
from rclpy.qos import QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.robot_io.commands import command_values, trajectory_points
from flashrt_ros.ros.policy_inputs import RELIABILITY
from flashrt_ros.runtime.errors import InvalidArgument

#: ``output_type`` -> message type
MESSAGE_TYPES = {"float32_array": Float32MultiArray, "float64_array": Float64MultiArray,
                 "joint_state": JointState, "joint_trajectory": JointTrajectory}


def command_publisher(node: Any, io: RobotIOConfig, action_dim: int, period_s: float,
                      planned_actions: Callable[[], Any]) -> tuple[Any, Callable[..., None]]:
    """``(publisher, publish(action, planned=None))``; ``planned_actions()`` gives the actions already planned
    (a trajectory command), unless the caller passes them."""
    qos = QoSProfile(depth=io.output_qos_depth, reliability=RELIABILITY[io.output_qos_reliability])
    joints = list(io.output_joint_names)
    kind = io.output_type
    if kind in ("joint_state", "joint_trajectory") and not joints:
        raise InvalidArgument(f"output_type {kind} needs output_joint_names")
    n = len(joints) or action_dim
    if n != action_dim:
        raise InvalidArgument(f"output_joint_names names {n} joints but the policy's action has {action_dim} values")
    msg_type = MESSAGE_TYPES[kind]
    pub = node.create_publisher(msg_type, io.output_topic, qos)
    stamp = lambda: node.get_clock().now().to_msg()  # noqa: E731

    def publish(action: Any, planned: Any = None) -> None:
        values = command_values(action, n)
        if kind in ("float32_array", "float64_array"):
            pub.publish(msg_type(data=values))
        elif kind == "joint_state":
            msg = JointState(name=joints, position=values)
            msg.header.stamp = stamp()
            pub.publish(msg)
        else:
            if planned is None:
                planned = planned_actions()
            msg = JointTrajectory(joint_names=joints)
            msg.header.stamp = stamp()
            msg.points = [JointTrajectoryPoint(positions=p, time_from_start=_duration(t))
                          for p, t in trajectory_points(action, planned, period_s)]
            pub.publish(msg)
    return pub, publish


def _duration(seconds: float) -> DurationMsg:
    sec = int(seconds)
    return DurationMsg(sec=sec, nanosec=int(round((seconds - sec) * 1e9)))
