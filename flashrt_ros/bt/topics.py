"""Topics seen from a behaviour tree: the latest message of a topic, a field compared, a message sent.

Why: a tree has to see the world (an operator's override switch, the arm at its
target) and sometimes to say something to it. ``TopicCache`` subscribes on first
use and keeps the latest message of each topic with its receipt time; nothing
here blocks, so a tick never waits. A subscription adapts to the publishers it
finds (as ``ros2 topic echo`` does): reliable if they all are, transient local if
they all are (then the latest message published before the subscription arrives
too), else best effort and volatile, which matches any publisher; a volatile
topic's messages published before the subscription are not seen (give the tree a
default with ``-b``). The executor that spins the tree's ROS node delivers the
messages between ticks.

Types are written as ROS writes them (``std_msgs/msg/Bool``; ``std_msgs/Bool``
works too). Without one, the topic's type is looked up on the ROS graph, so it
must be advertised first.
"""
from __future__ import annotations

import operator
import re
import threading
import time
from typing import Any, Callable

from rclpy.qos import QoSProfile, ReliabilityPolicy

from flashrt_ros.interface.topic_types import TopicError, adapted_qos, message_class, normalise_type  # noqa: F401
from flashrt_ros.interface.tree_nodes import COMPARISONS

OPERATORS: dict[str, Callable[[Any, Any], bool]] = dict(zip(
    COMPARISONS, (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)))

#: std_msgs scalar types a value can be written to / read from as ``data``: the Python type of ``data``.
SCALARS: dict[str, type] = {
    "std_msgs/msg/Bool": bool, "std_msgs/msg/String": str, "std_msgs/msg/Float32": float,
    "std_msgs/msg/Float64": float, **{f"std_msgs/msg/{k}Int{n}": int for k in ("", "U") for n in (8, 16, 32, 64)}}
ARRAYS = ("std_msgs/msg/Float32MultiArray", "std_msgs/msg/Float64MultiArray", "std_msgs/msg/Int32MultiArray",
          "std_msgs/msg/Int64MultiArray")


def parse_value(text: str, kind: type) -> Any:
    """A port's text as a value of ``kind`` (bool: true/false/1/0; int: a whole number)."""
    text = text.strip()
    if kind is bool:
        low = text.lower()
        if low not in ("true", "false", "1", "0"):
            raise TopicError(f"{text!r} is not a bool (true or false)")
        return low in ("true", "1")
    if kind is str:
        return text
    try:
        number = float(text)
    except ValueError:
        raise TopicError(f"{text!r} is not a number") from None
    if kind is int:
        if not number.is_integer():
            raise TopicError(f"{text!r} is not a whole number")
        return int(number)
    return number


def field_value(msg: Any, path: str) -> Any:
    """``msg``'s field at ``path`` (``data``, ``position[1]``, ``header.frame_id``)."""
    value = msg
    for part in path.split("."):
        match = re.fullmatch(r"(\w+)(?:\[(-?\d+)\])?", part)
        if match is None:
            raise TopicError(f"field {path!r}: write fields as name, name.sub or name[index]")
        name, index = match.groups()
        if not hasattr(value, name):
            fields = sorted(getattr(value, "get_fields_and_field_types", dict)())
            raise TopicError(f"field {path!r}: {type(value).__name__} has no field {name!r} (its fields: {fields})")
        value = getattr(value, name)
        if index is not None:
            try:
                value = value[int(index)]
            except IndexError:
                raise TopicError(f"field {path!r}: index {index} out of range (length {len(value)})") from None
    return value


def compare(actual: Any, op: str, text: str) -> bool:
    """``actual <op> text``, ``text`` read as a bool, a number or a string as ``actual`` is."""
    if op not in OPERATORS:
        raise TopicError(f"op {op!r}: use one of {' '.join(OPERATORS)}")
    if hasattr(actual, "item") and not isinstance(actual, (bool, int, float, str)):   # numpy scalars
        actual = actual.item()
    kind = bool if isinstance(actual, bool) else float if isinstance(actual, (int, float)) else str
    if kind is str and not isinstance(actual, str):
        raise TopicError(f"cannot compare a {type(actual).__name__} (name a scalar field, e.g. data[0])")
    return bool(OPERATORS[op](actual, parse_value(text, kind)))


