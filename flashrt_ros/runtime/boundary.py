"""The boundary gate: the one rule for touching engine state from another thread.

Contract
--------
* The engine thread wraps every step in ``with gate.step():`` and a whole
  multi-step generation in ``with gate.generation():``. Between two steps the
  engine is at a *boundary*: the state is committed and nothing is in flight.
* Any other thread that wants to read or write engine state (snapshot,
  restore, rollback, session switch, ...) calls
  ``gate.run_at_boundary(fn, timeout=...)``:
  - while the engine is generating or inside a step, ``fn`` is queued and the
    engine thread runs it at its next boundary (step exit, or an explicit
    ``gate.drain()``), then continues;
  - while the engine is idle, ``fn`` runs at once in the caller's thread, and
    an engine step that starts meanwhile waits for it.
  Either way ``fn`` runs with the engine quiescent and no other ``fn`` running,
  its result is returned and its exception re-raised in the caller.
* Fairness: every request queued before a boundary is served at that boundary,
  in arrival order, before the engine takes another step; the queue is drained
  until empty, so a request is never passed over.
* Timeout: ``timeout`` bounds the wait for a boundary. A request still queued
  when it expires is withdrawn (``fn`` never runs) and ``FlashRTError`` with
  ``code=TIMEOUT`` is raised. Once ``fn`` has started it is allowed to finish,
  and its outcome is returned: a caller never sees TIMEOUT for work that ran.
* The engine's own thread (its callbacks): called from *inside a step* (an
  ``on_token`` callback, which runs before the step commits) ``run_at_boundary``
  raises ``Busy`` at once and ``fn`` never runs: running it there would write
  state the step then commits on top of, and waiting would wait on itself.
  Called from the engine thread *between* steps (a ``should_stop`` poll during
  a generation, or from inside a running ``fn``), the state is committed and
  nothing is in flight, so ``fn`` runs directly, at once.
* ``fn`` must be short (it delays the engine) and must not wait on the engine.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from flashrt_ros.runtime.errors import Busy, ErrorCode, FlashRTError

T = TypeVar("T")


class _Request:
    __slots__ = ("fn", "state", "result", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.state = "queued"          # queued -> running -> done | withdrawn
        self.result: Any = None
        self.error: BaseException | None = None


class BoundaryGate:
    """Serialises engine steps and out-of-band state operations; see the module contract."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[_Request] = deque()
        self._owner: str | None = None          # None | "step" | "drain" | "caller"
        self._owner_thread: int | None = None
        self._generating = 0
        self._generation_threads: dict[int, int] = {}   # engine threads inside generation(): depth
        self.boundaries = 0                     # committed steps seen (for tests and metrics)

    # --- engine side --------------------------------------------------------
    @contextmanager
    def generation(self) -> Iterator[None]:
        """Marks a multi-step generation: requests queue up for the next boundary meanwhile."""
        me = threading.get_ident()
        with self._cv:
            self._generating += 1
            self._generation_threads[me] = self._generation_threads.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cv:
                self._generating -= 1
                depth = self._generation_threads.pop(me) - 1
                if depth:
                    self._generation_threads[me] = depth
            self.drain()

    @contextmanager
    def step(self) -> Iterator[None]:
        """One engine step; queued requests run right after it, at the boundary."""
        me = threading.get_ident()
        with self._cv:
            if self._owner_thread == me:            # nested step: already own the state
                nested = True
            else:
                nested = False
                while self._owner is not None:
                    self._cv.wait()
                self._owner, self._owner_thread = "step", me
        if nested:
            yield
            return
        try:
            yield
        finally:
            with self._cv:
                self.boundaries += 1
                self._owner = self._owner_thread = None
                self._cv.notify_all()
            self.drain()

    def drain(self) -> int:
        """Run every queued request now, in this (engine) thread; returns how many ran."""
        me = threading.get_ident()
        with self._cv:
            if not self._queue:
                return 0
            nested = self._owner_thread == me
            if not nested:
                while self._owner is not None:
                    self._cv.wait()
                self._owner, self._owner_thread = "drain", me
        served = 0
        try:
            while True:
                with self._cv:
                    if not self._queue:
                        break
                    req = self._queue.popleft()
                    req.state = "running"
                self._execute(req)
                served += 1
                with self._cv:
                    req.state = "done"
                    self._cv.notify_all()
        finally:
            if not nested:
                with self._cv:
                    self._owner = self._owner_thread = None
                    self._cv.notify_all()
        return served

    # --- caller side --------------------------------------------------------
    def run_at_boundary(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` with the engine quiescent; see the module contract."""
        me = threading.get_ident()
        with self._cv:
            if self._owner_thread == me:
                if self._owner == "step":
                    raise Busy("a state verb was called from inside an engine step (an on_token "
                               "callback?); it would run mid-step: call it from should_stop or "
                               "another thread, where it runs at the next committed boundary")
                direct, req = True, None
            elif self._owner is None and me in self._generation_threads:
                # the engine thread between two steps (should_stop): committed and quiescent
                self._owner, self._owner_thread = "caller", me
                direct, req = False, None
            else:
                direct, req = False, None
                deadline = None if timeout is None else _now() + timeout
                while True:
                    if self._owner in ("step", "drain") or self._generating:
                        req = _Request(fn)
                        self._queue.append(req)
                        break
                    if self._owner is None:
                        self._owner, self._owner_thread = "caller", me
                        break
                    if not self._cv.wait(_remaining(deadline)):
                        raise _timeout(timeout)
                if req is not None:
                    while req.state in ("queued", "running"):
                        remaining = _remaining(deadline)
                        if req.state == "queued" and remaining is not None and remaining <= 0:
                            self._queue.remove(req)
                            req.state = "withdrawn"
                            raise _timeout(timeout)
                        self._cv.wait(remaining if req.state == "queued" else None)
        if direct:
            return fn()
        if req is not None:
            if req.error is not None:
                raise req.error
            return req.result
        try:
            return fn()
        finally:
            with self._cv:
                self._owner = self._owner_thread = None
                self._cv.notify_all()

    # --- helpers ------------------------------------------------------------
    @staticmethod
    def _execute(req: _Request) -> None:
        try:
            req.result = req.fn()
        except BaseException as exc:     # delivered to the caller, never kills the engine
            req.error = exc

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._queue)


def _now() -> float:
    return time.monotonic()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - _now())


def _timeout(timeout: float | None) -> FlashRTError:
    return FlashRTError(f"no engine boundary within {timeout} s", code=ErrorCode.TIMEOUT)
