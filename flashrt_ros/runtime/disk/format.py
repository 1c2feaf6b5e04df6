"""What a capsule file says: its format tag and version, the dtype names, the manifest and its checks.

Why apart from reading and writing: the writer builds the manifest and the reader
refuses whatever disagrees with it, so both must share one definition of it;
``check_manifest`` and ``check_payload_meta`` are also what a stored ``verify``
of a disk-only capsule runs.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

import torch

from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.capsule import Capsule, content_hash
from flashrt_ros.runtime.copyplan import CopyPlan
from flashrt_ros.runtime.errors import CorruptCapsule, FingerprintMismatch, InvalidName
from flashrt_ros.runtime.names import validate_capsule_name

FORMAT = "flashrt-capsule"
FORMAT_VERSION = 2
INT64_MAX = (1 << 63) - 1
#: Latest creation time a manifest may carry (ROS ``builtin_interfaces/Time.sec`` is an int32).
MAX_CREATED_AT = float((1 << 31) - 1)
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "name": str, "session": str, "position": int,
    "boundary_id": int, "created_at": (int, float), "nbytes": int, "fingerprint": str,
    "layout_key": str, "extents": dict, "buffer_hashes": dict, "content_hash": str,
    "manifest_hash": str}
#: The safetensors name of every dtype an arena buffer may have.
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


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

