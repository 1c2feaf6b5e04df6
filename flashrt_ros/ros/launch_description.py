"""The launch description both launch files share (one engine config file apart).

Arguments: params_file (default: this package's config/<config>.yaml), namespace
(default empty, so services are /flashrt/...), autostart (default true: emit
configure, then activate once configuring has ended in inactive, as ros2/demos
lifecycle_py does; a later manual deactivate is left alone). The config files key
their parameters on ``/**`` so a namespaced or renamed node still gets them.
"""
from __future__ import annotations

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.conditions import IfCondition
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition


def flashrt_launch_description(config: str) -> LaunchDescription:
    """A lifecycle flashrt_node with config/<config>.yaml, configured and activated."""
    autostart = LaunchConfiguration("autostart")
    node = LifecycleNode(
        package="flashrt_ros", executable="flashrt_node", name="flashrt",
        namespace=LaunchConfiguration("namespace"), output="screen",
        parameters=[LaunchConfiguration("params_file")])

    def change(transition_id: int, **kwargs) -> EmitEvent:
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                           transition_id=transition_id), **kwargs)

    # Only configuring -> inactive activates: a later active -> deactivating -> inactive
    # (an operator's deactivate) must leave the node inactive.
    activate_when_configured = RegisterEventHandler(
        OnStateTransition(target_lifecycle_node=node, start_state="configuring",
                          goal_state="inactive",
                          entities=[change(Transition.TRANSITION_ACTIVATE)]),
        condition=IfCondition(autostart))
    configure = change(Transition.TRANSITION_CONFIGURE, condition=IfCondition(autostart))
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution(
            [FindPackageShare("flashrt_ros"), "config", f"{config}.yaml"]),
            description="ROS parameters file for the node"),
        DeclareLaunchArgument("namespace", default_value="", description="node namespace"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure and activate on launch"),
        node, activate_when_configured, configure,
    ])
