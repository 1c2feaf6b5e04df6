"""Robot I/O without ROS: sensor data -> policy tensors, freshness of inputs, commands.

The ROS layer (``flashrt_ros.ros.policy_io``) unpacks messages into plain
Python/numpy values and calls these functions; all tensor math lives here.
"""
