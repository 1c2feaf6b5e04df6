"""The engine's status as a diagnostic_msgs/DiagnosticArray (diagnostic_updater style)."""
from __future__ import annotations

from typing import Any, Mapping

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

KEYS = ("engine_kind", "model", "device", "session", "busy", "position", "boundary_id",
        "capsule_count", "arena_bytes", "live_bytes", "device_bytes", "host_bytes", "disk_bytes",
        "step_p50_ms", "step_p99_ms", "inputs_state", "inputs_detail", "policy_steps",
        "deadline_misses")


def diagnostics_message(node_name: str, status: Mapping[str, Any], lifecycle_state: str,
                        stamp: Time) -> DiagnosticArray:
    """One DiagnosticStatus: OK while active, WARN when inactive/unconfigured or the policy's
    inputs are stale (the policy is stopped), ERROR on errors."""
    level = DiagnosticStatus.OK if lifecycle_state == "active" else DiagnosticStatus.WARN
    summary = f"{lifecycle_state}"
    if status.get("error"):
        level, summary = DiagnosticStatus.ERROR, f"{lifecycle_state}: {status['error']}"
    elif lifecycle_state == "active" and status.get("inputs_state") == "stale":
        level = DiagnosticStatus.WARN
        summary = f"active, policy stopped: inputs {status.get('inputs_detail', 'stale')}"
    elif lifecycle_state == "active":
        summary = (f"active, position {status.get('position', 0)}, "
                   f"{status.get('capsule_count', 0)} capsules")
    values = [KeyValue(key="lifecycle_state", value=lifecycle_state)]
    values += [KeyValue(key=k, value=str(status[k])) for k in KEYS if k in status]
    entry = DiagnosticStatus(level=level, name=f"{node_name.lstrip('/')}: engine",
                             message=summary, hardware_id=str(status.get("device", "")),
                             values=values)
    return DiagnosticArray(header=_header(stamp), status=[entry])


def _header(stamp: Time) -> Any:
    from std_msgs.msg import Header
    return Header(stamp=stamp, frame_id="")
