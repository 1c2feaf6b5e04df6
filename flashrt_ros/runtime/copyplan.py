"""Where each buffer's live bytes sit in a capsule payload, and the fewest copies to move them.

Why: the arena packs every buffer into one contiguous block, so the live state
is mostly a handful of contiguous byte ranges. Copying range by range instead
of buffer by buffer turns a snapshot of a 100-buffer model into a few copies
(one when every live extent is full); large copies are plain device memcpys,
the small ones of one transfer share one ``torch._foreach_copy_`` (a single
multi-tensor launch on CUDA), which is what makes sub-millisecond capsules
possible.

A buffer is *contiguous* when its live extent is a byte prefix of the buffer
(no live axis, a full extent, or every dimension before the live axis has size
1). Consecutive contiguous buffers form one *run* as long as each one before
the last is fully live; the alignment padding between them (never read by
anything) is copied along. A buffer whose live extent is strided (e.g. a
``(heads, max_len, dim)`` KV cache live along axis 1) gets its own segment and
is copied through a view.

The payload keeps the block's relative offsets inside a run and starts every
segment on ``BUFFER_ALIGNMENT``, so the per-buffer views of the payload can be
reinterpreted as the buffer's dtype.
"""
from __future__ import annotations

import math
import weakref
from typing import Collection, Mapping, NamedTuple

import torch

from flashrt_ros.runtime.arena import BUFFER_ALIGNMENT, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


class Placement(NamedTuple):
    """One buffer's live bytes: ``block[src, src+nbytes)`` <-> ``payload[dst, dst+nbytes)``."""

    name: str
    index: int            # position in layout order (adjacency test for merging)
    run: int              # segment id; buffers of one run merge into one copy
    src: int              # byte offset in the arena block
    dst: int              # byte offset in the payload
    nbytes: int
    live_shape: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool      # False: copied through a strided view of the arena tensor
    live_axis: int | None
    extent: int | None


class Copy(NamedTuple):
    """A single byte-range copy, or (``strided``) one buffer copied through its view."""

    src: int
    dst: int
    nbytes: int
    strided: Placement | None = None


class _Static(NamedTuple):
    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    itemsize: int
    nbytes: int
    live_axis: int | None
    rows_first: bool      # every dim before the live axis is 1: a partial extent is still a prefix


_LAYOUTS: "weakref.WeakKeyDictionary[StateArena, list[_Static]]" = weakref.WeakKeyDictionary()


def _layout(arena: StateArena) -> list[_Static]:
    """Per-buffer facts that never change for an arena (computed once)."""
    cached = _LAYOUTS.get(arena)
    if cached is None:
        cached = []
        for s in arena.specs:
            itemsize = s.dtype.itemsize
            rows_first = s.live_axis is not None and math.prod(s.shape[: s.live_axis]) == 1
            cached.append(_Static(s.name, arena.offset(s.name), tuple(s.shape), s.dtype, itemsize,
                                  math.prod(s.shape) * itemsize, s.live_axis, rows_first))
        _LAYOUTS[arena] = cached
    return cached


def live_shape(shape: tuple[int, ...], live_axis: int | None, extent: int | None) -> tuple[int, ...]:
    if live_axis is None or extent is None:
        return tuple(shape)
    return shape[:live_axis] + (extent,) + shape[live_axis + 1:]


def _align(n: int) -> int:
    return (n + BUFFER_ALIGNMENT - 1) // BUFFER_ALIGNMENT * BUFFER_ALIGNMENT


