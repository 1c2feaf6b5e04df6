"""The answers the node gave, by the client's request id: a copy of a request is answered, never run again.

Why: a DDS reply can be lost (Fast DDS drops one the server sends before it has
matched the client's reply reader, ros2/ros2#1253). A client that re-sends a lost
``rollback`` would go back twice, a ``fork`` would be refused as ALREADY_EXISTS
though it was applied, and one that does not re-send waits out its timeout (a
fresh-clone CI run's ``snapshot``: 30 s, "not re-sent: it may have been applied").
Every request that changes something carries a client-chosen ``request_id``; the
node keeps the answer of each id for ``RETAIN_S`` (at most ``CAPACITY`` ids, oldest
forgotten first) and answers a copy with it. A copy that arrives while the first
still runs waits for its answer. An id reused for a different request is refused
(INVALID_ARGUMENT), so a client bug cannot return another request's answer.

``answer_once`` wraps a service callback with all of it; the capsule services
(``state_services.py``) and the simulator's (``sim/node.py``) use it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from flashrt_ros.interface.errors import ErrorCode
from flashrt_ros.ros import conversions as conv
from flashrt_ros.runtime.errors import FlashRTError, InvalidArgument

#: How long an answer is kept (s): well past the longest re-send schedule of our clients (2, 6, 14, ... s up to
#: their timeouts of at most a few minutes).
RETAIN_S = 600.0
#: At most this many answers are kept (the oldest go first): a client that calls hundreds of times a second for
#: ten minutes still finds its recent answers.
CAPACITY = 4096
#: Answers that say nothing was applied: not kept, so a copy under the same id runs afresh.
NOTHING_APPLIED = (int(ErrorCode.NOT_ACTIVE), int(ErrorCode.TIMEOUT))


@dataclass
class _Entry:
    verb: str
    request: tuple                        # the request's other fields: a copy must be the same request
    at: float
    done: threading.Event = field(default_factory=threading.Event)
    response: Any = None                  # the answer (a response message), once done


class RequestLedger:
    """``begin`` before running a request, ``finish`` with its answer (see the module docstring)."""

    def __init__(self, retain_s: float = RETAIN_S, capacity: int = CAPACITY) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.retain_s, self.capacity = retain_s, capacity
        self.copies_answered = 0

    def _expire(self, now: float) -> None:
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if len(self._entries) <= self.capacity and now - oldest.at <= self.retain_s:
                return
            self._entries.popitem(last=False)

    def begin(self, request_id: str, verb: str, request: tuple) -> tuple[str, Any]:
        """``("run", None)``: a new id, run it and ``finish``; ``("copy", entry)``: answered or running (wait
        with ``answer``); ``("conflict", why)``: the id belongs to another request."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            entry = self._entries.get(request_id)
            if entry is None:
                self._entries[request_id] = _Entry(verb, request, now)
                return "run", None
            if (entry.verb, entry.request) != (verb, request):
                return "conflict", (f"request_id {request_id!r} was used for another request ({entry.verb}) "
                                    f"{now - entry.at:.0f} s ago: use a fresh id per request")
            return "copy", entry

    def finish(self, request_id: str, response: Any) -> None:
        """The answer of ``request_id`` (kept for copies)."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is not None:
            entry.response = response
            entry.done.set()

    def forget(self, request_id: str) -> None:
        """The request ended without an answer worth keeping (the node was not active): a copy runs afresh."""
        with self._lock:
            entry = self._entries.pop(request_id, None)
        if entry is not None:
            entry.done.set()

    def answer(self, entry: Any, timeout_s: float) -> Any:
        """A copy's answer: the first request's, waited for up to ``timeout_s`` while it runs; None if it did not
        finish in time (or was forgotten)."""
        if not entry.done.wait(timeout_s):
            return None
        with self._lock:
            self.copies_answered += 1
        return entry.response


def _fields(request: Any) -> tuple:
    """A request's fields but its id: a copy must be the same request."""
    return tuple((name, repr(getattr(request, name))) for name in request.get_fields_and_field_types()
                 if name != "request_id")


def _copy_into(answer: Any, response: Any) -> Any:
    for name in answer.get_fields_and_field_types():
        setattr(response, name, getattr(answer, name))
    return response


def answer_once(ledger: RequestLedger, verb: str, request: Any, response: Any,
                run: Callable[[Any, Any], Any], copy_wait_s: float, logger: Any) -> Any:
    """``run(request, response)`` for a new request id (or none); the first answer for a copy; INVALID_ARGUMENT
    for an id reused by another request. ``copy_wait_s``: how long a copy waits for a first one still running."""
    request_id = getattr(request, "request_id", "")
    if not request_id:
        return run(request, response)
    decision, entry = ledger.begin(request_id, verb, _fields(request))
    if decision == "conflict":
        conv.fill_error(response, InvalidArgument(entry), logger)
        return conv.sendable(response, logger)
    if decision == "copy":
        answer = ledger.answer(entry, copy_wait_s)
        if answer is None:
            conv.fill_error(response, FlashRTError(f"{verb}: the first request under id {request_id!r} has not "
                                                   "finished yet", code=ErrorCode.TIMEOUT))
            return conv.sendable(response, logger)
        logger.info(f"{verb}: answered a copy of request {request_id} (its reply was lost or late)")
        return _copy_into(answer, response)
    try:
        response = run(request, response)
    finally:
        if response.success or getattr(response, "error_code", 0) not in NOTHING_APPLIED:
            ledger.finish(request_id, response)
        else:
            ledger.forget(request_id)             # nothing was applied: a copy may run afresh
    return response
