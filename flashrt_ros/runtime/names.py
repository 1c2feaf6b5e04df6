"""Capsule (and session) names: safe as file names, short, and never a path.

Why this strict: a name becomes ``<dir>/<name>.safetensors``; anything that
could escape the capsule directory (``..``, separators, absolute paths) or hide
a file (leading ``.``) is refused. Names starting with ``.`` are reserved for
the runtime's own hidden capsules (parked sessions), which users cannot address.
Messages never echo an overlong name: a 10 MB name must fail fast and small.
"""
from __future__ import annotations

import re

from flashrt_ros.runtime.errors import InvalidName

MAX_NAME_LENGTH = 128
_ALLOWED = re.compile(r"[A-Za-z0-9._-]+")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")


def validate_capsule_name(name: object, *, what: str = "capsule name") -> str:
    """Return ``name`` unchanged if it is a valid name, else raise ``InvalidName``."""
    if not isinstance(name, str):
        raise InvalidName(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidName(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed")
    if _ALLOWED.fullmatch(name) is None:
        bad = _BAD_CHAR.search(name).group()
        kind = "a path separator" if bad in "/\\" else f"character {bad!r}"
        raise InvalidName(f"{what} {name!r} contains {kind}; only letters, digits, '.', '_' and '-' are allowed")
    if name.startswith("."):
        raise InvalidName(f"{what} {name!r} must not start with '.' (reserved; also excludes '.' and '..')")
    return name
