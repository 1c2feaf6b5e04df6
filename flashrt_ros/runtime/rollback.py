"""The rollback ring: byte-exact undo of the last few committed boundaries, cheap enough to be always on.

Why it is cheap: an append-only buffer (a KV cache) only ever gains rows while
its live length grows, so the rows of an older boundary are still in place;
rolling back just restores the old *length*. And the length lives in an int64
scalar buffer (``length_from``), which is itself ordinary state. So the ring
copies only the buffers that are not append-only (recurrent and conv state,
meta scalars, rng bytes, ...) -- usually a small fraction of the arena --
into storage preallocated once at fixed addresses, with the copy views bound
once: ``record()`` is one multi-tensor copy of the merged contiguous runs, no
allocation and no host sync.

When the shortcut is unsound: rows below an old length can only have been
overwritten if the live length dropped below it later (a rollback, a crop) or
something wrote the arena from outside the engine (a capsule restore, a
session switch). Outside writers must call ``invalidate()``, which starts a
new timeline (epoch) and forgets older entries; ``CapsuleStore.restore`` does.
Shrinking is checked at ``rollback()`` time from the recorded lengths (one
small device-to-host read), so ``record()`` stays sync-free.

A timeline's first entry (after a restore, reset or session switch:
``restart()``) is recorded lazily, right before the next step changes the
arena (``before_step()``, which every engine calls first) or before a
rollback: the verb that replaced the state then costs only its own copy.

Entry semantics: entries are the states right after each ``record()``; the
newest is "now" (if nothing ran since). ``rollback(k)`` restores the entry
``k`` records before the newest and discards the newer ones, so ``rollback(0)``
discards whatever ran since the last record. Bytes past a restored live extent
(e.g. KV rows of discarded tokens) are left in place: they are never read.
"""
from __future__ import annotations

import threading

import torch

from flashrt_ros.runtime.arena import POSITION, StateArena
from flashrt_ros.runtime.copyplan import BoundCopies, CopyPlan
from flashrt_ros.runtime.errors import InvalidArgument


class RollbackRing:
    """Fixed-capacity history of the non-append-only state, ``depth`` steps deep."""

    def __init__(self, arena: StateArena, depth: int) -> None:
        if depth < 0:
            raise InvalidArgument(f"rollback depth must be >= 0, got {depth}")
        self.arena = arena
        self.depth = depth
        self._append = [(s.name, s.length_from) for s in arena.specs if s.append_only and s.length_from]
        skipped = {n for n, _ in self._append}
        tracked = [s.name for s in arena.specs if s.name not in skipped]
        full = {s.name: (s.shape[s.live_axis] if s.live_axis is not None else None) for s in arena.specs}
        self.plan = CopyPlan.build(arena, full, tracked)
        self._slots = torch.zeros((depth + 1, max(self.plan.nbytes, 1)), dtype=torch.uint8, device=arena.device)
        self._bound = [BoundCopies(arena, self.plan, self._slots[i]) for i in range(depth + 1)]
        self._length_names = sorted({lf for _, lf in self._append})
        self._lock = threading.Lock()
        self._head = 0      # slot the next record() writes
        self._count = 0     # valid entries (<= depth + 1)
        self._start_pending = False   # restart(): the current state is an entry not yet copied
        self.epoch = 0

    @property
    def nbytes(self) -> int:
        return self._slots.numel()

    @property
    def available(self) -> int:
        """How many steps ``rollback`` can go back right now."""
        return max(self._count - 1, 0)

    def record(self) -> None:
        """Append the current state (call after each committed boundary)."""
        with self._lock:
            self._record_locked()

    def _record_locked(self) -> None:
        self._bound[self._head].to_payload()
        self._head = (self._head + 1) % (self.depth + 1)
        self._count = min(self._count + 1, self.depth + 1)
        self._start_pending = False

    def invalidate(self) -> None:
        """Forget all entries: the arena was written from outside the recorded timeline."""
        with self._lock:
            self._count = 0
            self._start_pending = False
            self.epoch += 1

    def restart(self) -> None:
        """Start a new timeline whose first entry is the current state (after a restore or reset).

        The entry is copied lazily by ``before_step()`` or ``rollback()``; until
        then nothing may write the arena except through them.
        """
        with self._lock:
            self._count = 0
            self._start_pending = True
            self.epoch += 1

    def before_step(self) -> None:
        """Call before anything changes the arena: records a pending timeline start now."""
        if self._start_pending:
            with self._lock:
                if self._start_pending:
                    self._record_locked()

    def rollback(self, steps: int) -> int:
        """Restore the state of ``steps`` records ago byte-exactly; returns the new position."""
        with self._lock:
            if not isinstance(steps, int) or steps < 0:
                raise InvalidArgument(f"rollback steps must be an int >= 0, got {steps!r}")
            if self._start_pending:
                self._record_locked()
            if self._count == 0:
                raise InvalidArgument("nothing recorded to roll back to (0 steps available)")
            if steps > self.available:
                raise InvalidArgument(f"cannot roll back {steps} steps: only {self.available} available "
                                      f"(ring depth {self.depth})")
            slots = self.depth + 1
            target = (self._head - 1 - steps) % slots
            later = [(target + i) % slots for i in range(1, steps + 1)]
            self._check_append_only_intact(target, later)
            self._bound[target].to_arena()
            self._head = (target + 1) % slots
            self._count -= steps
            return int(self.arena[POSITION].item()) if POSITION in self.arena else -1

    def _check_append_only_intact(self, target: int, later: list[int]) -> None:
        """Rows below the target's lengths must not have been rewritten since it was recorded."""
        if not self._append:
            return
        rows = [target, *later]
        recorded = torch.stack([self.plan.view(self._slots[r], n) for r in rows for n in self._length_names])
        now = torch.stack([self.arena[n] for n in self._length_names])
        values = torch.cat([recorded, now]).view(len(rows) + 1, len(self._length_names)).tolist()
        want, rest = values[0], values[1:]
        for j, lname in enumerate(self._length_names):
            low = min(v[j] for v in rest)
            if low < want[j]:
                users = [n for n, lf in self._append if lf == lname]
                raise InvalidArgument(
                    f"cannot roll back: {lname} dropped to {low} below the target's {want[j]} since then, "
                    f"so append-only rows of {users} may have been rewritten")
