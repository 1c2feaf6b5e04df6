"""Which files of a capsule directory are capsules, which are temp files of saves, and the sweep.

Why here: the writer names its temp files and the sweep recognises them, so one
module owns both the names and the pattern; a temp file of a killed save is
removed the next time a store opens the directory, one of a live save is kept.
"""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from flashrt_ros.runtime.errors import InvalidName
from flashrt_ros.runtime.names import validate_capsule_name

SUFFIX = ".safetensors"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}(\.safetensors|\.json)?\.tmp$")
#: Temp files of ``safetensors.save_file`` (the ``tempfile`` crate: ``.tmp`` + 6 characters), which
#: capsule writers before format 2's own writer left behind when killed; no writer of ours makes them.
_LEGACY_TEMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")


def capsule_path(directory: Path, name: str) -> Path:
    """The one file of capsule ``name``."""
    return Path(directory) / f"{name}{SUFFIX}"


def new_temp_path(directory: Path, name: str) -> Path:
    """A fresh temp file name for a save of ``name`` by this process (``.<name>.<pid>.<8 hex>.tmp``)."""
    return Path(directory) / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def list_names(directory: Path) -> list[str]:
    """Valid capsule names that have a file in ``directory`` (not validated further)."""
    names = []
    for entry in os.scandir(directory):
        if not entry.name.endswith(SUFFIX):
            continue
        name = entry.name[: -len(SUFFIX)]
        try:
            names.append(validate_capsule_name(name))
        except InvalidName:
            continue
    return sorted(names)


@dataclass(frozen=True)
class TempFile:
    path: Path
    pid: int | None     # the writing process; None for a legacy ``.tmpXXXXXX`` (always orphaned)
    nbytes: int


def temp_files(directory: Path) -> list[TempFile]:
    """Temp files of saves in ``directory`` (in flight, or orphaned by a killed process)."""
    out = []
    for entry in os.scandir(directory):
        m = _TEMP.match(entry.name)
        if m is None and not _LEGACY_TEMP.match(entry.name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            size = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        out.append(TempFile(Path(entry.path), int(m.group("pid")) if m else None, size))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:        # exists, owned by someone else
        return True
    return True


def remove_orphans(directory: Path) -> tuple[int, int]:
    """Delete temp files whose writing process is gone; returns (files, bytes) removed.

    A temp file of a live process (another store saving right now, possibly
    in this very process) is left alone. Legacy ``.tmpXXXXXX`` files name no
    process and no writer of ours makes them any more: they are removed (an old
    version saving into this directory right now would see its save fail, cleanly).
    """
    files = nbytes = 0
    for t in temp_files(directory):
        if t.pid is not None and (t.pid == os.getpid() or _alive(t.pid)):
            continue
        try:
            t.path.unlink()
        except OSError:
            continue
        files += 1
        nbytes += t.nbytes
    return files, nbytes
