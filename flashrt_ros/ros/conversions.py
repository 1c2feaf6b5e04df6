"""Runtime objects <-> ROS messages, and exceptions -> response status fields."""
from __future__ import annotations

import logging
import traceback
from typing import Any, Mapping

from builtin_interfaces.msg import Time

from flashrt_ros.msg import CapsuleInfo, EngineStatus
from flashrt_ros.runtime.errors import ErrorCode, FlashRTError

log = logging.getLogger(__name__)


def time_msg(unix_s: float) -> Time:
    sec = int(unix_s)
    return Time(sec=sec, nanosec=int((unix_s - sec) * 1e9))


def capsule_info(capsule: Any) -> CapsuleInfo:
    """Metadata of a runtime capsule (Capsule or CapsuleSummary) as a CapsuleInfo message."""
    return CapsuleInfo(
        name=str(capsule.name),
        session=str(capsule.session),
        position=int(capsule.position),
        boundary_id=int(capsule.boundary_id),
        bytes=int(capsule.nbytes),
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
                        ("busy", bool), ("position", int), ("boundary_id", int),
                        ("capsule_count", int), ("arena_bytes", int), ("live_bytes", int),
                        ("device_bytes", int), ("host_bytes", int), ("disk_bytes", int),
                        ("step_p50_ms", float), ("step_p99_ms", float)):
        if status.get(field) is not None:
            setattr(msg, field, cast(status[field]))
    return msg
