"""Deterministic simulated tasks (the world side of closed-loop tests); no ROS."""
from flashrt_ros.sim.reaching import ReachingConfig, ReachingTask

__all__ = ["ReachingConfig", "ReachingTask"]
