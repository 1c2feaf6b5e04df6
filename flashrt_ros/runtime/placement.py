"""Where a capsule's bytes live: device, host or disk, under per-tier byte budgets, LRU demoted first.

Why a room of its own: every verb that adds bytes to a tier (snapshot, fork, move,
load, a restore from disk) must first make room, and the rules for that are the
subtle part of the store:
* A full tier first demotes least-recently-used unpinned capsules device -> host
  -> disk (disk only with a directory). Pinned capsules never move on their own.
* If there is still no room, ``BudgetExhausted`` is raised and nothing has
  changed: the whole demotion chain is planned on paper (``plan_room``) before
  any byte moves (``apply``). Only a real allocator failure after a successful
  plan (the budget was set above what the device really has) can leave planned
  demotions done; their bytes are intact.
* Every tier counts ``Capsule.nbytes``, so a capsule costs the same everywhere;
  the disk tier counts every capsule that has a file, resident or not.
Not thread-safe by itself: the store calls it under its lock.
"""
from __future__ import annotations

from typing import Collection

import torch

from flashrt_ros.runtime.capsule import TIER_NAMES, Capsule
from flashrt_ros.runtime.capsule_files import CapsuleFiles
from flashrt_ros.runtime.catalogue import Catalogue
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.tiers import DiskTier, MemoryTier

_NEXT_TIER = {"device": "host", "host": "disk"}

#: A planned demotion: the capsule and the tier it moves to.
Move = tuple[Capsule, str]


def check_tier(tier: str) -> None:
    if tier not in TIER_NAMES:
        raise InvalidArgument(f"unknown tier {tier!r}; use one of {TIER_NAMES}")


class Placement:
    """The three tiers of one store, the room in each, and the moves of bytes between them."""

    def __init__(self, catalogue: Catalogue, files: CapsuleFiles, device_tier: MemoryTier,
                 host_tier: MemoryTier, disk_tier: DiskTier) -> None:
        self.catalogue = catalogue
        self.files = files
        self.device_tier, self.host_tier, self.disk_tier = device_tier, host_tier, disk_tier
        self.tiers: dict[str, MemoryTier | DiskTier] = {"device": device_tier, "host": host_tier, "disk": disk_tier}

    def require_disk(self, tier: str) -> None:
        if tier == "disk" and not self.disk_tier.enabled:
            raise InvalidArgument("this store has no capsule directory, so no disk tier")

    # --- planning (changes nothing) ------------------------------------------
    def fits_after_freeing(self, tier: str, nbytes: int, freed: Capsule | None) -> bool:
        t = self.tiers[tier]
        credit = 0
        if freed is not None and (freed.tier == tier or (tier == "disk" and freed.on_disk)):
            credit = freed.nbytes
        return t.used - credit + nbytes <= t.budget

    def plan_room(self, tier: str, nbytes: int, *, keep: Collection[str] = (),
                  freed: Capsule | None = None) -> list[Move] | None:
        """Demotions (LRU first, greedy) that make ``nbytes`` fit in ``tier``; None if impossible.

        ``keep`` names capsules that must not be demoted; ``freed`` is a capsule
        about to be replaced, whose bytes count as free. Pure: changes nothing.
        """
        used = {name: t.used for name, t in self.tiers.items()}
        if freed is not None:
            if freed.tier in ("device", "host"):
                used[freed.tier] -= freed.nbytes
            if freed.on_disk:
                used["disk"] -= freed.nbytes
        blocked = set(keep) | ({freed.name} if freed is not None else set())
        moves: list[Move] = []

        def need(t: str, n: int) -> bool:
            budget = self.tiers[t].budget
            if n > budget:
                return False
            if used[t] + n <= budget:
                return True
            nxt = _NEXT_TIER.get(t)
            if nxt is None or (nxt == "disk" and not self.disk_tier.enabled):
                return False
            for c in self.catalogue:
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

    def no_room_message(self, tier: str, nbytes: int) -> str:
        t = self.tiers[tier]
        pinned = sum(c.nbytes for c in self.catalogue if c.tier == tier and c.pinned)
        chain = {"device": "host/disk", "host": "disk", "disk": "nowhere"}[tier]
        disk_note = "" if self.disk_tier.enabled else " (no capsule directory, so no disk tier)"
        return (f"{tier} tier cannot take {nbytes} bytes: budget {t.budget}, used {t.used} "
                f"({pinned} pinned), and unpinned capsules could not be demoted to {chain}{disk_note}; "
                f"nothing was changed")

    # --- moving bytes (room already planned) -----------------------------------
    def apply(self, moves: list[Move]) -> None:
        for c, to in moves:
            self.move_now(c, to)

    def move_now(self, c: Capsule, to: str) -> None:
        """Move ``c`` to tier ``to`` (room already planned)."""
        if to == c.tier:
            return
        if to == "disk":
            if not c.on_disk:
                self.persist(c)
            self.release_resident(c)
            c.tier = "disk"
            return
        mem = self.tiers[to]
        payload = mem.allocate(c.nbytes)
        if c.resident:
            payload.copy_(c.payload)
        elif payload.device.type == "cpu":
            self.files.read(c, into=payload)
        else:
            payload.copy_(self.files.read(c))
        self.release_resident(c)
        mem.charge(c.nbytes)
        c.attach(payload)
        c.tier = to
        if to == "host":
            c.ensure_hashed()

    def persist(self, c: Capsule) -> None:
        """Write resident ``c`` to the capsule directory and charge the disk tier."""
        self.files.write(c)
        self.catalogue.unowned.pop(c.name, None)
        self.disk_tier.charge(c.nbytes)

    def place(self, new: Capsule, source: torch.Tensor, tier: str) -> None:
        """Store a copy of ``source`` as ``new``'s bytes in ``tier`` (room already planned)."""
        if tier == "disk":
            new.attach(source)
            self.persist(new)
            new.attach(None)
            return
        mem = self.tiers[tier]
        payload = mem.allocate(new.nbytes)
        payload.copy_(source)
        mem.charge(new.nbytes)
        new.attach(payload)

    def release_resident(self, c: Capsule) -> None:
        if c.resident:
            self.tiers[c.tier].release(c.nbytes)
            c.attach(None)

    def discard(self, c: Capsule, *, delete_files: bool) -> None:
        """Forget ``c``: free its bytes in every tier, delete its file if asked, drop it from the catalogue."""
        self.release_resident(c)
        if c.on_disk:
            if delete_files:
                self.files.delete(c.name)
            self.disk_tier.release(c.nbytes)
            c.on_disk = False
        self.catalogue.remove(c.name)
