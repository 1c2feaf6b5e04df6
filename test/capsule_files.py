"""Test helpers that read and rewrite capsule files (format 2) the way an attacker or a bad disk would."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable

from flashrt_ros.runtime import disk


def read_header(path: Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


def read_manifest(path: Path) -> dict[str, Any]:
    return json.loads(read_header(path)["__metadata__"]["manifest"])


def rewrite_manifest(path: Path, edit: Callable[[dict[str, Any]], None], *, rehash: bool = True,
                     raw_manifest: str | None = None) -> None:
    """Apply ``edit`` to the manifest in place (re-signing it unless ``rehash`` is False)."""
    path = Path(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    if raw_manifest is None:
        manifest = json.loads(header["__metadata__"]["manifest"])
        edit(manifest)
        if rehash:
            manifest["manifest_hash"] = disk.manifest_hash(manifest)
        raw_manifest = json.dumps(manifest)
    header["__metadata__"]["manifest"] = raw_manifest
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def data_region(path: Path) -> tuple[int, int]:
    raw = Path(path).read_bytes()
    header = struct.unpack("<Q", raw[:8])[0]
    return 8 + header, len(raw)
