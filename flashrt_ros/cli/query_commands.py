"""The commands that read the node: ``status`` (its ``~/status``, once or as it comes) and ``param``
(get or set its parameters)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flashrt_ros.cli.exit_status import EXIT_OK, EXIT_UNREACHABLE


def format_status(msg: Any) -> str:
    """An EngineStatus as ``field: value`` lines (policy fields only for a policy node)."""
    fields = ["lifecycle_state", "engine_kind", "model", "device", "session", "busy", "position",
              "boundary_id", "capsule_count", "arena_bytes", "live_bytes", "step_p50_ms", "step_p99_ms"]
    if msg.engine_kind == "policy":
        fields += ["inputs_state", "inputs_detail", "policy_steps", "deadline_misses",
                   "rejected_messages", "control_overruns", "command_gap_max_ms", "command_gap_p99_ms", "replan_mode"]
        if msg.replan_mode not in ("", "sync"):          # plans beside the loop: their delay and fate
            fields += ["replan_delay_steps", "replan_chunk_steps", "replan_turnaround_p95_ms",
                       "replan_launched", "replan_merged", "replan_late", "replan_held", "replan_dropped"]
    width = max(map(len, fields))
    return "\n".join(f"{f.ljust(width)}  {getattr(msg, f)}" for f in fields)


def status_command(args: argparse.Namespace, client: Any) -> int:
    if not args.watch:
        print(format_status(client.status(timeout_s=args.timeout)))
        return EXIT_OK
    seen: list[Any] = []

    def show(msg: Any) -> None:
        if args.count and len(seen) >= args.count:
            return                                       # several can arrive in one spin
        seen.append(msg)
        stamp = msg.stamp.sec + msg.stamp.nanosec * 1e-9
        print(f"--- {stamp:.3f}\n{format_status(msg)}", flush=True)

    client.watch_status(show)
    if not client.wait_until(lambda: bool(seen), args.timeout):
        print(f"error: no {client.namespace}/status message within {args.timeout:.1f} s (is the node "
              "running, and on the same ROS_DOMAIN_ID?)", file=sys.stderr)
        return EXIT_UNREACHABLE
    while not args.count or len(seen) < args.count:       # Ctrl-C ends it (exit 130)
        client.wait_until(lambda: False, 0.5)
    return EXIT_OK


def param_command(args: argparse.Namespace, client: Any) -> int:
    if args.param_verb == "get":
        for name, value in client.get_parameters(args.names, timeout_s=args.timeout).items():
            print(f"{name}: {value!r}")
        return EXIT_OK
    from rclpy.parameter import get_parameter_value, parameter_value_to_python
    value = parameter_value_to_python(get_parameter_value(args.value))
    client.set_parameter(args.name, value, timeout_s=args.timeout)
    print(f"set {args.name} = {value!r}")
    return EXIT_OK
