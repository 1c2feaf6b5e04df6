"""Execution-state runtime: arena, capsules, store. Pure torch, no ROS."""