class TopicCache:
    """The latest message of every topic a tree reads, and publishers for the topics it writes."""

    def __init__(self, ros_node: Any) -> None:
        self.node = ros_node
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[Any, float]] = {}    # topic -> (message, monotonic receipt time)
        self._types: dict[str, str] = {}                   # topic -> its type, once subscribed
        self._subs: dict[str, Any] = {}
        self._pubs: dict[tuple[str, str], Any] = {}
        self.on_message: Callable[[str, Any], None] | None = None   # (topic, message), from the executor

    def resolve_type(self, topic: str, type_name: str = "") -> str | None:
        """``type_name`` normalised, else the topic's advertised type (None while nobody advertises it)."""
        if type_name:
            return normalise_type(type_name)
        known = self._types.get(topic)
        if known:
            return known
        types = dict(self.node.get_topic_names_and_types()).get(topic)
        if not types:
            return None
        if len(types) > 1:
            raise TopicError(f"topic {topic} is advertised with several types {types}: give its type")
        return normalise_type(types[0])

    def subscribe(self, topic: str, type_name: str = "", wait_for_publisher: bool = False) -> bool:
        """Subscribe to ``topic`` if not yet (False while its type is unknown, or, with
        ``wait_for_publisher``, while nobody publishes it: not advertised yet)."""
        with self._lock:
            if topic in self._subs:
                if type_name and normalise_type(type_name) != self._types[topic]:
                    raise TopicError(f"topic {topic} is read as {self._types[topic]} elsewhere in the tree, "
                                     f"not {type_name}")
                return True
        resolved = self.resolve_type(topic, type_name)
        if resolved is None or (wait_for_publisher and not self.node.get_publishers_info_by_topic(topic)):
            return False
        cls = message_class(resolved)
        with self._lock:
            if topic not in self._subs:
                self._types[topic] = resolved
                self._subs[topic] = self.node.create_subscription(
                    cls, topic, lambda msg, t=topic: self._receive(t, msg),
                    adapted_qos(self.node.get_publishers_info_by_topic(topic)))
        return True

    def _receive(self, topic: str, msg: Any) -> None:
        with self._lock:
            self._latest[topic] = (msg, time.monotonic())
        if self.on_message is not None:
            self.on_message(topic, msg)

    def latest(self, topic: str) -> tuple[Any, float] | None:
        """(message, age in s) of the newest message on ``topic``, or None."""
        with self._lock:
            entry = self._latest.get(topic)
        return None if entry is None else (entry[0], time.monotonic() - entry[1])

    def publish(self, topic: str, type_name: str, value: str) -> Any:
        """Publish one message built from ``value`` (``data`` of a std_msgs scalar, ``a;b;c`` for an
        array type); returns it."""
        resolved = normalise_type(type_name)
        cls = message_class(resolved)
        if resolved in SCALARS:
            msg = cls(data=parse_value(value, SCALARS[resolved]))
        elif resolved in ARRAYS:
            kind = float if "Float" in resolved else int
            msg = cls(data=[parse_value(v, kind) for v in value.split(";") if v.strip()])
        else:
            raise TopicError(f"Publish writes std_msgs scalars ({', '.join(sorted(SCALARS))}) and arrays "
                             f"({', '.join(ARRAYS)}), not {resolved}")
        key = (topic, resolved)
        if key not in self._pubs:
            self._pubs[key] = self.node.create_publisher(
                cls, topic, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self._pubs[key].publish(msg)
        return msg

    def close(self) -> None:
        for sub in self._subs.values():
            self.node.destroy_subscription(sub)
        for pub in self._pubs.values():
            self.node.destroy_publisher(pub)
        self._subs.clear()
        self._pubs.clear()
