"""``flashrt diagnostics``: what the node publishes on ``/diagnostics``, without ros2cli.

Why: ``/diagnostics`` carries what ``~/status`` summarises plus the replanning
counters (``replan_*``) and a level (OK / WARN / ERROR) with the reason, and is
what a robot's diagnostic aggregator reads; without ros2cli (``ros2 topic echo``)
a user had no way to see it. Prints the node's entry from the next message (or
every node's with ``--all``), or every message with ``--watch``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flashrt_ros.cli.exit_status import EXIT_OK, EXIT_UNREACHABLE

LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def level_name(level: Any) -> str:
    """``OK`` / ``WARN`` / ``ERROR`` / ``STALE`` for a DiagnosticStatus level (a byte in rclpy)."""
    value = level[0] if isinstance(level, (bytes, bytearray)) else int(level)
    return LEVELS.get(value, str(value))


def format_entry(entry: Any) -> str:
    """One DiagnosticStatus: ``[WARN] robot1/flashrt: engine: <message>``, then its values, one a line."""
    lines = [f"[{level_name(entry.level)}] {entry.name}: {entry.message}"]
    if entry.hardware_id:
        lines.append(f"  hardware_id  {entry.hardware_id}")
    width = max((len(kv.key) for kv in entry.values), default=0)
    lines += [f"  {kv.key.ljust(width)}  {kv.value}" for kv in entry.values]
    return "\n".join(lines)


def node_entries(msg: Any, node: str, everyone: bool) -> list[Any]:
    """The entries of ``msg`` that belong to ``node`` (its fully qualified name), or all of them."""
    if everyone:
        return list(msg.status)
    name = node.strip("/")
    return [e for e in msg.status if e.name.split(":", 1)[0].strip("/") == name]


def add_diagnostics_parser(sub: Any) -> None:
    s = sub.add_parser("diagnostics", help="print the node's /diagnostics entry (level, reason, every "
                                           "value: inputs, latency, replanning counters)")
    s.add_argument("--watch", action="store_true", help="print every message until Ctrl-C")
    s.add_argument("--count", type=int, default=0, metavar="N", help="with --watch: stop after N (exit 0)")
    s.add_argument("--all", dest="all_nodes", action="store_true",
                   help="every node's entries, not only --node's")


def diagnostics_command(args: argparse.Namespace, client: Any) -> int:
    shown: list[int] = []

    def show(msg: Any) -> None:
        entries = node_entries(msg, client.namespace, args.all_nodes)
        if not entries or (shown and not args.watch) or (args.count and len(shown) >= args.count):
            return
        shown.append(1)
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        text = "\n".join(format_entry(e) for e in entries)
        print(f"--- {stamp:.3f}\n{text}" if args.watch else text, flush=True)

    client.watch_diagnostics(show)
    if not client.wait_until(lambda: bool(shown), args.timeout):
        whose = "any node" if args.all_nodes else client.namespace
        print(f"error: no /diagnostics message from {whose} within {args.timeout:.1f} s (is the node "
              "running, and on the same ROS_DOMAIN_ID? it publishes every status_period_s)", file=sys.stderr)
        return EXIT_UNREACHABLE
    while args.watch and (not args.count or len(shown) < args.count):    # Ctrl-C ends it (exit 130)
        client.wait_until(lambda: False, 0.5)
    return EXIT_OK
