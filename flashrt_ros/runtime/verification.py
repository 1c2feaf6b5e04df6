"""Checking a capsule's bytes: against the hashes recorded at snapshot, in its file, or against the live arena.

Why a room of its own: the three checks answer one question (are these bytes
what we think they are?) for three places the bytes can be, and report it the
same way (``VerifyReport``), for ``CapsuleStore.verify`` and
``restore(verify=True)``. A file is read and hashed without any lock: it is only
ever replaced atomically, so the read sees one whole version.
"""
from __future__ import annotations

import torch

from flashrt_ros.runtime import disk
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.capsule import Capsule, VerifyReport
from flashrt_ros.runtime.capsule_files import CapsuleFiles
from flashrt_ros.runtime.errors import FlashRTError


def verify_stored(c: Capsule, files: CapsuleFiles) -> VerifyReport:
    """Re-hash ``c``'s stored bytes (resident, else its file) against the recorded hashes."""
    if not c.resident:
        return verify_file(c, files)
    names = tuple(p.name for p in c.plan.placements)
    if c.ensure_hashed():
        return VerifyReport(c.name, False, False, names, (), hashed_now=True, verified=False,
                            detail="unverified: no hash was recorded at snapshot time (hash_at_snapshot "
                                   "off); hashes recorded now, later verifies compare against them")
    now = c.compute_hashes()
    bad = tuple(n for n in names if now[n] != c.buffer_hashes[n])
    return VerifyReport(c.name, not bad, False, names, bad,
                        detail="" if not bad else f"hash mismatch in {list(bad)}")


def verify_file(c: Capsule, files: CapsuleFiles) -> VerifyReport:
    """Read and hash ``c``'s file (needs no lock: reads only the file and ``c``'s fixed fields)."""
    names = tuple(p.name for p in c.plan.placements)
    try:
        with disk.open_capsule(files.directory, c.name) as f:
            plan = disk.check_manifest(f.manifest, files.arena, files.fingerprint)
            if f.manifest["content_hash"] != c.content_hash:
                return VerifyReport(c.name, False, False, names, names, detail="file holds other content")
            payload = torch.empty(plan.nbytes, dtype=torch.uint8)
            bad = disk.read_tensors(f, plan, payload)
            if not bad:
                disk.check_payload_meta(f.manifest, files.arena, plan, payload)
    except FlashRTError as exc:
        return VerifyReport(c.name, False, False, names, names, detail=str(exc))
    return VerifyReport(c.name, not bad, False, names, tuple(bad),
                        detail="" if not bad else f"hash mismatch in {bad}")


def verify_live(c: Capsule, arena: StateArena, payload: torch.Tensor,
                extents: dict[str, int | None]) -> VerifyReport:
    """Compare ``c``'s bytes (``payload``) with the live arena whose extents are ``extents``, bit by bit."""
    names = tuple(p.name for p in c.plan.placements)
    bad = []
    for p in c.plan.placements:
        if extents[p.name] != c.extents[p.name]:
            bad.append(p.name)
            continue
        live = arena.live_view(p.name)
        stored = c.plan.view(payload, p.name).to(live.device)
        if not torch.equal(_as_bytes(live), _as_bytes(stored)):
            bad.append(p.name)
    return VerifyReport(c.name, not bad, True, names, tuple(bad),
                        detail="" if not bad else f"live state differs in {bad}")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes, so that NaN payloads and -0.0 compare by bits, not by value."""
    return t.contiguous().reshape(-1).view(torch.uint8)
