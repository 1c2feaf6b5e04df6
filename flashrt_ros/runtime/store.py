"""The capsule store: named snapshots of the arena across device, host and disk tiers.

Mechanism, not policy: the store copies bytes, keeps byte budgets and an LRU
order, and refuses what is unsafe; which capsule to take, keep or restore is
decided by its callers (the engine, the node).

Rules the store keeps:
* Snapshot and restore copy live extents with ``copy_`` into/out of the very
  arena tensors (addresses never change, captured CUDA graphs stay valid), in as
  few copies as the layout allows (see ``copyplan``). Bytes past a restored
  live extent are left as they are: the model never reads them.
* A snapshot into a full tier first demotes least-recently-used unpinned
  capsules device -> host -> disk (disk only with a directory). Pinned capsules
  never move on their own. If there is still no room, ``BudgetExhausted`` is
  raised and nothing has changed: the whole demotion chain is planned on paper
  before any byte moves. Only a real allocator failure after a successful plan
  (the budget was set above what the device really has) can leave planned
  demotions done; their bytes are intact and the old capsule of an overwrite
  is kept, since the new one is allocated before the old one is released.
* Restoring from host copies straight into the arena (pinned, asynchronous on
  CUDA); restoring from disk promotes the capsule to the host tier when it fits,
  else reads it through a transient buffer. Every disk read verifies hashes.
* Fingerprint and layout are checked on restore and load.
* The disk tier (see ``disk``): one file per capsule, replaced atomically, so a
  crash at any point of a save leaves the old or the new capsule loadable. At
  start the store removes orphaned temp files of killed saves and indexes the
  directory's capsule files (header and manifest checked, bytes verified on
  first read), so names persist across restarts: a name is taken while the
  store holds a capsule of that name *or* the directory holds its file (files
  of another model or damaged ones too). Overwriting a name that has a file
  writes the new capsule there as well (see ``_snapshot``). Loading reads and
  verifies the file, ``save`` writes its temp file and a stored ``verify`` of a
  disk-only capsule reads it, all without holding the store lock (a save
  renames under the lock; a payload being saved is never overwritten in place).
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

from flashrt_ros.runtime import disk
from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.capsule import TIER_NAMES, Capsule, CapsuleSummary, VerifyReport
from flashrt_ros.runtime.copyplan import BoundCopies, CopyPlan, gather
from flashrt_ros.runtime.errors import (AlreadyExists, BudgetExhausted, CapsuleNotFound, CorruptCapsule,
                                        FingerprintMismatch, FlashRTError, InvalidArgument, LayoutMismatch,
                                        PinnedCapsule)
from flashrt_ros.runtime.names import validate_capsule_name
from flashrt_ros.runtime.rollback import RollbackRing
from flashrt_ros.runtime.tiers import DiskTier, MemoryTier, make_memory_tiers

_NEXT_TIER = {"device": "host", "host": "disk"}
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
        _check_tier(default_tier)
        self.arena = arena
        self.fingerprint = fingerprint
        self.default_tier = default_tier
        self.lock = threading.RLock()
        self.device_tier, self.host_tier = make_memory_tiers(arena.device, device_budget_bytes, host_budget_bytes)
        self.disk_tier = DiskTier(disk_budget_bytes, None if directory is None else Path(directory))
        self._tiers: dict[str, MemoryTier | DiskTier] = {
            "device": self.device_tier, "host": self.host_tier, "disk": self.disk_tier}
        self._capsules: OrderedDict[str, Capsule] = OrderedDict()   # least recently used first
        self._layout_key = arena.layout_key()
        self._meta_names = [POSITION, BOUNDARY] + sorted(
            {s.length_from for s in arena.specs if s.length_from} - {POSITION, BOUNDARY})
        self.ring = RollbackRing(arena, rollback_depth)
        self._live_names = [s.name for s in arena.specs if s.live_axis is not None]
        self._plans: OrderedDict[tuple, CopyPlan] = OrderedDict()   # by extents; plans are immutable
        # Hashing needs the bytes on the host: free on a CPU arena, a sync on CUDA (see ``capsule``).
        self.hash_at_snapshot = arena.device.type != "cuda" if hash_at_snapshot is None else hash_at_snapshot
        self._unowned: dict[str, str] = {}     # files in the directory this store does not index, and why
        self._orphans_removed = (0, 0)
        self._reading: dict[str, int] = {}     # capsules whose payload is read without the lock
        if self.directory is not None:
            self._index_directory()

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
            src = self._get(source)
            if new_name in self._capsules:
                raise AlreadyExists(f"capsule {new_name!r} already exists")
            self._check_no_file(new_name, overwrite=False)
            tier = tier or src.tier
            _check_tier(tier)
            self._require_disk(tier)
            moves = self._plan_room(tier, src.nbytes, keep={src.name})
            if moves is None:
                raise BudgetExhausted(self._no_room_message(tier, src.nbytes))
            payload = self._bytes_of(src)      # a damaged disk source fails here, before anything moved
            self._apply(moves)
            new = Capsule(new_name, src.session, src.position, src.boundary_id, time.time(), src.nbytes,
                          src.fingerprint, src.layout_key, dict(src.extents), tier, False,
                          dict(src.buffer_hashes), src.content_hash, plan=src.plan)
            self._place(new, payload, tier)
            self._capsules[new_name] = new
            self._touch(src)
            return new

    def drop(self, name: str, *, delete_files: bool = True) -> None:
        """Forget capsule ``name``; also delete its files unless ``delete_files=False``."""
        self._drop(validate_capsule_name(name), delete_files=delete_files)

    def get(self, name: str) -> Capsule:
        """The capsule object (read-only for callers; data may go when demoted)."""
        with self.lock:
            return self._get(validate_capsule_name(name))

    def list(self, *, include_hidden: bool = False) -> list[CapsuleSummary]:
        """Metadata of every capsule, oldest first."""
        with self.lock:
            caps = [c for c in self._capsules.values() if include_hidden or not c.hidden]
            return [c.info() for c in sorted(caps, key=lambda c: c.created_at)]

    def pin(self, name: str) -> Capsule:
        with self.lock:
            c = self._get(validate_capsule_name(name))
            c.pinned = True
            return c

    def unpin(self, name: str) -> Capsule:
        with self.lock:
            c = self._get(validate_capsule_name(name))
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
                c = self._get(name)
                if against_live:
                    return self._verify_live(c)
                if c.resident:
                    return self._verify_stored(c)
            report = self._verify_file(c)
            with self.lock:
                if report.ok or self._capsules.get(name) is c:
                    return report
            # the capsule was replaced while its old file was read: verify the new one
        return report

    def save(self, name: str) -> Capsule:
        """Write capsule ``name`` to the disk tier, keeping any resident copy.

        The bytes go to a temp file without holding the store lock (other verbs
        answer meanwhile); only the checks before and the rename after are
        locked. A capsule that was overwritten, dropped or moved to disk during
        the write is not renamed over: the temp file is removed.
        """
        validate_capsule_name(name)
        with self.lock:
            c = self._get(name)
            self._require_disk("disk")
            if c.on_disk:
                return c
            self._check_save_allowed(c)
            host = c.payload if c.payload.device.type == "cpu" else c.payload.cpu()
            c.ensure_hashed(host)
            self._reading[c.name] = self._reading.get(c.name, 0) + 1    # no in-place overwrite meanwhile
        try:
            tmp = disk.write_temp(self.directory, c, c.plan.views(host))
        finally:
            with self.lock:
                self._release_reading(c.name)
        with self.lock:
            if self._capsules.get(name) is not c or c.on_disk:
                disk.discard_temp(tmp)
                if c.on_disk and self._capsules.get(name) is c:
                    return c                      # a demotion wrote the same capsule meanwhile
                raise CapsuleNotFound(f"capsule {name!r} was dropped or replaced while it was being "
                                      "saved; nothing was written")
            try:
                self._check_save_allowed(c)
            except FlashRTError:
                disk.discard_temp(tmp)
                raise
            disk.commit_temp(tmp, self.directory, c.name)
            c.on_disk = True
            self._unowned.pop(c.name, None)
            self.disk_tier.charge(c.nbytes)
            return c

    def _check_save_allowed(self, c: Capsule) -> None:
        if disk.capsule_path(self.directory, c.name).exists():
            raise AlreadyExists(f"a file {c.name}{disk.SUFFIX} that this store did not write is in "
                                f"{self.directory}; drop or rename the capsule, or delete the file")
        if not self.disk_tier.fits(c.nbytes):
            raise BudgetExhausted(self._no_room_message("disk", c.nbytes))

    def _release_reading(self, name: str) -> None:
        left = self._reading.pop(name, 1) - 1
        if left:
            self._reading[name] = left

    def load(self, name: str, *, tier: str | None = None, overwrite: bool = False) -> Capsule:
        """Read, verify and index a capsule file written by any process; ``tier`` None: host if it fits.

        The file is read and verified without holding the store lock, so other
        verbs go on meanwhile. A name the store indexed from the directory (a
        disk-only capsule of this very file) loads without ``overwrite``.
        """
        validate_capsule_name(name)
        if tier is not None:
            _check_tier(tier)
        with self.lock:
            self._require_disk("disk")
            self._check_load_allowed(name, self._capsules.get(name), None, overwrite)
        try:
            manifest, plan, staging = disk.load_capsule(self.directory, name, self.arena, self.fingerprint,
                                                        allocate=self.host_tier.allocate)
        except (CorruptCapsule, FingerprintMismatch, LayoutMismatch) as exc:
            self._forget_bad_file(name, exc)
            raise
        with self.lock:
            old = self._capsules.get(name)
            self._check_load_allowed(name, old, manifest["content_hash"], overwrite)
            nbytes = plan.nbytes
            if not self._fits_after_freeing("disk", nbytes, old):
                raise BudgetExhausted(self._no_room_message("disk", nbytes))
            if tier is None:
                tier = "host" if self._plan_room("host", nbytes, freed=old) is not None else "disk"
            moves = self._plan_room(tier, nbytes, freed=old) if tier != "disk" else []
            if moves is None:
                raise BudgetExhausted(self._no_room_message(tier, nbytes))
            self._apply(moves)
            new = self._capsule_from_manifest(manifest, plan, tier)
            if old is not None:
                self._discard(old, delete_files=False)
            self._unowned.pop(name, None)
            self.disk_tier.charge(nbytes)
            if tier == "host":
                self.host_tier.charge(nbytes)
                new.attach(staging)
            elif tier == "device":
                self._place(new, staging, "device")
            self._capsules[name] = new
            return new

    def _forget_bad_file(self, name: str, exc: FlashRTError) -> None:
        """A file indexed at start (header only) turned out unusable: unindex it, keep its name taken."""
        with self.lock:
            c = self._capsules.get(name)
            if c is not None and c.on_disk and not c.resident and not c.pinned:
                self._discard(c, delete_files=False)
                self._unowned[name] = f"{exc.code.name}: {exc}"

    def _check_load_allowed(self, name: str, old: Capsule | None, content: str | None, overwrite: bool) -> None:
        if old is None:
            return
        indexed_file = old.on_disk and not old.resident and content in (None, old.content_hash)
        if indexed_file and not old.pinned:
            return
        if not overwrite:
            raise AlreadyExists(f"capsule {name!r} is already in the store")
        if old.pinned:
            raise PinnedCapsule(f"capsule {name!r} is pinned; unpin it before overwriting")

    def move(self, name: str, tier: str) -> Capsule:
        """Move capsule ``name`` to ``tier`` (demoting others as needed; pinned ones too may be moved)."""
        _check_tier(tier)
        with self.lock:
            c = self._get(validate_capsule_name(name))
            if tier == c.tier:
                return c
            self._require_disk(tier)
            moves = self._plan_room(tier, 0 if (tier == "disk" and c.on_disk) else c.nbytes, keep={c.name})
            if moves is None:
                raise BudgetExhausted(self._no_room_message(tier, c.nbytes))
            self._apply(moves)
            self._move_now(c, tier)
            return c

    def rollback(self, steps: int) -> int:
        """Restore the state of ``steps`` committed boundaries ago; returns the new position."""
        with self.lock:
            return self.ring.rollback(steps)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {}
            for tname, t in self._tiers.items():
                in_tier = [c for c in self._capsules.values() if c.tier == tname]
                out[tname] = {"bytes": t.used, "budget": t.budget, "count": len(in_tier)}
            out["disk"]["enabled"] = self.disk_tier.enabled
            out["disk"]["persisted"] = sum(c.on_disk for c in self._capsules.values())
            out["disk"]["unowned_files"] = len(self._unowned)
            out["disk"]["orphans_removed"], out["disk"]["orphan_bytes_removed"] = self._orphans_removed
            temps = disk.temp_files(self.directory) if self.disk_tier.enabled else []
            out["disk"]["temp_files"] = len(temps)
            out["disk"]["temp_bytes"] = sum(t.nbytes for t in temps)
            out["capsules"] = len(self._capsules)
            out["hidden"] = sum(c.hidden for c in self._capsules.values())
            out["pinned"] = sum(c.pinned for c in self._capsules.values())
            out["ring"] = {"depth": self.ring.depth, "bytes": self.ring.nbytes,
                           "available": self.ring.available, "epoch": self.ring.epoch}
            return out

    def __contains__(self, name: str) -> bool:
        with self.lock:
            return name in self._capsules

    # --- internal verbs (also used by sessions, with hidden names) -----------------
    def _snapshot(self, name: str, *, session: str, tier: str | None, pinned: bool,
                  overwrite: bool, hidden: bool = False) -> Capsule:
        """See ``snapshot``. Overwriting a name that has a file on disk (a saved capsule, or a
        file this store does not use) writes the new capsule to disk as well, replacing the file
        atomically: a saved name stays saved, now with the new content, and never loses its file."""
        tier = tier or self.default_tier
        _check_tier(tier)
        with self.lock:
            old = self._capsules.get(name)
            if old is not None and not overwrite:
                raise AlreadyExists(f"capsule {name!r} already exists (pass overwrite=True to replace it)")
            if old is not None and old.pinned:
                raise PinnedCapsule(f"capsule {name!r} is pinned; unpin it before overwriting")
            self._check_no_file(name, overwrite)
            self._require_disk(tier)
            position, boundary, extents = self._read_meta()
            plan = self._plan_for(extents)
            persist = tier != "disk" and ((old is not None and old.on_disk) or name in self._unowned)
            if persist and not self._fits_after_freeing("disk", plan.nbytes, old):
                raise BudgetExhausted(self._no_room_message("disk", plan.nbytes))
            moves = self._plan_room(tier, plan.nbytes, freed=old)
            if moves is None:
                raise BudgetExhausted(self._no_room_message(tier, plan.nbytes))
            capsule = Capsule(name, session, position, boundary, time.time(), plan.nbytes, self.fingerprint,
                              self._layout_key, extents, tier, pinned, plan=plan, hidden=hidden)
            if tier == "disk" or persist:
                # Written first: a failed write leaves the old capsule and its file as they were.
                staging = torch.empty(plan.nbytes, dtype=torch.uint8)
                gather(self.arena, plan, staging)
                capsule.attach(staging)
                capsule.ensure_hashed()
                disk.write_capsule(self.directory, capsule, capsule.data)
                capsule.attach(None)
                capsule.on_disk = True
            self._apply(moves)
            if tier != "disk":
                mem = self._tiers[tier]
                if old is not None and old.resident and old.tier == tier and old.plan is plan \
                        and name not in self._reading:
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
                self._discard(old, delete_files=False)     # its file, if any, now holds the new capsule
            if capsule.on_disk:
                self.disk_tier.charge(plan.nbytes)
                self._unowned.pop(name, None)
            self._capsules[name] = capsule
            return capsule

    def _restore(self, name: str, *, verify: bool, groups: Collection[str] | None) -> Capsule:
        with self.lock:
            c = self._get(name)
            self._check_compatible(c)
            names = self._names_of_groups(groups)
            if verify and c.resident:
                if not c.hashed:
                    raise InvalidArgument(f"capsule {name!r} has no recorded hashes to verify against "
                                          "(hash_at_snapshot is off); verify it once, or restore without verify")
                report = self._verify_stored(c)
                if not report.ok:
                    raise CorruptCapsule(f"capsule {name!r} failed verification: {report.detail}")
            if c.resident:
                payload, ptier = c.payload, c.tier
            else:
                moves = self._plan_room("host", c.nbytes, keep={c.name})
                into = self.host_tier.allocate(c.nbytes) if moves is not None else None
                payload = self._read_disk(c, into=into)      # verified before anything moves
                if moves is not None:
                    self._apply(moves)
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
            self._touch(c)
            return c

    def _drop(self, name: str, *, delete_files: bool = True) -> None:
        with self.lock:
            c = self._get(name)
            if c.pinned:
                raise PinnedCapsule(f"capsule {name!r} is pinned; unpin it before dropping")
            if c.on_disk and not delete_files:
                self._unowned[name] = "kept on disk by drop(delete_files=False)"
            self._discard(c, delete_files=delete_files)

    # --- helpers ----------------------------------------------------------------
    def _index_directory(self) -> None:
        """Learn the directory's capsules (header and manifest checked; bytes on first read).

        Orphaned temp files of killed saves are removed first. Files that fail
        the checks (another model, damaged, ...) are not indexed but keep their
        name taken, so nothing overwrites them without ``overwrite``.
        """
        self._orphans_removed = disk.remove_orphans(self.directory)
        found = []
        for name, manifest, plan, error in disk.scan(self.directory, self.arena, self.fingerprint):
            if error is not None:
                self._unowned[name] = f"{error.code.name}: {error}"
            else:
                found.append(self._capsule_from_manifest(manifest, plan, "disk"))
        for c in sorted(found, key=lambda c: c.created_at):
            self._capsules[c.name] = c
            self.disk_tier.charge(c.nbytes)

    def _capsule_from_manifest(self, manifest: dict[str, Any], plan: CopyPlan, tier: str) -> Capsule:
        return Capsule(manifest["name"], manifest["session"], manifest["position"], manifest["boundary_id"],
                       float(manifest["created_at"]), plan.nbytes, manifest["fingerprint"],
                       manifest["layout_key"], dict(manifest["extents"]), tier, False,
                       dict(manifest["buffer_hashes"]), manifest["content_hash"], plan=plan, on_disk=True)

    def _check_no_file(self, name: str, overwrite: bool) -> None:
        """A file the store does not index still takes its name (across restarts too)."""
        if name in self._unowned and not overwrite:
            raise AlreadyExists(f"capsule directory holds a file {name}{disk.SUFFIX} this store does not "
                                f"use ({self._unowned[name][:200]}); pass overwrite to replace it")

    def _get(self, name: str) -> Capsule:
        try:
            return self._capsules[name]
        except KeyError:
            raise CapsuleNotFound(f"no capsule named {name!r}") from None

    def _touch(self, c: Capsule) -> None:
        self._capsules.move_to_end(c.name)

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

    def _require_disk(self, tier: str) -> None:
        if tier == "disk" and not self.disk_tier.enabled:
            raise InvalidArgument("this store has no capsule directory, so no disk tier")

    # budgets --------------------------------------------------------------------
    def _fits_after_freeing(self, tier: str, nbytes: int, freed: Capsule | None) -> bool:
        t = self._tiers[tier]
        credit = 0
        if freed is not None and (freed.tier == tier or (tier == "disk" and freed.on_disk)):
            credit = freed.nbytes
        return t.used - credit + nbytes <= t.budget

    def _plan_room(self, tier: str, nbytes: int, *, keep: Collection[str] = (),
                   freed: Capsule | None = None) -> list[tuple[Capsule, str]] | None:
        """Demotions (LRU first, greedy) that make ``nbytes`` fit in ``tier``; None if impossible.

        ``keep`` names capsules that must not be demoted; ``freed`` is a capsule
        about to be replaced, whose bytes count as free. Pure: changes nothing.
        """
        used = {name: t.used for name, t in self._tiers.items()}
        if freed is not None:
            if freed.tier in ("device", "host"):
                used[freed.tier] -= freed.nbytes
            if freed.on_disk:
                used["disk"] -= freed.nbytes
        blocked = set(keep) | ({freed.name} if freed is not None else set())
        moves: list[tuple[Capsule, str]] = []

        def need(t: str, n: int) -> bool:
            budget = self._tiers[t].budget
            if n > budget:
                return False
            if used[t] + n <= budget:
                return True
            nxt = _NEXT_TIER.get(t)
            if nxt is None or (nxt == "disk" and not self.disk_tier.enabled):
                return False
            for c in list(self._capsules.values()):
                if used[t] + n <= budget:
                    break
                if c.tier != t or c.pinned or c.name in blocked:
                    continue
                cost = 0 if (nxt == "disk" and c.on_disk) else c.nbytes
                blocked.add(c.name)
                if not need(nxt, cost):
                    return False
                used[t] -= c.nbytes
                used[nxt] += cost
                moves.append((c, nxt))
            return used[t] + n <= budget

        return moves if need(tier, nbytes) else None

    def _no_room_message(self, tier: str, nbytes: int) -> str:
        t = self._tiers[tier]
        pinned = sum(c.nbytes for c in self._capsules.values() if c.tier == tier and c.pinned)
        chain = {"device": "host/disk", "host": "disk", "disk": "nowhere"}[tier]
        disk_note = "" if self.disk_tier.enabled else " (no capsule directory, so no disk tier)"
        return (f"{tier} tier cannot take {nbytes} bytes: budget {t.budget}, used {t.used} "
                f"({pinned} pinned), and unpinned capsules could not be demoted to {chain}{disk_note}; "
                f"nothing was changed")

    def _apply(self, moves: list[tuple[Capsule, str]]) -> None:
        for c, to in moves:
            self._move_now(c, to)

    # byte movement ------------------------------------------------------------
    def _move_now(self, c: Capsule, to: str) -> None:
        """Move ``c`` to tier ``to`` (room already planned)."""
        if to == c.tier:
            return
        if to == "disk":
            if not c.on_disk:
                self._write(c)
            self._release_resident(c)
            c.tier = "disk"
            return
        mem = self._tiers[to]
        payload = mem.allocate(c.nbytes)
        if c.resident:
            payload.copy_(c.payload)
        elif payload.device.type == "cpu":
            self._read_disk(c, into=payload)
        else:
            payload.copy_(self._read_disk(c))
        self._release_resident(c)
        mem.charge(c.nbytes)
        c.attach(payload)
        c.tier = to
        if to == "host":
            c.ensure_hashed()

    def _write(self, c: Capsule) -> None:
        """Persist ``c`` (resident) to the capsule directory and charge the disk tier."""
        host = c.payload if c.payload.device.type == "cpu" else c.payload.cpu()
        c.ensure_hashed(host)
        disk.write_capsule(self.directory, c, c.plan.views(host))
        c.on_disk = True
        self._unowned.pop(c.name, None)
        self.disk_tier.charge(c.nbytes)

    def _read_disk(self, c: Capsule, into: torch.Tensor | None = None) -> torch.Tensor:
        """Read ``c``'s verified bytes from disk into ``into`` (CPU) or a transient CPU payload."""
        def allocate(nbytes: int) -> torch.Tensor:
            if nbytes != c.nbytes:
                raise CorruptCapsule(f"capsule {c.name!r}: the file on disk holds other content than indexed")
            return torch.empty(nbytes, dtype=torch.uint8) if into is None else into

        manifest, _, payload = disk.load_capsule(self.directory, c.name, self.arena, self.fingerprint,
                                                 allocate=allocate)
        if manifest["content_hash"] != c.content_hash:
            raise CorruptCapsule(f"capsule {c.name!r}: the file on disk holds other content than indexed")
        return payload

    def _bytes_of(self, c: Capsule) -> torch.Tensor:
        """``c``'s payload, or a verified transient copy read from disk."""
        return c.payload if c.resident else self._read_disk(c)

    def _place(self, new: Capsule, source: torch.Tensor, tier: str) -> None:
        """Store a copy of ``source`` as ``new``'s bytes in ``tier`` (room already planned)."""
        if tier == "disk":
            new.attach(source)
            self._write(new)
            new.attach(None)
            return
        mem = self._tiers[tier]
        payload = mem.allocate(new.nbytes)
        payload.copy_(source)
        mem.charge(new.nbytes)
        new.attach(payload)

    def _release_resident(self, c: Capsule) -> None:
        if c.resident:
            self._tiers[c.tier].release(c.nbytes)
            c.attach(None)

    def _discard(self, c: Capsule, *, delete_files: bool) -> None:
        self._release_resident(c)
        if c.on_disk:
            if delete_files:
                disk.delete_capsule(self.directory, c.name)
            self.disk_tier.release(c.nbytes)
            c.on_disk = False
        self._capsules.pop(c.name, None)

    # verification -------------------------------------------------------------
    def _verify_stored(self, c: Capsule) -> VerifyReport:
        if not c.resident:
            return self._verify_file(c)
        names = tuple(p.name for p in c.plan.placements)
        if c.ensure_hashed():
            return VerifyReport(c.name, False, False, names, (), hashed_now=True, verified=False,
                                detail="unverified: no hash was recorded at snapshot time (hash_at_snapshot "
                                       "off); hashes recorded now, later verifies compare against them")
        now = c.compute_hashes()
        bad = tuple(n for n in names if now[n] != c.buffer_hashes[n])
        return VerifyReport(c.name, not bad, False, names, bad,
                            detail="" if not bad else f"hash mismatch in {list(bad)}")

    def _verify_file(self, c: Capsule) -> VerifyReport:
        """Read and hash ``c``'s file (needs no lock: reads only the file and ``c``'s fixed fields)."""
        names = tuple(p.name for p in c.plan.placements)
        try:
            with disk.open_capsule(self.directory, c.name) as f:
                plan = disk.check_manifest(f.manifest, self.arena, self.fingerprint)
                if f.manifest["content_hash"] != c.content_hash:
                    return VerifyReport(c.name, False, False, names, names, detail="file holds other content")
                payload = torch.empty(plan.nbytes, dtype=torch.uint8)
                bad = disk.read_tensors(f, plan, payload)
                if not bad:
                    disk.check_payload_meta(f.manifest, self.arena, plan, payload)
        except FlashRTError as exc:
            return VerifyReport(c.name, False, False, names, names, detail=str(exc))
        return VerifyReport(c.name, not bad, False, names, tuple(bad),
                            detail="" if not bad else f"hash mismatch in {bad}")

    def _verify_live(self, c: Capsule) -> VerifyReport:
        self._check_compatible(c)
        payload = self._bytes_of(c)
        _, _, extents = self._read_meta()
        names = tuple(p.name for p in c.plan.placements)
        bad = []
        for p in c.plan.placements:
            if extents[p.name] != c.extents[p.name]:
                bad.append(p.name)
                continue
            live = self.arena.live_view(p.name)
            stored = c.plan.view(payload, p.name).to(live.device)
            if not torch.equal(_as_bytes(live), _as_bytes(stored)):
                bad.append(p.name)
        return VerifyReport(c.name, not bad, True, names, tuple(bad),
                            detail="" if not bad else f"live state differs in {bad}")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes, so that NaN payloads and -0.0 compare by bits, not by value."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _check_tier(tier: str) -> None:
    if tier not in TIER_NAMES:
        raise InvalidArgument(f"unknown tier {tier!r}; use one of {TIER_NAMES}")
