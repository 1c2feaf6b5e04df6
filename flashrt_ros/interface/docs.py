"""The tables and blocks made from the declarations (docs, the interface files' error codes).

Each function renders one artefact's text; ``generate.py`` says where each one goes and writes
or checks it. Nothing here is written by hand anywhere else.
"""
from __future__ import annotations

from typing import Iterable

from flashrt_ros.interface.errors import DESCRIPTIONS, DOCS, ErrorCode, constant_name
from flashrt_ros.interface.parameters import ParamDef
from flashrt_ros.interface.services import VERBS, ServiceVerb

#: The first line of the error-code block of every .msg/.srv/.action file.
ERROR_CODES_HEADER = ("# Error codes (stable; declared in flashrt_ros/interface/errors.py, written here by "
                      "python -m flashrt_ros.interface.generate)")


def services_table() -> str:
    """The service table of docs/services.md."""
    def resent(v: ServiceVerb) -> str:
        return "yes" if v.retry_safe else (f"with `{v.retry_safe_if}`" if v.retry_safe_if else "no")

    rows = ["| service | type | runs | re-sent after a lost reply | does |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| `~/{v.name}` | `{v.srv_type_name}` | {'at a boundary' if v.at_boundary else 'store only'} | "
             f"{resent(v)} | {v.doc} |" for v in VERBS]
    return "\n".join(rows) + "\n"


def error_codes_table() -> str:
    """The error-code table of docs/services.md."""
    rows = ["| code | name | meaning |", "| --- | --- | --- |"]
    rows += [f"| {int(code)} | `{constant_name(code)}` | {DOCS[code]} |" for code in ErrorCode]
    return "\n".join(rows) + "\n"


def error_codes_block() -> str:
    """The constants every .msg/.srv/.action file with an ``error_code`` carries (rosidl has no
    include, so each file repeats them)."""
    lines = [ERROR_CODES_HEADER]
    lines += [f"uint16 {constant_name(code)}={int(code)}  # {DESCRIPTIONS[code]}" for code in ErrorCode]
    return "\n".join(lines) + "\n"


def verb_usage(verb: ServiceVerb) -> str:
    """``flashrt snapshot NAME [--tier TIER] [--session SESSION] [--pin] [--overwrite]``."""
    words = [f"flashrt {verb.command}"] + [f.name.upper() for f in verb.fields if f.positional]
    for f in verb.fields:
        if not f.positional:
            words.append(f"[{f.cli_option}]" if f.kind is bool else f"[{f.cli_option} {f.cli_dest.upper()}]")
    return " ".join(words)


def capsule_commands_table() -> str:
    """The capsule commands' table of docs/cli.md."""
    rows = ["| command | service | what |", "| --- | --- | --- |"]
    rows += [f"| `{verb_usage(v)}` | `~/{v.name}` | {v.summary} |" for v in VERBS]
    return "\n".join(rows) + "\n"


def parameters_table(params: Iterable[ParamDef]) -> str:
    """A parameter table: docs/parameters.md (node, simulator), docs/robot_io.md (robot I/O)."""
    rows = ["| parameter | default | read-only | description |", "| --- | --- | --- | --- |"]
    for p in params:
        extra = f" One of: {', '.join(p.choices)}." if p.choices else ""
        rng = p.int_range or p.float_range
        extra += f" Range {rng[0]}..{rng[1]}." if rng else ""
        rows.append(f"| `{p.name}` | `{p.default!r}` | {'yes' if p.read_only else 'no'} | "
                    f"{p.description}{extra} |")
    return "\n".join(rows) + "\n"
