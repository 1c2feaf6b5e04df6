"""Writing capsule files atomically: a temp file, fsync, rename over the old file, fsync the directory.

Why a writer of our own (not ``safetensors.torch.save_file``): see the package
docstring; every byte a killed save can leave is a temp file that ``directory``
recognises. ``write_temp`` and ``commit_temp`` are separate so that a store can
write without holding its lock and rename under it.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Mapping

import torch

from flashrt_ros.runtime.capsule import Capsule
from flashrt_ros.runtime.disk.directory import capsule_path, new_temp_path
from flashrt_ros.runtime.disk.format import FORMAT, FORMAT_VERSION, SAFETENSORS_DTYPES, build_manifest
from flashrt_ros.runtime.errors import CapsuleIOError

_WRITE_CHUNK = 8 << 20


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_safetensors(fd: int, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> int:
    """Write a safetensors file (header, then each tensor's raw bytes) to ``fd``; returns its size.

    The layout ``safetensors`` itself writes: u64 header length, JSON header
    padded with spaces to 8 bytes, tensors ordered by alignment then name.
    """
    ordered = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, t in ordered:
        if t.dtype not in SAFETENSORS_DTYPES:
            raise CapsuleIOError(f"buffer {name}: dtype {t.dtype} has no safetensors name")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    _write_all(fd, struct.pack("<Q", len(raw)) + raw)
    for _name, t in ordered:
        if t.numel():
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
            data = memoryview(flat.numpy())
            for start in range(0, len(data), _WRITE_CHUNK):
                _write_all(fd, data[start:start + _WRITE_CHUNK])
    return 8 + len(raw) + offset


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_temp(directory: Path, capsule: Capsule, tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write ``capsule`` (hashes already recorded) to a new fsynced temp file in ``directory``.

    Touches no capsule file and needs no lock: ``commit_temp`` makes it the
    capsule's file. On failure the temp file is removed and ``CapsuleIOError`` raised.
    """
    directory = Path(directory)
    tmp = new_temp_path(directory, capsule.name)
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
                "manifest": json.dumps(build_manifest(capsule), sort_keys=True, separators=(",", ":"))}
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            write_safetensors(fd, tensors, metadata)
        finally:
            os.close(fd)
        _fsync_path(tmp)
    except OSError as exc:
        discard_temp(tmp)
        raise CapsuleIOError(f"writing capsule {capsule.name!r} to {directory} failed: {exc}") from None
    except BaseException:
        discard_temp(tmp)
        raise
    return tmp


def commit_temp(tmp: Path, directory: Path, name: str) -> int:
    """Rename a ``write_temp`` file over capsule ``name``'s file and fsync the directory; returns its size."""
    directory = Path(directory)
    try:
        size = tmp.stat().st_size
        os.replace(tmp, capsule_path(directory, name))
    except OSError as exc:
        discard_temp(tmp)
        raise CapsuleIOError(f"writing capsule {name!r} to {directory} failed: {exc}") from None
    try:
        _fsync_path(directory)
    except OSError:
        # The rename happened: the new capsule is complete and current. A failed directory
        # fsync only means a power cut could bring back the old file, which is complete too.
        pass
    return size


def discard_temp(tmp: Path) -> None:
    """Remove a temp file that will not be committed (a missing one is fine)."""
    try:
        tmp.unlink()
    except OSError:
        pass


def write_capsule(directory: Path, capsule: Capsule, tensors: Mapping[str, torch.Tensor]) -> int:
    """Atomically write (or replace) ``capsule`` (hashes already recorded); returns the file size.

    ``tensors`` are the live-extent CPU tensors keyed by buffer name (disjoint
    views of one payload are fine). Steps: temp file, fsync, rename, fsync dir.
    """
    return commit_temp(write_temp(directory, capsule, tensors), directory, capsule.name)


def delete_capsule(directory: Path, name: str) -> None:
    """Remove a capsule's file (a missing file is fine)."""
    try:
        try:
            capsule_path(directory, name).unlink()
        except FileNotFoundError:
            pass
        _fsync_path(Path(directory))
    except OSError as exc:
        raise CapsuleIOError(f"deleting capsule {name!r} from {directory} failed: {exc}") from None
