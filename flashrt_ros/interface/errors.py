"""The error codes: stable numbers every response, result and exception carries.

Why here: the runtime raises them (``runtime.errors``: an exception per code), the node puts
them into every service response and action result, and clients, the CLI and the trees name
them (``STALE_INPUTS``); ``msg/ErrorCodes.msg`` and every .srv/.action file repeat them as
constants, generated from ``DESCRIPTIONS`` (``python -m flashrt_ros.interface.generate``).
Pure Python, so the runtime stays ROS-free. Never renumber, only append.
"""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Stable error codes shared by the runtime, the engines and the services."""

    OK = 0
    NOT_FOUND = 1
    INVALID_NAME = 2
    ALREADY_EXISTS = 3
    FINGERPRINT_MISMATCH = 4
    LAYOUT_MISMATCH = 5
    CORRUPT = 6
    BUDGET_EXHAUSTED = 7
    NOT_ACTIVE = 8
    BUSY = 9
    INVALID_ARGUMENT = 10
    IO_ERROR = 11
    CONTEXT_OVERFLOW = 12
    TIMEOUT = 13
    PINNED = 14
    CANCELLED = 15      # the node stopped the work (a goal ended by deactivate); a client's own
                        # cancel reports stop_reason "cancelled" with success
    LEASE_EXPIRED = 16  # a goal's client stopped renewing its lease (it died or hangs): the node ended it
    STALE_INPUTS = 17   # a RunPolicy goal waited longer than its stale_timeout_s for fresh inputs
    INPUT_REJECTED = 18  # ... while the node refused its input messages (their text names topic and why)
    NODE_GONE = 19      # client side: the node stopped beating (died, froze) or restarted while a call waited
    INTERNAL = 99


#: One line per code: the comment of its constant in the interface files.
DESCRIPTIONS: dict[ErrorCode, str] = {
    ErrorCode.OK: "no error",
    ErrorCode.NOT_FOUND: "no capsule of that name",
    ErrorCode.INVALID_NAME: "name breaks the naming rules",
    ErrorCode.ALREADY_EXISTS: "name taken and overwrite not set",
    ErrorCode.FINGERPRINT_MISMATCH: "capsule from another model/weights",
    ErrorCode.LAYOUT_MISMATCH: "capsule from another arena layout",
    ErrorCode.CORRUPT: "hash, size or format check failed",
    ErrorCode.BUDGET_EXHAUSTED: "no tier has room, even after eviction",
    ErrorCode.NOT_ACTIVE: "node is not in the active lifecycle state",
    ErrorCode.BUSY: "engine is busy (e.g. a generation already runs)",
    ErrorCode.INVALID_ARGUMENT: "a request field is out of range",
    ErrorCode.IO_ERROR: "disk read/write failed",
    ErrorCode.CONTEXT_OVERFLOW: "max_context would be exceeded",
    ErrorCode.TIMEOUT: "no committed boundary was reached in time",
    ErrorCode.PINNED: "pinned capsules cannot be dropped or evicted",
    ErrorCode.CANCELLED: "the node stopped the work (e.g. a goal ended by deactivate)",
    ErrorCode.LEASE_EXPIRED: "the goal's client stopped renewing its lease: the node ended it",
    ErrorCode.STALE_INPUTS: "the goal waited longer than its stale_timeout_s for fresh inputs",
    ErrorCode.INPUT_REJECTED: "the goal waited past its stale_timeout_s on input messages the node refuses "
                              "(an image encoding, a JointState lacking joints)",
    ErrorCode.NODE_GONE: "client side: the node stopped its heartbeat or restarted while the call waited",
    ErrorCode.INTERNAL: "unexpected failure; see the node log",
}


#: The docs/services.md table says more than the interface files' one line for these.
DOCS: dict[ErrorCode, str] = {
    **DESCRIPTIONS,
    ErrorCode.CANCELLED: "the node stopped the work: a goal ended by `deactivate` or by the node's shutdown "
                         "(SIGINT/SIGTERM) is aborted with it (a goal the client cancels reports "
                         "`stop_reason: cancelled` instead)",
    ErrorCode.LEASE_EXPIRED: "the goal's client stopped renewing its lease (it died or hangs): the node ended "
                             "the goal and published `hold_command`",
    ErrorCode.STALE_INPUTS: "a RunPolicy goal waited longer than its `stale_timeout_s` for fresh inputs (missing, "
                            "too old, out of sync); the message names what it waited for",
    ErrorCode.INPUT_REJECTED: "a RunPolicy goal waited longer than its `stale_timeout_s` while the node refused its "
                              "input messages (an image encoding it cannot convert, a JointState lacking a joint "
                              "of `input_joint_names`, an array of the wrong length); the message names the topic "
                              "and why, in the words of `~/status`'s `inputs_detail` and the goal's waiting "
                              "feedback. A goal whose policy step raised ends with `INTERNAL` (`policy step "
                              "failed: ...`)",
    ErrorCode.NODE_GONE: "reported by the client, never by the node: while a call or goal waited, the node's "
                         "`~/node_heartbeat` went silent for 5 periods (2.5 s: the process died or froze) or came "
                         "back with another `instance_id` (the node restarted: a goal it ran is gone)",
}


def constant_name(code: ErrorCode) -> str:
    """The code's constant in the interface files (``OK`` is ``NONE`` there)."""
    return "NONE" if code is ErrorCode.OK else code.name


def code_name(code: int) -> str:
    """An error code's name (``STALE_INPUTS``), or its number if this version does not know it."""
    try:
        return ErrorCode(int(code)).name
    except ValueError:
        return str(int(code))
