"""Host copies of arena scalars, valid while the engine's state version is unchanged.

Why: a step that must branch on a device scalar (an LLM's position, a policy's
queue fill) would otherwise start with a device-to-host sync. The engine's own
steps know how they change those scalars, so they keep the new values here;
anything that writes the arena from outside the steps (restore, rollback,
reset, a session switch) changes ``version()`` (``CapsuleVerbs.version``), which
discards the copy, and the next ``get`` reads the arena once. The arena stays the
only truth.
"""
from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class HostMirror(Generic[T]):
    """``get()``: the kept value if the version still matches, else ``read()`` once and keep it."""

    def __init__(self, version: Callable[[], Hashable], read: Callable[[], T]) -> None:
        self.version = version
        self.read = read
        self._kept: tuple[Hashable, T] | None = None

    def get(self) -> T:
        kept = self._kept
        if kept is not None and kept[0] == self.version():
            return kept[1]
        value = self.read()
        self._kept = (self.version(), value)
        return value

    def keep(self, value: T | None) -> None:
        """The value a step just left in the arena (None: forget it, read on the next ``get``)."""
        self._kept = None if value is None else (self.version(), value)
