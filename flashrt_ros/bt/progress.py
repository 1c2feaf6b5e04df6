"""What a behaviour tree sees of a request: its progress, its deadline by default, and the message
a failure carries (the node's error code by name)."""
from __future__ import annotations

import enum

from flashrt_ros.interface.errors import ErrorCode
from flashrt_ros.interface.tree_nodes import DEFAULT_TIMEOUT_S  # noqa: F401 - the trees' default deadline

#: what rclpy and the client raise for a field of the wrong type or range (a tree's bad port value)
BAD_FIELD = (ValueError, TypeError, AssertionError)


class Progress(enum.Enum):
    """A request's state as a tree sees it (front-ends map it to their status type)."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


def describe_failure(verb: str, code: int, message: str) -> str:
    """``"<verb> failed (<ERROR_NAME>): <message>"``: what a tree shows for a refused request."""
    try:
        tag = f" ({ErrorCode(code).name})" if code else ""
    except ValueError:
        tag = f" (error {code})"
    return f"{verb} failed{tag}: {message}"


def tagged(code: int, message: str) -> str:
    """``message`` with the error code's name, unless it already says it."""
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return message if not code or name in message else f"{message} (error {name})"
