"""Every capsule verb, written once, over an arena + its boundary gate + its store.

Why one surface: the LLM engine and the policy engine differ in their steps
(prefill/decode/generate; a control step) but not in what a capsule is. Both
hand this class their arena's gate, store and cold-start routine, and every
caller — the ROS node, tests, benchmarks — uses ``engine.capsules``.

Which verbs wait for a boundary:
- the ones that read or write the arena (snapshot, restore, rollback, reset,
  verify against the live state, session switch) run through
  ``gate.run_at_boundary`` and so land between two engine steps;
- the others (fork, drop, list, get, save, load, pin, unpin, move, stored-hash
  verify) touch only the store, which has its own lock, and never wait for a step.

Verbs that replace the live state (restore, rollback, reset, switch) bump
``writes``: an engine that keeps host copies of arena scalars, or a generation
that was extending the old state, compares it to notice.

Results are ``CapsuleSummary`` records (plain metadata, no tensors), so a caller
never holds a capsule the store may demote.
"""
from __future__ import annotations

from typing import Any, Callable, Collection, TypeVar

from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.capsule import CapsuleSummary, VerifyReport
from flashrt_ros.runtime.sessions import SessionManager
from flashrt_ros.runtime.store import CapsuleStore

T = TypeVar("T")


class CapsuleVerbs:
    """snapshot, restore, fork, rollback, drop, list, get, save, load, verify, pin, unpin,
    move, reset and session switching for one engine's arena."""

    def __init__(self, gate: BoundaryGate, store: CapsuleStore, *, cold_start: Callable[..., None],
                 timeout_s: float | None = 30.0) -> None:
        self.gate = gate
        self.store = store
        self.arena = store.arena
        self.timeout_s = timeout_s              # how long a verb waits for a boundary
        self.sessions = SessionManager(store, cold_start=cold_start)
        self._cold_start = cold_start
        self.writes = 0                         # bumped by verbs that replace the live state
        # Runs at the boundary before the live state is read whole (snapshot, live verify, a session
        # parked): an engine with work in flight beside its steps brings its result in first.
        self.before_read: Callable[[], None] = lambda: None

    def version(self) -> tuple[int, int]:
        """Changes whenever the live state is replaced from outside the engine's own steps
        (restore, rollback, reset, session switch; a new rollback timeline): host copies of
        arena scalars (``engine.host_mirror``) compare it to know they are stale."""
        return self.store.ring.epoch, self.writes

    # --- verbs on the live state (at a boundary) ------------------------------
    def snapshot(self, name: str, *, session: str | None = None, tier: str | None = None,
                 pinned: bool = False, overwrite: bool = False, timeout: float | None = None) -> CapsuleSummary:
        """Capture the live state (at the next boundary) as capsule ``name``.

        ``session`` tags the capsule; None or empty: the current session.
        """
        return self._at_boundary(lambda: self.store.snapshot(
            name, session=session or self.sessions.current, tier=tier, pinned=pinned,
            overwrite=overwrite).info(), timeout=timeout, reads_live=True)

    def restore(self, name: str, *, verify: bool = False, groups: Collection[str] | None = None,
                timeout: float | None = None) -> CapsuleSummary:
        """Copy capsule ``name`` back into the live buffers (``groups``: only those groups)."""
        return self._at_boundary(lambda: self.store.restore(name, verify=verify, groups=groups).info(),
                                 replaces_state=True, timeout=timeout)

    def rollback(self, steps: int, *, timeout: float | None = None) -> int:
        """Go back ``steps`` committed boundaries (byte-exact); returns the new position."""
        return self._at_boundary(lambda: self.store.rollback(steps), replaces_state=True, timeout=timeout)

    def reset(self, *, timeout: float | None = None, **cold_start_args: Any) -> None:
        """Cold start of the current session: the engine's empty state, rollback history cleared.

        ``cold_start_args`` go to the engine's cold-start routine (the policy
        engine takes ``seed``: the new episode's noise stream); it refuses bad
        ones before changing anything.
        """
        self._at_boundary(lambda: self._cold_start(**cold_start_args), replaces_state=True, timeout=timeout)

    def verify(self, name: str, *, against_live: bool = False, timeout: float | None = None) -> VerifyReport:
        """Re-hash the stored bytes, or (``against_live``, at a boundary) compare them with the arena."""
        if against_live:
            return self._at_boundary(lambda: self.store.verify(name, against_live=True), timeout=timeout,
                                     reads_live=True)
        return self.store.verify(name)

    def switch_session(self, session: str, *, from_capsule: str | None = None,
                       timeout: float | None = None) -> str:
        """Park the current session and make ``session`` live (see ``runtime.sessions``).

        Returns the previous session. Switching to the current session changes nothing.
        """
        if session == self.sessions.current and from_capsule is None:
            return session
        return self._at_boundary(lambda: self.sessions.switch_to(session, from_capsule=from_capsule),
                                 replaces_state=True, timeout=timeout, reads_live=True)

    def enter_session(self, session: str, prepare: Callable[[], T], *,
                      timeout: float | None = None) -> T:
        """Make ``session`` live (empty: stay) and run ``prepare()`` there, at one boundary.

        Why one boundary: a goal that names a session checks its request against
        that session's transcript and takes its start capsule there; if any of
        that refuses, the switch is undone before anything else can see it, so a
        refused goal leaves the live state and the current session as they were.
        Returns ``prepare()``'s result.
        """
        if not session or session == self.sessions.current:
            return self._at_boundary(prepare, timeout=timeout)
        out: list[T] = []
        self._at_boundary(lambda: self.sessions.switch_to(session, then=lambda: out.append(prepare())),
                          replaces_state=True, timeout=timeout, reads_live=True)
        return out[0]

    # --- verbs on the store only (never wait for a step) ------------------------
    def fork(self, source: str, new_name: str, *, tier: str | None = None) -> CapsuleSummary:
        """An independent copy of ``source`` named ``new_name``."""
        return self.store.fork(source, new_name, tier=tier).info()

    def drop(self, name: str) -> None:
        """Forget capsule ``name`` and delete its files."""
        self.store.drop(name)

    def close_session(self, session: str) -> None:
        """Forget parked ``session`` and free its parked capsule (the current one is refused)."""
        self.sessions.close(session)

    def list(self, *, session: str | None = None) -> list[CapsuleSummary]:
        """Metadata of every capsule (only ``session``'s when given), oldest first."""
        return [c for c in self.store.list() if not session or c.session == session]

    def get(self, name: str) -> CapsuleSummary:
        return self.store.get(name).info()

    def save(self, name: str) -> CapsuleSummary:
        """Write capsule ``name`` to the disk tier (keeping any resident copy)."""
        return self.store.save(name).info()

    def load(self, name: str, *, tier: str | None = None, overwrite: bool = False) -> CapsuleSummary:
        """Index and verify a capsule file from the capsule directory."""
        return self.store.load(name, tier=tier, overwrite=overwrite).info()

    def pin(self, name: str) -> CapsuleSummary:
        """Keep ``name`` where it is: budgets never demote a pinned capsule."""
        return self.store.pin(name).info()

    def unpin(self, name: str) -> CapsuleSummary:
        """Let budgets demote ``name`` again."""
        return self.store.unpin(name).info()

    def move(self, name: str, tier: str) -> CapsuleSummary:
        """Move ``name`` to ``tier`` (demoting others as needed)."""
        return self.store.move(name, tier).info()

    def stats(self) -> dict[str, Any]:
        """The store's per-tier bytes, counts and budgets."""
        return self.store.stats()

    # --- internals -------------------------------------------------------------
    def _at_boundary(self, fn: Callable[[], T], *, replaces_state: bool = False,
                     timeout: float | None = None, reads_live: bool = False) -> T:
        def wrapped() -> T:
            if reads_live:
                self.before_read()
            out = fn()
            if replaces_state:
                self.writes += 1
            return out
        return self.gate.run_at_boundary(wrapped, timeout=self.timeout_s if timeout is None else timeout)
