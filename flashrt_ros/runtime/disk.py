"""The on-disk capsule format (version 2): one file per capsule, ``<dir>/<name>.safetensors``.

Why one file: a capsule must survive a crash or ``kill -9`` at any moment of a
save. With one file the whole write is: write a hidden temp file in the same
directory, fsync it, ``os.replace`` it over the old file, fsync the directory.
A crash before the rename leaves the old capsule untouched (plus an orphaned
temp file, removed the next time a store opens the directory); after it, the
new one is complete. There is no step at which neither version is loadable.

Why we write the safetensors bytes ourselves instead of calling
``safetensors.torch.save_file``: that writer creates its own ``.tmpXXXXXX``
file beside the target and renames it, so a kill during the write left a file
our sweep could not attribute (162 MB survived eleven restarts). Our writer
opens exactly one file, our own temp name (``.<name>.<pid>.<8 hex>.tmp``), so
every byte a killed save can leave is recognised and removed. The sweep also
removes such ``.tmpXXXXXX`` files left by earlier versions (``_LEGACY_TEMP``).

The file is a plain safetensors file (a little-endian u64 header length, a JSON
header, raw tensor bytes; never pickle, so it cannot execute code). Its
``__metadata__`` holds ``format``, ``format_version`` and ``manifest``: a JSON
object with everything needed to judge the capsule before reading its bytes
(name, session, position, boundary id, creation time, fingerprint, layout,
extents, per-buffer blake2b hashes, content hash) and ``manifest_hash``, a
blake2b over every other manifest field, so an edited field is refused.

Reading never trusts the file: it is opened with ``O_NONBLOCK`` and must be a
regular file (a FIFO or device named like a capsule is refused at once, never
waited on); the header is parsed with size limits; every field is type- and
range-checked (so no stored value can later overflow a message field); the
tensor entries must tile the data region exactly and match the file size;
each buffer's bytes are read straight into the caller's payload and hashed;
finally position, boundary and extents must equal the values inside the bytes.
Nothing outside the capsule directory is ever written; temp files start with
``.`` and end with ``.tmp`` so they can never shadow a capsule.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.capsule import Capsule, content_hash, hash_bytes
from flashrt_ros.runtime.copyplan import CopyPlan
from flashrt_ros.runtime.errors import (CapsuleIOError, CapsuleNotFound, CorruptCapsule, FlashRTError,
                                        FingerprintMismatch, InvalidName)
from flashrt_ros.runtime.names import validate_capsule_name

FORMAT = "flashrt-capsule"
FORMAT_VERSION = 2
SUFFIX = ".safetensors"
INT64_MAX = (1 << 63) - 1
#: Latest creation time a manifest may carry (ROS ``builtin_interfaces/Time.sec`` is an int32).
MAX_CREATED_AT = float((1 << 31) - 1)
MAX_HEADER_BYTES = 64 << 20
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}(\.safetensors|\.json)?\.tmp$")
#: Temp files of ``safetensors.save_file`` (the ``tempfile`` crate: ``.tmp`` + 6 characters), which
#: capsule writers before format 2's own writer left behind when killed; no writer of ours makes them.
_LEGACY_TEMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")
_WRITE_CHUNK = 8 << 20
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "name": str, "session": str, "position": int,
    "boundary_id": int, "created_at": (int, float), "nbytes": int, "fingerprint": str,
    "layout_key": str, "extents": dict, "buffer_hashes": dict, "content_hash": str,
    "manifest_hash": str}
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
              torch.uint8: "U8", torch.bool: "BOOL"}


def capsule_path(directory: Path, name: str) -> Path:
    """The one file of capsule ``name``."""
    return Path(directory) / f"{name}{SUFFIX}"


# --- manifest -----------------------------------------------------------------
def _canonical(manifest: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "manifest_hash"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """blake2b-128 over every manifest field except ``manifest_hash`` itself."""
    return hashlib.blake2b(_canonical(manifest), digest_size=16).hexdigest()


def build_manifest(capsule: Capsule) -> dict[str, Any]:
    """The manifest of a hashed capsule, ``manifest_hash`` included."""
    buffers = [{"name": p.name, "dtype": str(p.dtype), "shape": list(p.live_shape),
                "hash": capsule.buffer_hashes[p.name]} for p in capsule.plan.placements]
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": capsule.name,
                "session": capsule.session, "position": capsule.position,
                "boundary_id": capsule.boundary_id, "created_at": capsule.created_at,
                "nbytes": capsule.nbytes, "fingerprint": capsule.fingerprint,
                "layout_key": capsule.layout_key, "extents": capsule.extents,
                "buffer_hashes": capsule.buffer_hashes, "content_hash": capsule.content_hash,
                "buffers": buffers}
    manifest["manifest_hash"] = manifest_hash(manifest)
    return manifest


def check_fields(manifest: Any, name: str) -> dict[str, Any]:
    """Types, ranges and the manifest hash; raises ``CorruptCapsule`` on anything off."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptCapsule(f"capsule {name!r}: not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CorruptCapsule(f"capsule {name!r}: format version {manifest.get('format_version')!r} "
                             f"is not supported (this runtime reads {FORMAT_VERSION})")
    for key, typ in _REQUIRED.items():
        value = manifest.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise CorruptCapsule(f"capsule {name!r}: manifest field {key!r} is missing or malformed")
    for key in ("position", "boundary_id", "nbytes"):
        if not 0 <= manifest[key] <= INT64_MAX:
            raise CorruptCapsule(f"capsule {name!r}: manifest field {key!r} is out of range")
    try:
        created = float(manifest["created_at"])
    except OverflowError:              # an integer beyond float range
        created = math.inf
    if not (math.isfinite(created) and 0.0 <= created <= MAX_CREATED_AT):
        raise CorruptCapsule(f"capsule {name!r}: manifest field 'created_at' is out of range")
    if manifest["name"] != name:
        raise CorruptCapsule(f"capsule {name!r}: manifest names a different capsule")
    try:
        validate_capsule_name(manifest["session"], what="session name")
    except InvalidName:
        raise CorruptCapsule(f"capsule {name!r}: manifest field 'session' is not a valid session name") from None
    try:
        expected = manifest_hash(manifest)
    except (TypeError, ValueError, RecursionError):
        raise CorruptCapsule(f"capsule {name!r}: manifest holds values JSON cannot represent") from None
    if expected != manifest["manifest_hash"]:
        raise CorruptCapsule(f"capsule {name!r}: manifest hash does not match its fields (edited or damaged)")
    return manifest


