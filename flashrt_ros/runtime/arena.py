"""The state arena: every piece of live engine state as named views into one block.

Why: a capsule is only sound if *all* state that influences the next step is
captured, and captured graphs stay valid only if restore writes into the very
same addresses. So engines declare a closed set of buffers up front; the arena
allocates them once, from one contiguous byte block per arena, and never
reallocates. Nothing that matters may live in a Python attribute.

A buffer may declare a *live extent*: only ``[0, n)`` along ``live_axis`` is
meaningful, where ``n`` is the current value of an int64 scalar buffer named by
``length_from`` (e.g. the KV cache is live only up to ``position``). Capsules
copy just the live extent; bytes past it are never read by the model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from flashrt_ros.runtime.errors import InvalidArgument, LayoutMismatch

#: Reserved scalar buffers every engine declares (int64, shape ()).
POSITION = "meta.position"   # tokens / steps committed so far
BOUNDARY = "meta.boundary"   # monotonically increasing committed-boundary counter


def core_meta_specs() -> list[BufferSpec]:
    """The two scalars the capsule runtime reads for its metadata."""
    return [
        BufferSpec(POSITION, (), torch.int64, group="meta", doc="committed position"),
        BufferSpec(BOUNDARY, (), torch.int64, group="meta", doc="committed boundary id"),
    ]


#: Alignment of every buffer inside the block, in bytes (cache-line / TMA friendly).
BUFFER_ALIGNMENT = 256


@dataclass(frozen=True)
class BufferSpec:
    """Declaration of one named state buffer.

    ``group`` classifies the state ("kv", "recurrent", "conv", "meta", "rng",
    "policy", ...) so that experiments such as a KV-only restore can select it.
    ``append_only`` promises that rows below the live length are never rewritten
    while the length grows (a KV cache): the rollback ring may then skip copying
    them, as long as no restore happened in between.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    group: str = "state"
    live_axis: int | None = None
    length_from: str | None = None
    append_only: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise InvalidArgument(f"buffer name {self.name!r} must be non-empty without spaces")
        if (self.live_axis is None) != (self.length_from is None):
            raise InvalidArgument(f"buffer {self.name}: live_axis and length_from go together")
        if self.live_axis is not None and not 0 <= self.live_axis < len(self.shape):
            raise InvalidArgument(f"buffer {self.name}: live_axis {self.live_axis} out of range")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def layout_key(self) -> str:
        """A string that changes whenever the buffer's byte layout changes."""
        return (f"{self.name}:{tuple(self.shape)}:{self.dtype}:{self.group}:"
                f"{self.live_axis}:{self.length_from}:{self.append_only}")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class _Slot:
    spec: BufferSpec
    offset: int
    tensor: torch.Tensor = field(repr=False)


class StateArena:
    """Allocates declared buffers once, in one contiguous block, on one device."""

    def __init__(self, specs: Iterable[BufferSpec], device: torch.device | str = "cpu") -> None:
        specs = list(specs)
        names = [s.name for s in specs]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise InvalidArgument(f"duplicate buffer names: {sorted(duplicates)}")
        by_name = {s.name: s for s in specs}
        for s in specs:
            if s.length_from is not None:
                src = by_name.get(s.length_from)
                if src is None or src.shape != () or src.dtype != torch.int64:
                    raise InvalidArgument(
                        f"buffer {s.name}: length_from {s.length_from!r} must name an int64 scalar buffer")
        self.device = torch.device(device)
        offsets: list[int] = []
        cursor = 0
        for s in specs:
            cursor = _align(cursor)
            offsets.append(cursor)
            cursor += s.nbytes
        self.nbytes = _align(max(cursor, 1))
        self.block = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._slots: dict[str, _Slot] = {}
        for s, off in zip(specs, offsets):
            raw = self.block[off: off + s.nbytes]
            view = raw.view(s.dtype).view(s.shape) if s.nbytes else torch.empty(s.shape, dtype=s.dtype, device=self.device)
            self._slots[s.name] = _Slot(s, off, view)

    # --- access -----------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._slots[name].tensor
        except KeyError:
            raise InvalidArgument(f"no state buffer named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    @property
    def specs(self) -> list[BufferSpec]:
        return [slot.spec for slot in self._slots.values()]

    def spec(self, name: str) -> BufferSpec:
        return self._slots[name].spec

    def offset(self, name: str) -> int:
        return self._slots[name].offset

    def layout_key(self) -> str:
        """Identifies the layout; capsules from another layout are refused."""
        return "|".join(s.layout_key() for s in self.specs)

    def check_same_layout(self, other_layout_key: str) -> None:
        if other_layout_key != self.layout_key():
            raise LayoutMismatch("capsule was taken from an arena with a different buffer layout")

    # --- live extents -----------------------------------------------------
    def live_length(self, name: str) -> int | None:
        """Live length along ``live_axis`` (host read: call only at a boundary)."""
        spec = self._slots[name].spec
        if spec.length_from is None:
            return None
        n = int(self[spec.length_from].item())
        return max(0, min(n, spec.shape[spec.live_axis]))

    def live_view(self, name: str) -> torch.Tensor:
        """The live part of a buffer (a view: no copy)."""
        spec = self._slots[name].spec
        t = self[name]
        n = self.live_length(name)
        if n is None:
            return t
        return t.narrow(spec.live_axis, 0, n)

    def live_nbytes(self) -> int:
        return sum(self.live_view(n).numel() * _itemsize(self.spec(n).dtype) for n in self)

    def zero_(self) -> None:
        """Reset all state (a cold start) in place; addresses do not change."""
        self.block.zero_()


def _align(n: int) -> int:
    return (n + BUFFER_ALIGNMENT - 1) // BUFFER_ALIGNMENT * BUFFER_ALIGNMENT
