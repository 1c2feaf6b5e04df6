"""The capsule store's names: its capsules in least-recently-used order, and names held by files.

Why a room of its own: every verb of the store starts by finding a capsule or
checking that a name is free, and the budget planner walks the capsules oldest
use first; this is the one place that order and those rules live. A name is
taken while the store holds a capsule of that name *or* its directory holds a
file of that name that the store does not index (another model's, a damaged
one, one kept by ``drop(delete_files=False)``), across restarts too.
Not thread-safe by itself: the store calls it under its lock.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

from flashrt_ros.runtime.capsule import Capsule, CapsuleSummary
from flashrt_ros.runtime.disk import SUFFIX
from flashrt_ros.runtime.errors import AlreadyExists, CapsuleNotFound


class Catalogue:
    """Named capsules, least recently used first, and the names of files the store does not use."""

    def __init__(self) -> None:
        self._capsules: OrderedDict[str, Capsule] = OrderedDict()   # least recently used first
        #: files in the directory that the store does not index, and why (their names stay taken)
        self.unowned: dict[str, str] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._capsules

    def __len__(self) -> int:
        return len(self._capsules)

    def __iter__(self) -> Iterator[Capsule]:
        """The capsules, least recently used first (a copy: callers may change the catalogue meanwhile)."""
        return iter(list(self._capsules.values()))

    def find(self, name: str) -> Capsule | None:
        return self._capsules.get(name)

    def get(self, name: str) -> Capsule:
        try:
            return self._capsules[name]
        except KeyError:
            raise CapsuleNotFound(f"no capsule named {name!r}") from None

    def put(self, c: Capsule) -> None:
        """Add ``c`` under its name as the most recently used (its name must not be held by another)."""
        self._capsules[c.name] = c

    def remove(self, name: str) -> None:
        self._capsules.pop(name, None)

    def touch(self, c: Capsule) -> None:
        """Mark ``c`` as the most recently used."""
        self._capsules.move_to_end(c.name)

    def summaries(self, include_hidden: bool) -> list[CapsuleSummary]:
        """Metadata of every capsule (hidden ones only if asked), oldest first."""
        caps = [c for c in self._capsules.values() if include_hidden or not c.hidden]
        return [c.info() for c in sorted(caps, key=lambda c: c.created_at)]

    def check_no_file(self, name: str, overwrite: bool) -> None:
        """A file the store does not index still takes its name (across restarts too)."""
        if name in self.unowned and not overwrite:
            raise AlreadyExists(f"capsule directory holds a file {name}{SUFFIX} this store does not "
                                f"use ({self.unowned[name][:200]}); pass overwrite to replace it")
