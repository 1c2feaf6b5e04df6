"""The on-disk capsule format: ``<dir>/<name>.safetensors`` + ``<dir>/<name>.json``.

Why two files: the tensors go through safetensors (a plain header plus raw
bytes; never pickle, so a capsule file cannot execute code), while everything
needed to judge a capsule before touching its bytes (format version,
fingerprint, layout, extents, per-buffer hashes) sits in a small JSON manifest.

Writes are atomic per file: each is written to a hidden temp file in the same
directory, flushed and fsynced, then ``os.replace``d into place, and the
directory is fsynced. The tensor file is replaced first and the manifest last,
so the manifest is the commit point; a crash between the two renames while
overwriting leaves an old manifest beside new tensors, which loading reports as
``CorruptCapsule`` (the tensor header carries the content hash it belongs to).

Loading checks, in order: both files exist, the manifest parses and has this
format version, the fingerprint, the layout, the content hash against the
per-buffer hashes, the tensor file size, the tensor header, and finally each
buffer's dtype, shape and bytes. Nothing outside the capsule directory is
written, and temp files start with ``.`` so they can never shadow a capsule.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.capsule import Capsule, content_hash, hash_bytes
from flashrt_ros.runtime.copyplan import CopyPlan
from flashrt_ros.runtime.errors import (CapsuleIOError, CapsuleNotFound, CorruptCapsule,
                                        FingerprintMismatch)

FORMAT = "flashrt-capsule"
FORMAT_VERSION = 1
_REQUIRED = {"format": str, "format_version": int, "name": str, "session": str, "position": int,
             "boundary_id": int, "created_at": (int, float), "nbytes": int, "fingerprint": str,
             "layout_key": str, "extents": dict, "buffer_hashes": dict, "content_hash": str,
             "tensor_file_bytes": int}


def tensor_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.safetensors"


def manifest_path(directory: Path, name: str) -> Path:
    return Path(directory) / f"{name}.json"


def build_manifest(capsule: Capsule, tensor_file_bytes: int) -> dict[str, Any]:
    buffers = [{"name": p.name, "dtype": str(p.dtype), "shape": list(p.live_shape),
                "hash": capsule.buffer_hashes[p.name]} for p in capsule.plan.placements]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "name": capsule.name,
            "session": capsule.session, "position": capsule.position,
            "boundary_id": capsule.boundary_id, "created_at": capsule.created_at,
            "nbytes": capsule.nbytes, "fingerprint": capsule.fingerprint,
            "layout_key": capsule.layout_key, "extents": capsule.extents,
            "buffer_hashes": capsule.buffer_hashes, "content_hash": capsule.content_hash,
            "tensor_file_bytes": tensor_file_bytes, "buffers": buffers}


# --- writing ----------------------------------------------------------------
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_capsule(directory: Path, capsule: Capsule, tensors: Mapping[str, torch.Tensor]) -> int:
    """Atomically write ``capsule`` (hashes already recorded); returns the tensor file size.

    ``tensors`` are the live-extent CPU tensors keyed by buffer name (disjoint
    views of one payload are fine).
    """
    directory = Path(directory)
    stem = f".{capsule.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tmp_t, tmp_m = directory / f"{stem}.safetensors.tmp", directory / f"{stem}.json.tmp"
    try:
        save_file(dict(tensors), str(tmp_t),
                  metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION),
                            "content_hash": capsule.content_hash})
        _fsync_path(tmp_t)
        size = tmp_t.stat().st_size
        with open(tmp_m, "w", encoding="utf-8") as fh:
            json.dump(build_manifest(capsule, size), fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_t, tensor_path(directory, capsule.name))
        os.replace(tmp_m, manifest_path(directory, capsule.name))
        _fsync_path(directory)
        return size
    except (OSError, SafetensorError) as exc:
        raise CapsuleIOError(f"writing capsule {capsule.name!r} to {directory} failed: {exc}") from None
    finally:
        for tmp in (tmp_t, tmp_m):
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                pass


def delete_capsule(directory: Path, name: str) -> None:
    """Remove both files of a capsule (missing files are fine)."""
    try:
        for path in (manifest_path(directory, name), tensor_path(directory, name)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        _fsync_path(Path(directory))
    except OSError as exc:
        raise CapsuleIOError(f"deleting capsule {name!r} from {directory} failed: {exc}") from None


# --- reading ----------------------------------------------------------------
def read_manifest(directory: Path, name: str) -> dict[str, Any]:
    """Parse and sanity-check a manifest (format, version, field types)."""
    mpath, tpath = manifest_path(directory, name), tensor_path(directory, name)
    if not mpath.exists():
        if tpath.exists():
            raise CorruptCapsule(f"capsule {name!r}: manifest {mpath.name} is missing (incomplete write?)")
        raise CapsuleNotFound(f"no capsule {name!r} in {directory}")
    try:
        text = mpath.read_text(encoding="utf-8")
    except OSError as exc:
        raise CapsuleIOError(f"reading {mpath} failed: {exc}") from None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CorruptCapsule(f"capsule {name!r}: manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptCapsule(f"capsule {name!r}: {mpath.name} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CorruptCapsule(f"capsule {name!r}: format version {manifest.get('format_version')!r} "
                             f"is not supported (this runtime reads {FORMAT_VERSION})")
    for key, typ in _REQUIRED.items():
        if not isinstance(manifest.get(key), typ) or isinstance(manifest.get(key), bool):
            raise CorruptCapsule(f"capsule {name!r}: manifest field {key!r} is missing or malformed")
    if manifest["name"] != name:
        raise CorruptCapsule(f"capsule {name!r}: manifest names a different capsule {manifest['name']!r}")
    return manifest


def check_manifest(manifest: Mapping[str, Any], arena: StateArena, fingerprint: str) -> CopyPlan:
    """Refuse a foreign or inconsistent manifest; returns the payload plan it implies."""
    name = manifest["name"]
    if manifest["fingerprint"] != fingerprint:
        raise FingerprintMismatch(f"capsule {name!r} was written for model fingerprint "
                                  f"{manifest['fingerprint']}, this store serves {fingerprint}")
    arena.check_same_layout(manifest["layout_key"])
    hashes = manifest["buffer_hashes"]
    if set(hashes) != set(arena) or not all(isinstance(v, str) for v in hashes.values()):
        raise CorruptCapsule(f"capsule {name!r}: buffer hashes do not cover exactly the arena's buffers")
    if content_hash((n, hashes[n]) for n in arena) != manifest["content_hash"]:
        raise CorruptCapsule(f"capsule {name!r}: content hash does not match the buffer hashes")
    live = {s.name for s in arena.specs if s.live_axis is not None}
    extents = manifest["extents"]
    if set(extents) != set(arena) or any((extents[n] is None) == (n in live) for n in arena) \
            or any(isinstance(extents[n], bool) or not isinstance(extents[n], int) for n in live):
        raise CorruptCapsule(f"capsule {name!r}: extents do not match the arena's live buffers")
    try:
        plan = CopyPlan.build(arena, extents)
    except Exception as exc:
        raise CorruptCapsule(f"capsule {name!r}: bad extents ({exc})") from None
    if plan.nbytes != manifest["nbytes"]:
        raise CorruptCapsule(f"capsule {name!r}: nbytes {manifest['nbytes']} does not match its extents")
    return plan


def read_tensors(directory: Path, manifest: Mapping[str, Any], plan: CopyPlan,
                 payload: torch.Tensor) -> list[str]:
    """Read every buffer into its view of the CPU ``payload``, checking dtype and shape.

    Returns the buffers whose bytes do not match their recorded hash (callers
    decide whether that is an error or a verify report); structural damage
    raises ``CorruptCapsule``.
    """
    name = manifest["name"]
    tpath = tensor_path(directory, name)
    try:
        size = tpath.stat().st_size
    except FileNotFoundError:
        raise CorruptCapsule(f"capsule {name!r}: tensor file {tpath.name} is missing") from None
    except OSError as exc:
        raise CapsuleIOError(f"reading {tpath} failed: {exc}") from None
    if size != manifest["tensor_file_bytes"]:
        raise CorruptCapsule(f"capsule {name!r}: tensor file has {size} bytes, manifest says "
                             f"{manifest['tensor_file_bytes']} (truncated or replaced)")
    mismatched = []
    try:
        with safe_open(str(tpath), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
            if meta.get("content_hash") != manifest["content_hash"]:
                raise CorruptCapsule(f"capsule {name!r}: tensor file belongs to another capsule version")
            if set(fh.keys()) != set(plan.by_name):
                raise CorruptCapsule(f"capsule {name!r}: tensor file holds other buffers than the arena's")
            for p in plan.placements:
                t = fh.get_tensor(p.name)
                if t.dtype != p.dtype or tuple(t.shape) != p.live_shape:
                    raise CorruptCapsule(f"capsule {name!r}: buffer {p.name} is {t.dtype}{tuple(t.shape)}, "
                                         f"expected {p.dtype}{p.live_shape}")
                if p.nbytes:
                    plan.view(payload, p.name).copy_(t)
                if hash_bytes(plan.byte_view(payload, p.name)) != manifest["buffer_hashes"][p.name]:
                    mismatched.append(p.name)
    except OSError as exc:
        raise CapsuleIOError(f"reading {tpath} failed: {exc}") from None
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CorruptCapsule(f"capsule {name!r}: tensor file is unreadable ({exc})") from None
    return mismatched


def load_tensors(directory: Path, manifest: Mapping[str, Any], plan: CopyPlan, payload: torch.Tensor) -> None:
    """``read_tensors`` that refuses any hash mismatch."""
    mismatched = read_tensors(directory, manifest, plan, payload)
    if mismatched:
        raise CorruptCapsule(f"capsule {manifest['name']!r}: bytes of {mismatched} do not match "
                             f"their recorded hashes")
