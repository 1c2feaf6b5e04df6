"""Launch flashrt_node with the policy engine (config/policy.yaml), configured and activated.

Arguments: params_file, namespace, autostart (see flashrt_ros/ros/launch_description.py).
"""
from flashrt_ros.ros.launch_description import flashrt_launch_description


def generate_launch_description():
    return flashrt_launch_description("policy")
