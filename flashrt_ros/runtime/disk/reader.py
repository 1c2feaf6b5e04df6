"""Reading capsule files without trusting them: a checked header and manifest, hashed bytes.

Why so distrustful: a capsule directory outlives the process (and may be shared or
edited), so every field is checked before it is used and every byte is hashed as it
is read straight into the caller's payload (the rules are in the package docstring).
"""
from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.capsule import hash_bytes
from flashrt_ros.runtime.copyplan import CopyPlan
from flashrt_ros.runtime.disk.directory import capsule_path, list_names
from flashrt_ros.runtime.disk.format import (FORMAT, FORMAT_VERSION, SAFETENSORS_DTYPES, check_fields,
                                             check_manifest, check_payload_meta)
from flashrt_ros.runtime.errors import CapsuleIOError, CapsuleNotFound, CorruptCapsule, FlashRTError

MAX_HEADER_BYTES = 64 << 20


@dataclass
class CapsuleFile:
    """An open, header-checked capsule file; read its tensors, then ``close``."""

    fd: int
    name: str
    manifest: dict[str, Any]
    entries: dict[str, dict[str, Any]]
    data_start: int

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "CapsuleFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_exact(fd: int, n: int, offset: int, what: str, name: str) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CorruptCapsule(f"capsule {name!r}: file ends inside its {what} (truncated)")
    return data


def open_capsule(directory: Path, name: str) -> CapsuleFile:
    """Open ``<name>.safetensors`` without ever blocking and check its header and manifest."""
    path = capsule_path(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise CapsuleNotFound(f"no capsule {name!r} in {directory}") from None
    except OSError as exc:
        raise CapsuleIOError(f"opening {path} failed: {exc.strerror or exc}") from None
    try:
        return _parse(fd, name, path)
    except BaseException:
        os.close(fd)
        raise


def _parse(fd: int, name: str, path: Path) -> CapsuleFile:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CapsuleIOError(f"{path} is not a regular file; refused without reading it")
        size = st.st_size
        (header_len,) = struct.unpack("<Q", _read_exact(fd, 8, 0, "header length", name))
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise CorruptCapsule(f"capsule {name!r}: header length {header_len} is impossible (truncated?)")
        raw = _read_exact(fd, header_len, 8, "header", name)
    except OSError as exc:
        raise CapsuleIOError(f"reading {path} failed: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CorruptCapsule(f"capsule {name!r}: {path.name} is not a {FORMAT} file")
        if meta.get("format_version") != str(FORMAT_VERSION):
            raise CorruptCapsule(f"capsule {name!r}: format version {str(meta.get('format_version'))[:16]!r} "
                                 f"is not supported (this runtime reads {FORMAT_VERSION})")
        text = meta.get("manifest")
        manifest = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise CorruptCapsule(f"capsule {name!r}: header or manifest is not valid JSON") from None
    manifest = check_fields(manifest, name)
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    data_start = 8 + header_len
    spans = []
    for key, e in entries.items():
        ok = (isinstance(e, dict) and isinstance(e.get("dtype"), str) and isinstance(e.get("shape"), list)
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"])
              and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in e["data_offsets"])
              and 0 <= e["data_offsets"][0] <= e["data_offsets"][1])
        if not ok:
            raise CorruptCapsule(f"capsule {name!r}: tensor entry {str(key)[:64]!r} is malformed")
        spans.append(tuple(e["data_offsets"]))
    spans.sort()
    end = 0
    for begin, stop in spans:
        if begin != end:
            raise CorruptCapsule(f"capsule {name!r}: tensor data regions overlap or leave gaps")
        end = stop
    if data_start + end != size:
        raise CorruptCapsule(f"capsule {name!r}: file has {size} bytes, its header describes "
                             f"{data_start + end} (truncated or appended to)")
    return CapsuleFile(fd, name, manifest, entries, data_start)


def read_tensors(f: CapsuleFile, plan: CopyPlan, payload: torch.Tensor) -> list[str]:
    """Read every buffer into its view of the CPU ``payload``, checking dtype and shape.

    Returns the buffers whose bytes do not match their recorded hash (callers
    decide whether that is an error or a verify report); structural damage
    raises ``CorruptCapsule``.
    """
    name, hashes = f.name, f.manifest["buffer_hashes"]
    if set(f.entries) != set(plan.by_name):
        raise CorruptCapsule(f"capsule {name!r}: file holds other buffers than the arena's")
    mismatched = []
    for p in plan.placements:
        e = f.entries[p.name]
        if e["dtype"] != SAFETENSORS_DTYPES.get(p.dtype) or tuple(e["shape"]) != tuple(p.live_shape):
            raise CorruptCapsule(f"capsule {name!r}: buffer {p.name} is {e['dtype']}{tuple(e['shape'])}, "
                                 f"expected {p.dtype}{p.live_shape}")
        begin, stop = e["data_offsets"]
        if stop - begin != p.nbytes:
            raise CorruptCapsule(f"capsule {name!r}: buffer {p.name} has {stop - begin} bytes, expected {p.nbytes}")
        target = plan.byte_view(payload, p.name)
        if p.nbytes:
            try:
                got = os.preadv(f.fd, [memoryview(target.numpy())], f.data_start + begin)
            except OSError as exc:
                raise CapsuleIOError(f"reading capsule {name!r} failed: {exc.strerror or exc}") from None
            if got != p.nbytes:
                raise CorruptCapsule(f"capsule {name!r}: file ends inside buffer {p.name} (truncated)")
        if hash_bytes(target) != hashes[p.name]:
            mismatched.append(p.name)
    return mismatched


def load_capsule(directory: Path, name: str, arena: StateArena, fingerprint: str,
                 allocate: Callable[[int], torch.Tensor] | None = None
                 ) -> tuple[dict[str, Any], CopyPlan, torch.Tensor]:
    """Open, check and read capsule ``name``: (manifest, plan, verified CPU payload).

    Raises on any mismatch (hashes included), so a returned payload is exactly
    what was saved. ``allocate(nbytes)`` provides the payload (default: plain CPU).
    """
    with open_capsule(directory, name) as f:
        plan = check_manifest(f.manifest, arena, fingerprint)
        payload = (allocate or _cpu_bytes)(plan.nbytes)
        bad = read_tensors(f, plan, payload)
        if bad:
            raise CorruptCapsule(f"capsule {name!r}: bytes of {bad[:8]} do not match their recorded hashes")
        check_payload_meta(f.manifest, arena, plan, payload)
        return f.manifest, plan, payload


def _cpu_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


def scan(directory: Path, arena: StateArena, fingerprint: str
         ) -> Iterator[tuple[str, dict[str, Any] | None, CopyPlan | None, FlashRTError | None]]:
    """Every capsule file in ``directory``: (name, manifest, plan, None) or (name, None, None, why refused).

    Header and manifest only (the bytes are verified when the capsule is read).
    """
    for name in list_names(directory):
        try:
            with open_capsule(directory, name) as f:
                plan = check_manifest(f.manifest, arena, fingerprint)
                yield name, f.manifest, plan, None
        except FlashRTError as exc:
            yield name, None, None, exc
