"""A capsule: the live bytes of every arena buffer at one committed boundary, plus metadata.

When hashes are taken: the store hashes every capsule when it is taken
(``CapsuleStore(hash_at_snapshot=...)``, on by default except on CUDA). Hashing
needs the bytes on the host; on a GPU that is a device-to-host copy and a sync,
which would turn a sub-millisecond snapshot into a many-millisecond one, so a
CUDA device-tier snapshot records no hashes by default (``hashed`` is False).
Verifying such a capsule reports "unverified" (``ok`` False, ``verified``
False) and records the hashes then; later verifies compare against them, and
``restore(verify=True)`` refuses a capsule that has none.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from flashrt_ros.runtime.copyplan import CopyPlan

TIER_NAMES = ("device", "host", "disk")


def hash_bytes(t: torch.Tensor) -> str:
    """blake2b-128 of a tensor's raw bytes (copied to the host if needed)."""
    h = hashlib.blake2b(digest_size=16)
    if t.numel():
        flat = t.detach().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        h.update(raw.cpu().contiguous().numpy().data)
    return h.hexdigest()


def content_hash(buffer_hashes: Iterable[tuple[str, str]]) -> str:
    """One hash over ``name=hash`` lines in layout order: equal iff every buffer is equal."""
    h = hashlib.blake2b(digest_size=16)
    for name, hx in buffer_hashes:
        h.update(f"{name}={hx}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CapsuleSummary:
    """Plain, data-free view of a capsule, safe to hand out for listing."""

    name: str
    session: str
    position: int
    boundary_id: int
    created_at: float
    nbytes: int
    tier: str
    pinned: bool
    on_disk: bool
    hashed: bool
    content_hash: str
    buffer_hashes: dict[str, str]
    fingerprint: str
    layout_key: str
    extents: dict[str, int | None]

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(eq=False)
class Capsule:
    """One stored state. ``data`` gives live-extent views into ``payload`` while resident.

    Treat a returned Capsule as read-only: the store owns it and may drop
    ``data`` when it demotes the capsule to disk.
    """

    name: str
    session: str
    position: int
    boundary_id: int
    created_at: float
    nbytes: int
    fingerprint: str
    layout_key: str
    extents: dict[str, int | None]
    tier: str
    pinned: bool = False
    buffer_hashes: dict[str, str] = field(default_factory=dict)
    content_hash: str = ""
    payload: torch.Tensor | None = field(default=None, repr=False)
    plan: CopyPlan | None = field(default=None, repr=False)
    on_disk: bool = False
    hidden: bool = False
    _views: dict[str, torch.Tensor] | None = field(default=None, init=False, repr=False)
    bound: Any = field(default=None, init=False, repr=False)    # the store's cached BoundCopies

    @property
    def data(self) -> dict[str, torch.Tensor] | None:
        """Per-buffer live-extent views of the payload (None when not resident); built on first use."""
        if self.payload is None:
            return None
        if self._views is None:
            self._views = self.plan.views(self.payload)
        return self._views

    @property
    def hashed(self) -> bool:
        return bool(self.content_hash)

    @property
    def resident(self) -> bool:
        return self.payload is not None

    def attach(self, payload: torch.Tensor | None) -> None:
        """Point the capsule at new storage (or none) and rebuild the per-buffer views."""
        self.payload = payload
        self._views = None
        self.bound = None

    def compute_hashes(self, host: torch.Tensor | None = None) -> dict[str, str]:
        """Hash the stored bytes now (one device-to-host copy, unless ``host`` already is it)."""
        if host is None:
            host = self.payload.cpu() if self.payload.device.type != "cpu" else self.payload
        return {p.name: hash_bytes(self.plan.byte_view(host, p.name)) for p in self.plan.placements}

    def ensure_hashed(self, host: torch.Tensor | None = None) -> bool:
        """Record hashes if not yet done; returns True if it hashed now."""
        if self.hashed:
            return False
        self.buffer_hashes = self.compute_hashes(host)
        self.content_hash = content_hash(self.buffer_hashes.items())
        return True

    def info(self) -> CapsuleSummary:
        return CapsuleSummary(self.name, self.session, self.position, self.boundary_id, self.created_at,
                           self.nbytes, self.tier, self.pinned, self.on_disk, self.hashed,
                           self.content_hash, dict(self.buffer_hashes), self.fingerprint,
                           self.layout_key, dict(self.extents))


@dataclass(frozen=True)
class VerifyReport:
    """Result of ``CapsuleStore.verify``: ``ok`` with the buffers that differ, if any."""

    name: str
    ok: bool
    against_live: bool
    checked: tuple[str, ...]
    mismatched: tuple[str, ...]
    hashed_now: bool = False   # hashes were first recorded by this call (nothing older to compare)
    verified: bool = True      # False: there was nothing to compare against ("unverified", ok is False)
    detail: str = ""
