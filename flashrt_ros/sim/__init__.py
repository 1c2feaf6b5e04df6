"""Deterministic simulated worlds (the world side of closed-loop tests and demos).

No ROS, except ``node`` (the ``flashrt_sim`` ROS node of the MuJoCo arm, run as
``python -m flashrt_ros.sim.node``), which nothing here imports.
"""
from flashrt_ros.sim.reaching import ReachingConfig, ReachingTask

__all__ = ["ReachingConfig", "ReachingTask"]
