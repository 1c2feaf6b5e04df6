"""Launch the flashrt lifecycle node with the llm engine, configured and activated.

Arguments: params_file (default: this package's config/llm.yaml), namespace
(default: empty, so services are /flashrt/...), autostart (default true: emit
configure, then activate once configured, as ros2/demos lifecycle_py does).
"""
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


def generate_launch_description() -> LaunchDescription:
    params_file = LaunchConfiguration("params_file")
    autostart = LaunchConfiguration("autostart")
    node = LifecycleNode(
        package="flashrt_ros", executable="flashrt_node", name="flashrt",
        namespace=LaunchConfiguration("namespace"), output="screen",
        parameters=[params_file])
    configure = EmitEvent(event=ChangeState(
        lifecycle_node_matcher=matches_action(node), transition_id=Transition.TRANSITION_CONFIGURE),
        condition=IfCondition(autostart))
    activate_when_configured = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=node, goal_state="inactive",
        entities=[EmitEvent(event=ChangeState(
            lifecycle_node_matcher=matches_action(node),
            transition_id=Transition.TRANSITION_ACTIVATE))]),
        condition=IfCondition(autostart))
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution(
            [FindPackageShare("flashrt_ros"), "config", "llm.yaml"]),
            description="ROS parameters file for the node"),
        DeclareLaunchArgument("namespace", default_value="", description="node namespace"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure and activate on launch"),
        node, activate_when_configured, configure,
    ])