def check_manifest(manifest: Mapping[str, Any], arena: StateArena, fingerprint: str) -> CopyPlan:
    """Refuse a foreign or inconsistent manifest; returns the payload plan it implies."""
    name = manifest["name"]
    if manifest["fingerprint"] != fingerprint:
        raise FingerprintMismatch(f"capsule {name!r} was written for model fingerprint "
                                  f"{manifest['fingerprint'][:64]}, this store serves {fingerprint}")
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
    except Exception as exc:  # noqa: BLE001 - any failure here means a bad extent
        raise CorruptCapsule(f"capsule {name!r}: bad extents ({type(exc).__name__})") from None
    if plan.nbytes != manifest["nbytes"]:
        raise CorruptCapsule(f"capsule {name!r}: nbytes {manifest['nbytes']} does not match its extents")
    return plan


def check_payload_meta(manifest: Mapping[str, Any], arena: StateArena, plan: CopyPlan,
                       payload: torch.Tensor) -> None:
    """Position, boundary and extents in the manifest must equal the values inside the bytes."""
    name = manifest["name"]

    def scalar(buffer: str) -> int:
        return int(plan.view(payload, buffer).reshape(-1)[0].item())

    if scalar(POSITION) != manifest["position"] or scalar(BOUNDARY) != manifest["boundary_id"]:
        raise CorruptCapsule(f"capsule {name!r}: position/boundary in the manifest differ from the stored state")
    for s in arena.specs:
        if s.length_from is not None:
            extent = max(0, min(scalar(s.length_from), s.shape[s.live_axis]))
            if manifest["extents"][s.name] != extent:
                raise CorruptCapsule(f"capsule {name!r}: extent of {s.name} differs from the stored state")


# --- writing ------------------------------------------------------------------
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
        if t.dtype not in _ST_DTYPES:
            raise CapsuleIOError(f"buffer {name}: dtype {t.dtype} has no safetensors name")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
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
    tmp = directory / f".{capsule.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
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


# --- reading ------------------------------------------------------------------
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
        if e["dtype"] != _ST_DTYPES.get(p.dtype) or tuple(e["shape"]) != tuple(p.live_shape):
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
