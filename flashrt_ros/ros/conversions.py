"""Runtime objects <-> ROS messages, and exceptions -> response status fields.

Why range checks here: rclpy does not check field ranges when a field is set
(only when the message is serialized, inside the executor, where an error
would escape the callback and stop the node). So every number is checked when
it is converted, and ``sendable`` proves a whole response serializes before it
leaves the callback, replacing it with an INTERNAL error response if not.
"""
from __future__ import annotations

import logging
import math
import traceback
from typing import Any, Mapping

from builtin_interfaces.msg import Time
from rclpy.serialization import serialize_message

from flashrt_ros.msg import CapsuleInfo, EngineStatus
from flashrt_ros.runtime.errors import ErrorCode, FlashRTError

log = logging.getLogger(__name__)


INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT64 = (0, (1 << 64) - 1)


def checked_int(value: Any, bounds: tuple[int, int], what: str) -> int:
    """``int(value)`` if it fits the message field's range, else a clear error (never a crash later)."""
    v = int(value)
    if not bounds[0] <= v <= bounds[1]:
        raise FlashRTError(f"{what} = {v} does not fit its message field", ErrorCode.INTERNAL)
    return v


def time_msg(unix_s: float) -> Time:
    unix_s = float(unix_s)
    if not math.isfinite(unix_s) or not 0.0 <= unix_s < float(INT32[1] + 1):
        raise FlashRTError(f"time {unix_s!r} does not fit builtin_interfaces/Time", ErrorCode.INTERNAL)
    sec = int(unix_s)
    return Time(sec=sec, nanosec=min(int((unix_s - sec) * 1e9), 999_999_999))


def capsule_info(capsule: Any) -> CapsuleInfo:
    """Metadata of a runtime capsule (Capsule or CapsuleSummary) as a CapsuleInfo message
    (ranges checked)."""
    return CapsuleInfo(
        name=str(capsule.name),
        session=str(capsule.session),
        position=checked_int(capsule.position, INT64, "capsule position"),
        boundary_id=checked_int(capsule.boundary_id, INT64, "capsule boundary_id"),
        bytes=checked_int(capsule.nbytes, UINT64, "capsule bytes"),
        tier=str(capsule.tier),
        pinned=bool(capsule.pinned),
        fingerprint=str(capsule.fingerprint or ""),
        content_hash=str(capsule.content_hash or ""),
        created=time_msg(float(capsule.created_at)),
    )


def fill_error(response: Any, exc: BaseException, logger: Any | None = None) -> Any:
    """Map any exception onto success/error_code/message; never re-raise.

    FlashRTError carries its own stable code; anything else is INTERNAL and
    its traceback goes to the node log (not to the client).
    """
    response.success = False
    code = exc.code if isinstance(exc, FlashRTError) else ErrorCode.INTERNAL
    if isinstance(exc, FlashRTError):
        response.message = str(exc)
    else:
        response.message = f"internal error: {type(exc).__name__}: {exc}"
        text = "".join(traceback.format_exception(exc))
        (logger.error if logger else log.error)(f"unexpected failure\n{text}")
    if hasattr(response, "error_code"):          # std_srvs/Trigger has none
        response.error_code = int(code)
    else:
        response.message = f"[{code.name}] {response.message}"
    return response


def sendable(response: Any, logger: Any | None = None) -> Any:
    """``response`` if it serializes; else a fresh response of its type carrying INTERNAL."""
    try:
        serialize_message(response)
        return response
    except Exception as exc:  # noqa: BLE001 - whatever made it unsendable, the client gets an answer
        fresh = type(response)()
        return fill_error(fresh, RuntimeError(f"the response could not be serialized ({type(exc).__name__}: "
                                              f"{str(exc)[:200]})"), logger)


def fill_ok(response: Any, message: str = "ok") -> Any:
    response.success = True
    if hasattr(response, "error_code"):
        response.error_code = int(ErrorCode.OK)
    response.message = message
    return response


def engine_status(status: Mapping[str, Any], lifecycle_state: str, stamp: Time) -> EngineStatus:
    """The engine's status() dict as an EngineStatus message (unknown keys ignored)."""
    msg = EngineStatus(stamp=stamp, lifecycle_state=lifecycle_state)
    for field, cast in (("engine_kind", str), ("model", str), ("device", str), ("session", str),
                        ("busy", bool), ("paused", bool), ("step_p50_ms", float), ("step_p99_ms", float),
                        ("command_gap_max_ms", float), ("command_gap_p99_ms", float),
                        ("inputs_state", str), ("inputs_detail", str), ("goal_id", str),
                        ("goal_owner", str), ("goal_state", str)):
        if status.get(field) is not None:
            setattr(msg, field, cast(status[field]))
    for field in ("position", "boundary_id", "capsule_count", "arena_bytes", "live_bytes",
                  "device_bytes", "host_bytes", "disk_bytes", "policy_steps", "deadline_misses", "rejected_messages",
                  "speculative_tokens", "drafted_tokens", "accepted_tokens", "control_overruns"):
        if status.get(field) is not None:
            setattr(msg, field, checked_int(status[field], _field_bounds(msg, field), f"status {field}"))
    _replan_fields(msg, status.get("replan") or {})
    return msg


#: PolicyEngine.replan_status() keys -> EngineStatus fields (integers)
REPLAN_COUNTS = ("delay_steps", "chunk_steps", "launched", "merged", "late", "held", "dropped")


def _replan_fields(msg: EngineStatus, replan: Mapping[str, Any]) -> None:
    """The policy engine's replanning summary (mode, delay, what became of the plans) on ``msg``."""
    if replan.get("mode"):
        msg.replan_mode = str(replan["mode"])
    for key in REPLAN_COUNTS:
        if replan.get(key) is not None:
            field = f"replan_{key}"
            setattr(msg, field, checked_int(replan[key], _field_bounds(msg, field), f"status {field}"))
    if replan.get("turnaround_p95_ms") is not None:
        msg.replan_turnaround_p95_ms = float(replan["turnaround_p95_ms"])


def _field_bounds(msg: Any, field: str) -> tuple[int, int]:
    """The integer range of ``msg.field`` from its ROS type (int32/int64/uint32/uint64)."""
    kind = msg.get_fields_and_field_types().get(field, "")
    return {"int32": INT32, "int64": INT64, "uint32": (0, (1 << 32) - 1), "uint64": UINT64}[kind]
