"""The capsule commands: one per verb of ``interface/services.py``, made from its declaration.

Positional fields become arguments, the others options (a bool one a switch);
each command prints the node's message and the time the engine took, or (``list``)
a table. The table of docs/cli.md is ``interface/docs.capsule_commands_table``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from flashrt_ros.cli.exit_status import EXIT_OK, EXIT_USAGE
from flashrt_ros.interface.services import VERBS, ServiceVerb

#: capsule verbs by their sub-command (``close-session``)
BY_COMMAND = {verb.command: verb for verb in VERBS}


def add_verb_command(sub: Any, verb: ServiceVerb) -> None:
    """A capsule verb's sub-command, from its declaration: positional fields as arguments, the
    others as options (a bool one as a switch)."""
    s = sub.add_parser(verb.command, help=verb.summary)
    for f in verb.fields:
        if f.positional:
            s.add_argument(f.name, type=f.kind if f.kind in (int, float) else None, help=f.doc)
        elif f.kind is bool:
            s.add_argument(f.cli_option, dest=f.cli_dest, action="store_true", help=f.doc)
        else:
            s.add_argument(f.cli_option, dest=f.cli_dest, type=f.kind, default=f.default,
                           choices=f.choices or None, help=f.doc)


def call_verb(verb: ServiceVerb, args: argparse.Namespace, client: Any) -> int:
    """Call a capsule verb with the command line's fields; print its answer."""
    fields = {f.name: getattr(args, f.cli_dest) for f in verb.fields}
    refused = next(filter(None, (f.below_minimum(fields[f.name]) for f in verb.fields)), None)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return EXIT_USAGE
    # --timeout bounds finding the node as well as the answer.
    r = client.call(verb.name, timeout_s=args.timeout, wait_s=args.timeout, **fields)
    if verb.name in _VERB_OUTPUT:
        print(_VERB_OUTPUT[verb.name](r))
        return EXIT_OK
    latency = getattr(r, "engine_latency_ms", None)
    print(r.message + (f"  [{latency:.3f} ms in engine]" if latency is not None else ""))
    return EXIT_OK


def _capsule_list(response: Any) -> str:
    return (format_capsule_table(response.capsules) + "\n"
            + f"tiers: device {response.device_bytes} B, host {response.host_bytes} B, disk {response.disk_bytes} B")


#: verbs whose answer is printed as more than its message
_VERB_OUTPUT = {"list": _capsule_list}


def format_capsule_table(capsules: Sequence[Any]) -> str:
    """A fixed-width table of CapsuleInfo messages."""
    head = ("name", "session", "position", "boundary", "bytes", "tier", "pinned", "hash")
    rows = [head] + [(c.name, c.session, str(c.position), str(c.boundary_id), str(c.bytes), c.tier,
                      "yes" if c.pinned else "", c.content_hash[:12]) for c in capsules]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if not capsules:
        lines.append("(no capsules)")
    return "\n".join(lines)
