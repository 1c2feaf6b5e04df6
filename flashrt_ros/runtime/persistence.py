"""The store's disk verbs: ``save`` a capsule to its directory, ``load`` one from it, index it at start.

Why a room of its own: these are the verbs that do file I/O on request, and they
do it without holding the store lock, so other verbs answer meanwhile: ``save``
writes its temp file unlocked and only checks before and renames after under the
lock (a payload being saved is never overwritten in place: ``is_saving``);
``load`` reads and verifies the file unlocked and indexes it under the lock. A
capsule overwritten, dropped or moved to disk during a save is not renamed over:
the temp file is removed. Any process may have written a file that ``load``
reads: every byte is verified (``disk``), and a file indexed at start that turns
out unusable is unindexed, its name kept taken.
"""
from __future__ import annotations

import threading

from flashrt_ros.runtime.capsule import Capsule
from flashrt_ros.runtime.capsule_files import CapsuleFiles
from flashrt_ros.runtime.catalogue import Catalogue
from flashrt_ros.runtime.disk import SUFFIX
from flashrt_ros.runtime.errors import (AlreadyExists, BudgetExhausted, CapsuleNotFound, CorruptCapsule,
                                        FingerprintMismatch, FlashRTError, LayoutMismatch, PinnedCapsule)
from flashrt_ros.runtime.placement import Placement


class Persistence:
    """``save`` and ``load`` of one store (names validated by the store), and its start-up index."""

    def __init__(self, lock: threading.RLock, catalogue: Catalogue, placement: Placement,
                 files: CapsuleFiles) -> None:
        self.lock = lock
        self.catalogue = catalogue
        self.placement = placement
        self.files = files
        self._saving: dict[str, int] = {}     # capsules whose payload a save reads without the lock

    def index_directory(self) -> None:
        """Learn the directory's capsules (header and manifest checked; bytes on first read).

        Files that fail the checks (another model, damaged, ...) are not indexed
        but keep their name taken, so nothing overwrites them without ``overwrite``.
        """
        found, refused = self.files.index()
        self.catalogue.unowned.update(refused)
        for c in found:
            self.catalogue.put(c)
            self.placement.disk_tier.charge(c.nbytes)

    def is_saving(self, name: str) -> bool:
        """Whether a save is reading capsule ``name``'s payload right now (do not overwrite it in place)."""
        return name in self._saving

    def save(self, name: str) -> Capsule:
        """Write capsule ``name`` to the disk tier, keeping any resident copy (see module doc)."""
        with self.lock:
            c = self.catalogue.get(name)
            self.placement.require_disk("disk")
            if c.on_disk:
                return c
            self._check_save_allowed(c)
            host = c.payload if c.payload.device.type == "cpu" else c.payload.cpu()
            c.ensure_hashed(host)
            self._saving[c.name] = self._saving.get(c.name, 0) + 1    # no in-place overwrite meanwhile
        try:
            tmp = self.files.write_temp(c, host)
        finally:
            with self.lock:
                self._done_saving(c.name)
        with self.lock:
            if self.catalogue.find(name) is not c or c.on_disk:
                self.files.discard_temp(tmp)
                if c.on_disk and self.catalogue.find(name) is c:
                    return c                      # a demotion wrote the same capsule meanwhile
                raise CapsuleNotFound(f"capsule {name!r} was dropped or replaced while it was being "
                                      "saved; nothing was written")
            try:
                self._check_save_allowed(c)
            except FlashRTError:
                self.files.discard_temp(tmp)
                raise
            self.files.commit_temp(tmp, c)
            c.on_disk = True
            self.catalogue.unowned.pop(c.name, None)
            self.placement.disk_tier.charge(c.nbytes)
            return c

    def _check_save_allowed(self, c: Capsule) -> None:
        if self.files.path(c.name).exists():
            raise AlreadyExists(f"a file {c.name}{SUFFIX} that this store did not write is in "
                                f"{self.files.directory}; drop or rename the capsule, or delete the file")
        if not self.placement.disk_tier.fits(c.nbytes):
            raise BudgetExhausted(self.placement.no_room_message("disk", c.nbytes))

    def _done_saving(self, name: str) -> None:
        left = self._saving.pop(name, 1) - 1
        if left:
            self._saving[name] = left

    def load(self, name: str, *, tier: str | None, overwrite: bool) -> Capsule:
        """Read, verify and index the file of ``name`` (tier checked by the store; None: host if it fits).

        A name the store indexed from the directory (a disk-only capsule of this
        very file) loads without ``overwrite``.
        """
        placement = self.placement
        with self.lock:
            placement.require_disk("disk")
            self._check_load_allowed(name, self.catalogue.find(name), None, overwrite)
        try:
            manifest, plan, staging = self.files.load(name, allocate=placement.host_tier.allocate)
        except (CorruptCapsule, FingerprintMismatch, LayoutMismatch) as exc:
            self._forget_bad_file(name, exc)
            raise
        with self.lock:
            old = self.catalogue.find(name)
            self._check_load_allowed(name, old, manifest["content_hash"], overwrite)
            nbytes = plan.nbytes
            if not placement.fits_after_freeing("disk", nbytes, old):
                raise BudgetExhausted(placement.no_room_message("disk", nbytes))
            if tier is None:
                tier = "host" if placement.plan_room("host", nbytes, freed=old) is not None else "disk"
            moves = placement.plan_room(tier, nbytes, freed=old) if tier != "disk" else []
            if moves is None:
                raise BudgetExhausted(placement.no_room_message(tier, nbytes))
            placement.apply(moves)
            new = self.files.capsule_from_manifest(manifest, plan, tier)
            if old is not None:
                placement.discard(old, delete_files=False)
            self.catalogue.unowned.pop(name, None)
            placement.disk_tier.charge(nbytes)
            if tier == "host":
                placement.host_tier.charge(nbytes)
                new.attach(staging)
            elif tier == "device":
                placement.place(new, staging, "device")
            self.catalogue.put(new)
            return new

    def _forget_bad_file(self, name: str, exc: FlashRTError) -> None:
        """A file indexed at start (header only) turned out unusable: unindex it, keep its name taken."""
        with self.lock:
            c = self.catalogue.find(name)
            if c is not None and c.on_disk and not c.resident and not c.pinned:
                self.placement.discard(c, delete_files=False)
                self.catalogue.unowned[name] = f"{exc.code.name}: {exc}"

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
