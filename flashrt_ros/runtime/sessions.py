"""Sessions: several conversations (or episodes) time-sharing the one arena.

Why parking through capsules: the arena is the only place live state can be,
so a session that is not current exists only as a capsule. ``switch_to``
snapshots the current session's live state into a hidden capsule
(``.session.<name>``; names starting with '.' cannot be addressed by users)
and then restores the target's parked state, or starts the target cold (the
engine's ``cold_start``; by default a zeroed arena) or from a given capsule. Parked sessions obey the store's
budgets like any capsule (they can be demoted down to disk, never deleted), so
a switch that finds no room fails with ``BudgetExhausted`` and changes nothing.

A switch writes the arena from outside the engine: call it at a boundary
(``BoundaryGate.run_at_boundary``). The rollback history does not survive a
switch (the ring is reseeded with the state switched to).
"""
from __future__ import annotations

from typing import Any, Callable

from flashrt_ros.runtime.errors import CapsuleNotFound, InvalidArgument
from flashrt_ros.runtime.names import validate_capsule_name
from flashrt_ros.runtime.store import CapsuleStore

PARK_PREFIX = ".session."


def parked_name(session: str) -> str:
    return PARK_PREFIX + session


class SessionManager:
    """Named sessions over one store; exactly one is live in the arena at a time."""

    def __init__(self, store: CapsuleStore, *, initial: str = "default", park_tier: str | None = None,
                 cold_start: Callable[[], None] | None = None) -> None:
        self.store = store
        self.park_tier = park_tier
        self._cold_start = cold_start or self._zero
        self._current = validate_capsule_name(initial, what="session name")
        self._known: set[str] = {self._current}

    @property
    def current(self) -> str:
        return self._current

    def sessions(self) -> list[str]:
        """All open sessions, the current one included."""
        with self.store.lock:
            return sorted(self._known)

    def snapshot(self, name: str, **kwargs) -> object:
        """``store.snapshot`` tagged with the current session."""
        return self.store.snapshot(name, session=self._current, **kwargs)

    def switch_to(self, session: str, *, from_capsule: str | None = None,
                  then: Callable[[], Any] | None = None) -> str:
        """Park the current session and make ``session`` live; returns the previous session.

        A session seen before resumes exactly where it was parked; a new one
        starts from ``from_capsule`` if given, else from a zeroed arena.
        ``then()`` runs on the target's state before the switch is committed
        (a goal's checks, its start capsule): if it raises, the switch is
        undone (the previous session live again, byte-exact; a new session
        forgotten; a parked one still parked as it was) and the error re-raised.
        """
        validate_capsule_name(session, what="session name")
        with self.store.lock:
            if session == self._current:
                if from_capsule is not None:
                    raise InvalidArgument(f"session {session!r} is already current; restore the capsule instead")
                return session
            if session in self._known and from_capsule is not None:
                raise InvalidArgument(f"session {session!r} already exists; from_capsule only seeds new ones")
            if from_capsule is not None:
                self.store.get(from_capsule)          # fail before parking anything
            previous = self._current
            self.store._snapshot(parked_name(previous), session=previous, tier=self.park_tier,
                                 pinned=False, overwrite=True, hidden=True)
            try:
                if session in self._known:
                    self.store._restore(parked_name(session), verify=False, groups=None)
                elif from_capsule is not None:
                    self.store.restore(from_capsule)
                else:
                    self._cold_start()
                if then is not None:
                    then()
                if session in self._known:
                    self.store._drop(parked_name(session))
            except BaseException:
                # the arena may be half-written: bring the parked state back, then re-raise
                self.store._restore(parked_name(previous), verify=False, groups=None)
                self.store._drop(parked_name(previous))
                raise
            self._known.add(session)
            self._current = session
            return previous

    def _zero(self) -> None:
        """The default cold start: every buffer zero, the ring reseeded with that state."""
        self.store.arena.zero_()
        self.store.ring.restart()

    def close(self, session: str) -> None:
        """Forget a parked session and free its capsule (switch away from it first)."""
        validate_capsule_name(session, what="session name")
        with self.store.lock:
            if session == self._current:
                raise InvalidArgument(f"session {session!r} is current; switch to another one before closing it")
            if session not in self._known:
                raise CapsuleNotFound(f"no session named {session!r}")
            self.store._drop(parked_name(session))
            self._known.discard(session)
