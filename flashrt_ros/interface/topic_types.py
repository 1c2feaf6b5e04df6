"""A topic another process declared, seen from ours: its message type by name, and a subscription QoS that
matches its publishers.

Why here, neutral: the behaviour trees read topics (``bt.topics``) and ``flashrt watch-commands`` listens to a
controller's (``ros.command_watch``); neither front-end should lean on the other for it. rclpy is imported
when a profile is built, as in ``interface.qos``.
"""
from __future__ import annotations

import importlib
from typing import Any


class TopicError(ValueError):
    """A topic, type, field or value that cannot be used (the message says why)."""


def normalise_type(name: str) -> str:
    """``std_msgs/Bool`` or ``std_msgs/msg/Bool`` -> ``std_msgs/msg/Bool``."""
    parts = name.strip().split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3 or parts[1] != "msg" or not all(parts):
        raise TopicError(f"message type {name!r}: write it as package/msg/Type (e.g. std_msgs/msg/Bool)")
    return "/".join(parts)


def message_class(type_name: str) -> type:
    """The Python class of ``package/msg/Type``."""
    package, _, name = normalise_type(type_name).split("/")
    try:
        return getattr(importlib.import_module(f"{package}.msg"), name)
    except (ImportError, AttributeError) as exc:
        raise TopicError(f"message type {type_name!r} is not installed here ({exc})") from None


def any_publisher_qos() -> Any:
    """Best effort and volatile: matches any publisher (what a subscription takes before it has found one)."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    return QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)


def adapted_qos(publishers: list[Any]) -> Any:
    """The subscription QoS that matches every publisher found (as ``ros2 topic echo`` does): reliable if they all
    are, transient local if they all are; ``any_publisher_qos()`` if none is found."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    if not publishers:
        return any_publisher_qos()
    reliable = all(p.qos_profile.reliability == ReliabilityPolicy.RELIABLE for p in publishers)
    latched = all(p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers)
    return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)
