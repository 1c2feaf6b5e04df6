"""The capsule store: named snapshots of the arena across device, host and disk tiers.

Mechanism, not policy: the store copies bytes, keeps byte budgets and an LRU
order, and refuses what is unsafe; which capsule to take, keep or restore is
decided by its callers (the engine, the node).

``CapsuleStore`` is the one public API; its rooms, each with its own rules:
``catalogue`` (names, LRU order, names held by files), ``placement`` (tier
budgets, LRU demotion planned before any byte moves), ``capsule_files`` and
``persistence`` (the directory: index at start, save and load outside the lock),
``verification`` (hashes, files, live state), ``disk`` (the file format).

Rules this class keeps:
* Snapshot and restore copy live extents with ``copy_`` into/out of the very
  arena tensors (addresses never change, captured CUDA graphs stay valid), in as
  few copies as the layout allows (see ``copyplan``). Bytes past a restored
  live extent are left as they are: the model never reads them.
* Overwriting a capsule allocates the new one before the old one is released,
  so a failure keeps the old one. Overwriting a name that has a file writes the
  new capsule there as well (see ``_snapshot``).
* Restoring from host copies straight into the arena (pinned, asynchronous on
  CUDA); restoring from disk promotes the capsule to the host tier when it fits,
  else reads it through a transient buffer. Every disk read verifies hashes.
* Fingerprint and layout are checked on restore and load.
* A restore (or anything else that writes the arena from outside the engine)
  invalidates the rollback ring's append-only shortcut and seeds the ring with
  the restored state, so ``rollback(k)`` after a restore goes back to it.
* All methods are thread-safe under one RLock (``store.lock``). Methods that
  touch the arena (snapshot, restore, rollback, verify against live) must also
  run at an engine boundary: call them through ``BoundaryGate.run_at_boundary``.
* Hashes are taken at snapshot time (``hash_at_snapshot``; by default off only
  for a CUDA arena, where it would cost a host sync: see ``capsule``).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Collection

import torch

from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.capsule import Capsule, CapsuleSummary, VerifyReport
from flashrt_ros.runtime.capsule_files import CapsuleFiles
from flashrt_ros.runtime.catalogue import Catalogue
from flashrt_ros.runtime.copyplan import BoundCopies, CopyPlan, gather
from flashrt_ros.runtime.errors import (AlreadyExists, BudgetExhausted, CorruptCapsule, FingerprintMismatch,
                                        InvalidArgument, LayoutMismatch, PinnedCapsule)
from flashrt_ros.runtime.names import validate_capsule_name
from flashrt_ros.runtime.persistence import Persistence
from flashrt_ros.runtime.placement import Placement, check_tier
from flashrt_ros.runtime.rollback import RollbackRing
from flashrt_ros.runtime.tiers import DiskTier, make_memory_tiers
from flashrt_ros.runtime.verification import verify_file, verify_live, verify_stored

_PLAN_CACHE = 16


class CapsuleStore:
    """Named capsules of one arena, under per-tier byte budgets."""

    def __init__(self, arena: StateArena, fingerprint: str, *, device_budget_bytes: int,
                 host_budget_bytes: int, disk_budget_bytes: int, directory: Path | str | None = None,
                 rollback_depth: int = 8, default_tier: str = "device",
                 hash_at_snapshot: bool | None = None) -> None:
        for required in (POSITION, BOUNDARY):
            if required not in arena:
                raise InvalidArgument(f"arena lacks {required}; declare core_meta_specs()")
        check_tier(default_tier)
        self.arena = arena
        self.fingerprint = fingerprint
        self.default_tier = default_tier
        self.lock = threading.RLock()
        self.device_tier, self.host_tier = make_memory_tiers(arena.device, device_budget_bytes, host_budget_bytes)
        self.disk_tier = DiskTier(disk_budget_bytes, None if directory is None else Path(directory))
        self.catalogue = Catalogue()
        self.files = CapsuleFiles(self.disk_tier.directory, arena, fingerprint)
        self.placement = Placement(self.catalogue, self.files, self.device_tier, self.host_tier, self.disk_tier)
        self.persistence = Persistence(self.lock, self.catalogue, self.placement, self.files)
        self._layout_key = arena.layout_key()
        self._meta_names = [POSITION, BOUNDARY] + sorted(
            {s.length_from for s in arena.specs if s.length_from} - {POSITION, BOUNDARY})
        self.ring = RollbackRing(arena, rollback_depth)
        self._live_names = [s.name for s in arena.specs if s.live_axis is not None]
        self._plans: OrderedDict[tuple, CopyPlan] = OrderedDict()   # by extents; plans are immutable
        # Hashing needs the bytes on the host: free on a CPU arena, a sync on CUDA (see ``capsule``).
        self.hash_at_snapshot = arena.device.type != "cuda" if hash_at_snapshot is None else hash_at_snapshot
        if self.directory is not None:
            self.persistence.index_directory()

    @property
    def directory(self) -> Path | None:
        return self.disk_tier.directory

    # --- verbs ----------------------------------------------------------------
    def snapshot(self, name: str, *, session: str = "default", tier: str | None = None,
                 pinned: bool = False, overwrite: bool = False) -> Capsule:
        """Copy every buffer's live extent into a new capsule ``name``."""
        return self._snapshot(validate_capsule_name(name), session=validate_capsule_name(session, what="session name"),
                              tier=tier, pinned=pinned, overwrite=overwrite)

    def restore(self, name: str, *, verify: bool = False, groups: Collection[str] | None = None) -> Capsule:
        """Copy capsule ``name`` back into the arena (only buffers of ``groups`` if given)."""
        return self._restore(validate_capsule_name(name), verify=verify, groups=groups)

    def fork(self, source: str, new_name: str, *, tier: str | None = None) -> Capsule:
        """An independent copy of ``source`` under ``new_name`` (in ``tier``, default: the source's)."""
        validate_capsule_name(source)
        validate_capsule_name(new_name)
        with self.lock:
            src = self.catalogue.get(source)
            if new_name in self.catalogue:
                raise AlreadyExists(f"capsule {new_name!r} already exists")
            self.catalogue.check_no_file(new_name, overwrite=False)
            tier = tier or src.tier
            check_tier(tier)
            self.placement.require_disk(tier)
            moves = self.placement.plan_room(tier, src.nbytes, keep={src.name})
            if moves is None:
                raise BudgetExhausted(self.placement.no_room_message(tier, src.nbytes))
            payload = self.files.bytes_of(src)      # a damaged disk source fails here, before anything moved
            self.placement.apply(moves)
            new = Capsule(new_name, src.session, src.position, src.boundary_id, time.time(), src.nbytes,
                          src.fingerprint, src.layout_key, dict(src.extents), tier, False,
                          dict(src.buffer_hashes), src.content_hash, plan=src.plan)
            self.placement.place(new, payload, tier)
            self.catalogue.put(new)
            self.catalogue.touch(src)
            return new

    def drop(self, name: str, *, delete_files: bool = True) -> None:
        """Forget capsule ``name``; also delete its files unless ``delete_files=False``."""
        self._drop(validate_capsule_name(name), delete_files=delete_files)

    def get(self, name: str) -> Capsule:
        """The capsule object (read-only for callers; data may go when demoted)."""
        with self.lock:
            return self.catalogue.get(validate_capsule_name(name))

    def list(self, *, include_hidden: bool = False) -> list[CapsuleSummary]:
        """Metadata of every capsule, oldest first."""
        with self.lock:
            return self.catalogue.summaries(include_hidden)

    def pin(self, name: str) -> Capsule:
        with self.lock:
            c = self.catalogue.get(validate_capsule_name(name))
            c.pinned = True
            return c

    def unpin(self, name: str) -> Capsule:
        with self.lock:
            c = self.catalogue.get(validate_capsule_name(name))
            c.pinned = False
            return c

    def verify(self, name: str, *, against_live: bool = False) -> VerifyReport:
        """Re-hash stored bytes against the recorded hashes, or compare them with the live arena.

        A capsule that lives only on disk is read and hashed without holding the
        store lock (its file is replaced only atomically, so the read sees one
        whole version; a version that is not the indexed one is reported as such).
        """
        validate_capsule_name(name)
        for _attempt in range(3):
            with self.lock:
                c = self.catalogue.get(name)
                if against_live:
                    self._check_compatible(c)
                    payload = self.files.bytes_of(c)
                    return verify_live(c, self.arena, payload, self._read_meta()[2])
                if c.resident:
                    return verify_stored(c, self.files)
            report = verify_file(c, self.files)
            with self.lock:
                if report.ok or self.catalogue.find(name) is c:
                    return report
            # the capsule was replaced while its old file was read: verify the new one
        return report

    def save(self, name: str) -> Capsule:
        """Write capsule ``name`` to the disk tier, keeping any resident copy.

        The bytes go to a temp file without holding the store lock (other verbs
        answer meanwhile); only the checks before and the rename after are
        locked (``persistence``).
        """
        return self.persistence.save(validate_capsule_name(name))

    def load(self, name: str, *, tier: str | None = None, overwrite: bool = False) -> Capsule:
        """Read, verify and index a capsule file written by any process; ``tier`` None: host if it fits.

        The file is read and verified without holding the store lock, so other
        verbs go on meanwhile. A name the store indexed from the directory (a
        disk-only capsule of this very file) loads without ``overwrite``.
        """
        validate_capsule_name(name)
        if tier is not None:
            check_tier(tier)
        return self.persistence.load(name, tier=tier, overwrite=overwrite)

    def move(self, name: str, tier: str) -> Capsule:
        """Move capsule ``name`` to ``tier`` (demoting others as needed; pinned ones too may be moved)."""
        check_tier(tier)
        with self.lock:
            c = self.catalogue.get(validate_capsule_name(name))
            if tier == c.tier:
                return c
            self.placement.require_disk(tier)
            moves = self.placement.plan_room(tier, 0 if (tier == "disk" and c.on_disk) else c.nbytes,
                                             keep={c.name})
            if moves is None:
                raise BudgetExhausted(self.placement.no_room_message(tier, c.nbytes))
            self.placement.apply(moves)
            self.placement.move_now(c, tier)
            return c

    def rollback(self, steps: int) -> int:
        """Restore the state of ``steps`` committed boundaries ago; returns the new position."""
        with self.lock:
            return self.ring.rollback(steps)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            capsules = list(self.catalogue)
            out: dict[str, Any] = {}
            for tname, t in self.placement.tiers.items():
                out[tname] = {"bytes": t.used, "budget": t.budget, "count": sum(c.tier == tname for c in capsules)}
            out["disk"]["enabled"] = self.disk_tier.enabled
            out["disk"]["persisted"] = sum(c.on_disk for c in capsules)
            out["disk"]["unowned_files"] = len(self.catalogue.unowned)
            out["disk"]["orphans_removed"], out["disk"]["orphan_bytes_removed"] = self.files.orphans_removed
            temps = self.files.temp_files()
            out["disk"]["temp_files"] = len(temps)
            out["disk"]["temp_bytes"] = sum(t.nbytes for t in temps)
            out["capsules"] = len(capsules)
            out["hidden"] = sum(c.hidden for c in capsules)
            out["pinned"] = sum(c.pinned for c in capsules)
            out["ring"] = {"depth": self.ring.depth, "bytes": self.ring.nbytes,
                           "available": self.ring.available, "epoch": self.ring.epoch}
            return out

    def __contains__(self, name: str) -> bool:
        with self.lock:
            return name in self.catalogue

    # --- internal verbs (also used by sessions, with hidden names) -----------------
    def _snapshot(self, name: str, *, session: str, tier: str | None, pinned: bool,
                  overwrite: bool, hidden: bool = False) -> Capsule:
        """See ``snapshot``. Overwriting a name that has a file on disk (a saved capsule, or a
        file this store does not use) writes the new capsule to disk as well, replacing the file
        atomically: a saved name stays saved, now with the new content, and never loses its file."""
        tier = tier or self.default_tier
        check_tier(tier)
        placement = self.placement
        with self.lock:
            old = self.catalogue.find(name)
            if old is not None and not overwrite:
                raise AlreadyExists(f"capsule {name!r} already exists (pass overwrite=True to replace it)")
            if old is not None and old.pinned:
                raise PinnedCapsule(f"capsule {name!r} is pinned; unpin it before overwriting")
            self.catalogue.check_no_file(name, overwrite)
            placement.require_disk(tier)
            position, boundary, extents = self._read_meta()
            plan = self._plan_for(extents)
            persist = tier != "disk" and ((old is not None and old.on_disk) or name in self.catalogue.unowned)
            if persist and not placement.fits_after_freeing("disk", plan.nbytes, old):
                raise BudgetExhausted(placement.no_room_message("disk", plan.nbytes))
            moves = placement.plan_room(tier, plan.nbytes, freed=old)
            if moves is None:
                raise BudgetExhausted(placement.no_room_message(tier, plan.nbytes))
            capsule = Capsule(name, session, position, boundary, time.time(), plan.nbytes, self.fingerprint,
                              self._layout_key, extents, tier, pinned, plan=plan, hidden=hidden)
            if tier == "disk" or persist:
                # Written first: a failed write leaves the old capsule and its file as they were.
                staging = torch.empty(plan.nbytes, dtype=torch.uint8)
                gather(self.arena, plan, staging)
                capsule.attach(staging)
                self.files.write(capsule)
                capsule.attach(None)
            placement.apply(moves)
            if tier != "disk":
                mem = placement.tiers[tier]
                if old is not None and old.resident and old.tier == tier and old.plan is plan \
                        and not self.persistence.is_saving(name):
                    # Overwriting a capsule of the same layout in the same tier (a behaviour
                    # tree re-taking "home"): copy into its bytes, keeping its bound views.
                    payload, bound = old.payload, old.bound or BoundCopies(self.arena, plan, old.payload)
                    old.attach(None)
                    mem.release(plan.nbytes)
                else:
                    payload = mem.allocate(plan.nbytes)
                    bound = BoundCopies(self.arena, plan, payload)
                bound.to_payload()
                mem.charge(plan.nbytes)
                capsule.attach(payload)
                capsule.bound = bound
                if self.hash_at_snapshot:
                    capsule.ensure_hashed()
            if old is not None:
                placement.discard(old, delete_files=False)     # its file, if any, now holds the new capsule
            if capsule.on_disk:
                self.disk_tier.charge(plan.nbytes)
                self.catalogue.unowned.pop(name, None)
            self.catalogue.put(capsule)
            return capsule

    def _restore(self, name: str, *, verify: bool, groups: Collection[str] | None) -> Capsule:
        with self.lock:
            c = self.catalogue.get(name)
            self._check_compatible(c)
            names = self._names_of_groups(groups)
            if verify and c.resident:
                if not c.hashed:
                    raise InvalidArgument(f"capsule {name!r} has no recorded hashes to verify against "
                                          "(hash_at_snapshot is off); verify it once, or restore without verify")
                report = verify_stored(c, self.files)
                if not report.ok:
                    raise CorruptCapsule(f"capsule {name!r} failed verification: {report.detail}")
            if c.resident:
                payload, ptier = c.payload, c.tier
            else:
                moves = self.placement.plan_room("host", c.nbytes, keep={c.name})
                into = self.host_tier.allocate(c.nbytes) if moves is not None else None
                payload = self.files.read(c, into=into)      # verified before anything moves
                if moves is not None:
                    self.placement.apply(moves)
                    self.host_tier.charge(c.nbytes)
                    c.attach(payload)
                    c.tier = ptier = "host"
                else:
                    ptier = "transient"
            non_blocking = ptier == "host" and self.host_tier.pin and self.arena.device.type == "cuda"
            if names is None and payload is c.payload:
                if c.bound is None:
                    c.bound = BoundCopies(self.arena, c.plan, payload)
                bound = c.bound
            else:
                bound = BoundCopies(self.arena, c.plan, payload, names)
            bound.to_arena(non_blocking=non_blocking)
            self.ring.restart()
            self.catalogue.touch(c)
            return c

    def _drop(self, name: str, *, delete_files: bool = True) -> None:
        with self.lock:
            c = self.catalogue.get(name)
            if c.pinned:
                raise PinnedCapsule(f"capsule {name!r} is pinned; unpin it before dropping")
            if c.on_disk and not delete_files:
                self.catalogue.unowned[name] = "kept on disk by drop(delete_files=False)"
            self.placement.discard(c, delete_files=delete_files)

    # --- helpers ----------------------------------------------------------------
    def _read_meta(self) -> tuple[int, int, dict[str, int | None]]:
        """Position, boundary and every live extent, in one host read."""
        values = dict(zip(self._meta_names, torch.stack([self.arena[n] for n in self._meta_names]).tolist()))
        extents: dict[str, int | None] = {}
        for s in self.arena.specs:
            if s.length_from is None:
                extents[s.name] = None
            else:
                extents[s.name] = max(0, min(int(values[s.length_from]), s.shape[s.live_axis]))
        return int(values[POSITION]), int(values[BOUNDARY]), extents

    def _plan_for(self, extents: dict[str, int | None]) -> CopyPlan:
        """The payload plan for these extents (a few recent ones are kept: building costs ~2 us/buffer)."""
        key = tuple(extents[n] for n in self._live_names)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = CopyPlan.build(self.arena, extents)
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def _check_compatible(self, c: Capsule) -> None:
        if c.fingerprint != self.fingerprint:
            raise FingerprintMismatch(f"capsule {c.name!r} belongs to fingerprint {c.fingerprint}, "
                                      f"this store serves {self.fingerprint}")
        if c.layout_key != self._layout_key:
            raise LayoutMismatch(f"capsule {c.name!r} was taken from a different arena layout")

    def _names_of_groups(self, groups: Collection[str] | None) -> list[str] | None:
        if groups is None:
            return None
        if isinstance(groups, str):
            groups = [groups]
        wanted = set(groups)
        known = {s.group for s in self.arena.specs}
        unknown = wanted - known
        if unknown or not wanted:
            raise InvalidArgument(f"unknown groups {sorted(unknown)}; this arena has {sorted(known)}")
        return [s.name for s in self.arena.specs if s.group in wanted]