class CopyPlan:
    """The payload layout of one capsule (fixed by the arena layout and the extents)."""

    def __init__(self, placements: list[Placement], nbytes: int) -> None:
        self.placements = placements
        self.by_name = {p.name: p for p in placements}
        self.nbytes = nbytes
        self._all_copies = self._merge(None)

    @classmethod
    def build(cls, arena: StateArena, extents: Mapping[str, int | None],
              names: Collection[str] | None = None, *, merge: bool = True) -> CopyPlan:
        """Plan the payload for ``names`` (default: every buffer) at the given live extents.

        ``merge=False`` gives one segment per buffer (only for measuring what
        merging saves).
        """
        selected = None if names is None else set(names)
        if selected is not None and not selected <= set(arena):
            raise InvalidArgument(f"no state buffers named {sorted(selected - set(arena))}")
        placements: list[Placement] = []
        cursor = run_src = run_dst = 0
        run = -1
        run_open = False          # may the next buffer extend the current run?
        for index, st in enumerate(_layout(arena)):
            if selected is not None and st.name not in selected:
                run_open = False
                continue
            if st.live_axis is None:
                extent, shape, nbytes, prefix = None, st.shape, st.nbytes, True
            else:
                extent = extents.get(st.name)
                if extent is None or not 0 <= extent <= st.shape[st.live_axis]:
                    raise InvalidArgument(f"buffer {st.name}: live extent {extent!r} out of range")
                shape = live_shape(st.shape, st.live_axis, extent)
                nbytes = math.prod(shape) * st.itemsize
                prefix = st.rows_first or nbytes == st.nbytes
            full = nbytes == st.nbytes
            if prefix and run_open and merge:
                dst = run_dst + (st.offset - run_src)
            else:
                run += 1
                dst = cursor = _align(cursor)
                run_src, run_dst = st.offset, dst
            placements.append(Placement(st.name, index, run, st.offset, dst, nbytes, shape, st.dtype,
                                        prefix, st.live_axis, extent))
            cursor = dst + nbytes
            run_open = prefix and full
        return cls(placements, _align(cursor) if placements else 0)

    def copies(self, names: Collection[str] | None = None) -> list[Copy]:
        """The merged copies for all placements, or only for those in ``names``."""
        return self._all_copies if names is None else self._merge(set(names))

    def _merge(self, names: set[str] | None) -> list[Copy]:
        out: list[list] = []
        last: Placement | None = None
        for p in self.placements:
            if names is not None and p.name not in names:
                last = None
                continue
            if not p.contiguous:
                out.append([p.src, p.dst, p.nbytes, p])
                last = None
                continue
            if last is not None and last.run == p.run and last.index + 1 == p.index and out:
                out[-1][2] = p.dst + p.nbytes - out[-1][1]
            elif p.nbytes:
                out.append([p.src, p.dst, p.nbytes, None])
            last = p
        return [Copy(*c) for c in out]

    # --- views ------------------------------------------------------------
    def view(self, payload: torch.Tensor, name: str) -> torch.Tensor:
        """Buffer ``name``'s live extent inside ``payload`` (a view: no copy)."""
        p = self.by_name[name]
        if p.nbytes == 0:
            return torch.empty(p.live_shape, dtype=p.dtype, device=payload.device)
        return payload[p.dst: p.dst + p.nbytes].view(p.dtype).view(p.live_shape)

    def views(self, payload: torch.Tensor) -> dict[str, torch.Tensor]:
        return {p.name: self.view(payload, p.name) for p in self.placements}

    def byte_view(self, payload: torch.Tensor, name: str) -> torch.Tensor:
        p = self.by_name[name]
        return payload[p.dst: p.dst + p.nbytes]


def arena_target(arena: StateArena, p: Placement) -> torch.Tensor:
    """The arena region a strided placement maps to, at the placement's own extent."""
    t = arena[p.name]
    if p.live_axis is None or p.extent is None:
        return t
    return t.narrow(p.live_axis, 0, p.extent)


class BoundCopies:
    """The copies of one plan bound to one arena and one payload, ready to run either way.

    Binding makes the views once; running is then one ``_foreach_copy_`` per
    direction for the byte ranges (plus one for strided buffers, if any). Keep
    a BoundCopies as long as its payload lives (the rollback ring binds its
    slots once at start-up).
    """

    def __init__(self, arena: StateArena, plan: CopyPlan, payload: torch.Tensor,
                 names: Collection[str] | None = None) -> None:
        self.fused = payload.device == arena.block.device     # _foreach_copy_ wants one device
        self.arena_bytes: list[torch.Tensor] = []
        self.payload_bytes: list[torch.Tensor] = []
        self.arena_views: list[torch.Tensor] = []
        self.payload_views: list[torch.Tensor] = []
        for c in plan.copies(names):
            if c.strided is not None:
                self.arena_views.append(arena_target(arena, c.strided))
                self.payload_views.append(plan.view(payload, c.strided.name))
            else:
                self.arena_bytes.append(arena.block[c.src: c.src + c.nbytes])
                self.payload_bytes.append(payload[c.dst: c.dst + c.nbytes])

    def __len__(self) -> int:
        return len(self.arena_bytes) + len(self.arena_views)

    def to_payload(self, *, non_blocking: bool = False) -> int:
        """Arena -> payload (a snapshot); returns the number of copies."""
        _copy_all(self.payload_bytes, self.arena_bytes, non_blocking, self.fused)
        _copy_all(self.payload_views, self.arena_views, non_blocking, self.fused)
        return len(self)

    def to_arena(self, *, non_blocking: bool = False) -> int:
        """Payload -> arena (a restore), into the very same arena tensors; returns the number of copies."""
        _copy_all(self.arena_bytes, self.payload_bytes, non_blocking, self.fused)
        _copy_all(self.arena_views, self.payload_views, non_blocking, self.fused)
        return len(self)


#: Segments at least this large get their own ``copy_`` (a device memcpy at full bandwidth);
#: smaller ones share one ``_foreach_copy_`` launch (benchmarks/kernel_segment_copies.py
#: compares the two on the GPU).
LARGE_SEGMENT_BYTES = 1 << 20


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool, fused: bool) -> None:
    small_dst, small_src = [], []
    for d, s in zip(dst, src):
        if d.numel() * d.element_size() >= LARGE_SEGMENT_BYTES or not fused:
            d.copy_(s, non_blocking=non_blocking)
        else:
            small_dst.append(d)
            small_src.append(s)
    if len(small_dst) > 1 and hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(small_dst, small_src, non_blocking=non_blocking)
    elif small_dst:
        small_dst[0].copy_(small_src[0], non_blocking=non_blocking)


def gather(arena: StateArena, plan: CopyPlan, payload: torch.Tensor,
           names: Collection[str] | None = None, *, non_blocking: bool = False) -> int:
    """Copy arena live bytes into ``payload``; returns the number of copies."""
    return BoundCopies(arena, plan, payload, names).to_payload(non_blocking=non_blocking)

