"""The engine's status: one flat summary for ~/status and /diagnostics (diagnostic_updater style).

Why one summary: both engines report their own ``status()`` dicts (the LLM keys
latency by step kind, the policy has one entry); ``status_summary`` reduces
either to the fields of EngineStatus, so the topic and the diagnostics agree.
"""
from __future__ import annotations

from typing import Any, Mapping

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

KEYS = ("engine_kind", "model", "device", "session", "busy", "position", "boundary_id",
        "capsule_count", "arena_bytes", "live_bytes", "device_bytes", "host_bytes", "disk_bytes",
        "step_p50_ms", "step_p99_ms", "inputs_state", "inputs_detail", "policy_steps",
        "deadline_misses", "rejected_messages", "speculative_tokens", "drafted_tokens", "accepted_tokens",
        "max_observation_age_s", "input_age_limits_s", "input_periods_s", "control_priority", "control_overruns",
        "control_gc_max_ms")


def status_summary(kind: str, model: str, raw: Mapping[str, Any], busy: bool) -> dict[str, Any]:
    """The EngineStatus fields from an engine's ``status()``; ``busy``: a generation or control loop runs."""
    # an LLM's step: a decode step, or a speculative one (1 .. k+1 tokens) when it speculates
    step = (raw["latency"].get("speculative") or raw["latency"].get("decode", {})) if kind == "llm" \
        else raw["latency"]
    store = tier_bytes(raw["store"])
    speculation = raw.get("speculation") or {}
    counters = {"speculative_tokens": int(speculation.get("tokens", 0)),
                "drafted_tokens": int(speculation.get("drafted", 0)),
                "accepted_tokens": int(speculation.get("accepted", 0))} if kind == "llm" else {}
    return {
        **counters,
        "replan": dict(raw.get("replan", {})),
        "engine_kind": kind, "model": model, "device": str(raw["device"]),
        "session": str(raw["session"]), "busy": bool(busy),
        "position": int(raw["position"]), "boundary_id": int(raw["boundary"]),
        "capsule_count": store["count"], "arena_bytes": int(raw["arena_bytes"]),
        "live_bytes": int(raw["live_bytes"]),
        "device_bytes": store["device_bytes"], "host_bytes": store["host_bytes"],
        "disk_bytes": store["disk_bytes"],
        "step_p50_ms": float(step.get("p50_ms", 0.0)), "step_p99_ms": float(step.get("p99_ms", 0.0)),
    }


def tier_bytes(stats: Mapping[str, Any]) -> dict[str, int]:
    """The store's stats ({tier: {bytes, count}}, capsules) as flat byte counts of visible capsules."""
    out = {"count": int(stats.get("capsules", 0) or 0) - int(stats.get("hidden", 0) or 0)}
    for tier in ("device", "host", "disk"):
        entry = stats.get(tier)
        out[f"{tier}_bytes"] = int(entry.get("bytes", 0)) if isinstance(entry, Mapping) else 0
    return out


def diagnostics_message(node_name: str, status: Mapping[str, Any], lifecycle_state: str,
                        stamp: Time) -> DiagnosticArray:
    """One DiagnosticStatus: OK while active, WARN when inactive/unconfigured, when the policy's
    inputs are stale (the policy is stopped) or when plans beside the loop take longer than a
    merged chunk lasts (the robot holds before each merge), ERROR on errors."""
    level = DiagnosticStatus.OK if lifecycle_state == "active" else DiagnosticStatus.WARN
    summary = f"{lifecycle_state}"
    if status.get("error"):
        level, summary = DiagnosticStatus.ERROR, f"{lifecycle_state}: {status['error']}"
    elif lifecycle_state == "active" and status.get("inputs_state") in ("stale", "error"):
        level = DiagnosticStatus.WARN
        summary = f"active, policy stopped: inputs {status.get('inputs_detail', 'stale')}"
    elif lifecycle_state == "active" and (over := delay_over_chunk(status.get("replan", {}))):
        level, summary = DiagnosticStatus.WARN, f"active, {over}"
    elif lifecycle_state == "active":
        summary = (f"active, position {status.get('position', 0)}, "
                   f"{status.get('capsule_count', 0)} capsules")
    values = [KeyValue(key="lifecycle_state", value=lifecycle_state)]
    values += [KeyValue(key=k, value=str(status[k])) for k in KEYS if k in status]
    values += [KeyValue(key=f"replan_{k}", value=str(v)) for k, v in status.get("replan", {}).items()]
    entry = DiagnosticStatus(level=level, name=f"{node_name.lstrip('/')}: engine",
                             message=summary, hardware_id=str(status.get("device", "")),
                             values=values)
    return DiagnosticArray(header=_header(stamp), status=[entry])


def delay_over_chunk(replan: Mapping[str, Any]) -> str:
    """A warning when a plan beside the loop takes longer than a merged chunk lasts ("" when not)."""
    delay, lasts = replan.get("delay_steps"), replan.get("chunk_steps")
    if delay is None or lasts is None or int(lasts) >= int(delay):
        return ""
    return (f"replan delay {int(delay)} steps > the {int(lasts)} a merged chunk lasts: the robot holds "
            "before each merge (lower the control rate, or plan faster: precision, device)")


def _header(stamp: Time) -> Any:
    from std_msgs.msg import Header
    return Header(stamp=stamp, frame_id="")
