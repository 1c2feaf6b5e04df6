"""BoundaryGate: out-of-band work runs only at engine boundaries, promptly and in order."""
from __future__ import annotations

import threading
import time

import pytest

from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.errors import Busy, ErrorCode, FlashRTError


class SteppingEngine:
    """An engine thread whose steps are released one by one by the test."""

    def __init__(self, gate: BoundaryGate, steps: int) -> None:
        self.gate = gate
        self.release = [threading.Event() for _ in range(steps)]
        self.entered = [threading.Event() for _ in range(steps)]
        self.in_step = False
        self.started = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.gate.generation():
            for i, ev in enumerate(self.release):
                with self.gate.step():
                    self.in_step = True
                    self.started += 1
                    self.entered[i].set()
                    ev.wait(5)
                    self.in_step = False

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        for ev in self.release:
            ev.set()
        self.thread.join(5)


def submit(gate: BoundaryGate, fn, timeout=None):
    """Call run_at_boundary from a helper thread; returns (thread, outcome dict)."""
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = gate.run_at_boundary(fn, timeout=timeout)
        except BaseException as exc:     # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t, outcome


def wait_pending(gate: BoundaryGate, n: int) -> None:
    deadline = time.monotonic() + 30          # generous: a loaded 2-core machine
    while time.monotonic() < deadline:
        if gate.pending >= n:
            return
        threading.Event().wait(0.002)
    raise AssertionError(f"{n} requests never queued")


def test_idle_engine_runs_fn_at_once_in_the_callers_thread():
    gate = BoundaryGate()
    assert gate.run_at_boundary(threading.get_ident) == threading.get_ident()


def test_request_during_a_step_runs_in_the_engine_thread_at_the_next_boundary():
    gate = BoundaryGate()
    with SteppingEngine(gate, steps=3) as engine:
        engine.entered[0].wait(5)
        seen = {}
        t, outcome = submit(gate, lambda: seen.update(thread=threading.get_ident(), in_step=engine.in_step,
                                                      boundaries=gate.boundaries, started=engine.started) or 42)
        wait_pending(gate, 1)
        assert "result" not in outcome
        engine.release[0].set()
        t.join(5)
        assert outcome["result"] == 42
        assert seen == {"thread": engine.thread.ident, "in_step": False, "boundaries": 1, "started": 1}


def test_all_queued_requests_are_served_in_order_at_one_boundary():
    gate = BoundaryGate()
    order: list[int] = []
    with SteppingEngine(gate, steps=3) as engine:
        engine.entered[0].wait(5)
        calls = []
        for i in range(5):
            calls.append(submit(gate, lambda i=i: order.append((i, gate.boundaries, engine.started))))
            wait_pending(gate, i + 1)
        engine.release[0].set()
        for t, _ in calls:
            t.join(5)
        assert order == [(i, 1, 1) for i in range(5)]      # all at boundary 1, before step 2 began


def test_fn_exception_is_reraised_in_the_caller_and_the_engine_continues():
    gate = BoundaryGate()
    with SteppingEngine(gate, steps=2) as engine:
        engine.entered[0].wait(5)
        t, outcome = submit(gate, lambda: 1 / 0)
        wait_pending(gate, 1)
        engine.release[0].set()
        t.join(5)
        assert isinstance(outcome["error"], ZeroDivisionError)
        assert engine.entered[1].wait(5)


def test_timeout_withdraws_the_request_so_fn_never_runs():
    gate = BoundaryGate()
    ran = []
    with SteppingEngine(gate, steps=2) as engine:
        engine.entered[0].wait(5)
        with pytest.raises(FlashRTError) as info:
            gate.run_at_boundary(lambda: ran.append(1), timeout=0.05)
        assert info.value.code == ErrorCode.TIMEOUT
        assert gate.pending == 0
        engine.release[0].set()
        engine.entered[1].wait(5)
    assert ran == []


def test_request_between_steps_of_a_generation_waits_for_the_next_boundary():
    gate = BoundaryGate()
    steps_done = []
    ready, go = threading.Event(), threading.Event()

    def engine():
        with gate.generation():
            with gate.step():
                steps_done.append(1)
            ready.set()
            go.wait(5)                        # between steps, still generating
            with gate.step():
                steps_done.append(2)

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    ready.wait(5)
    t, outcome = submit(gate, lambda: list(steps_done))
    wait_pending(gate, 1)
    go.set()
    t.join(5)
    th.join(5)
    assert outcome["result"] == [1, 2]


def test_generation_end_serves_requests_left_in_the_queue():
    gate = BoundaryGate()
    ready, go = threading.Event(), threading.Event()

    def engine():
        with gate.generation():
            ready.set()
            go.wait(5)                        # generating but never steps again

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    ready.wait(5)
    t, outcome = submit(gate, lambda: "served")
    wait_pending(gate, 1)
    go.set()
    t.join(5)
    th.join(5)
    assert outcome["result"] == "served"


def test_nested_run_at_boundary_does_not_deadlock():
    gate = BoundaryGate()
    assert gate.run_at_boundary(lambda: gate.run_at_boundary(lambda: "inner")) == "inner"


def test_a_verb_from_inside_a_step_is_refused_at_once_and_never_runs():
    gate = BoundaryGate()
    ran = []
    with gate.generation(), gate.step():
        with pytest.raises(Busy, match="inside an engine step"):
            gate.run_at_boundary(lambda: ran.append(1), timeout=None)
    assert ran == [] and gate.pending == 0


def test_a_verb_from_the_engine_thread_between_steps_runs_at_once():
    gate = BoundaryGate()
    with gate.generation():
        with gate.step():
            pass
        # e.g. from should_stop: a committed boundary, nothing in flight; no timeout needed
        assert gate.run_at_boundary(lambda: "now", timeout=None) == "now"
        with gate.step():               # and the engine steps on afterwards
            pass
    assert gate.pending == 0


def test_other_threads_still_queue_for_the_next_boundary_during_a_generation():
    gate = BoundaryGate()
    with gate.generation():
        t, outcome = submit(gate, lambda: threading.get_ident())
        wait_pending(gate, 1)
        with gate.step():
            pass
        t.join(5)
    assert outcome["result"] == threading.get_ident()      # ran in the engine thread, at the boundary


def test_engine_step_waits_while_an_idle_caller_holds_the_state():
    gate = BoundaryGate()
    inside, leave, stepped = threading.Event(), threading.Event(), threading.Event()

    def hold():
        inside.set()
        leave.wait(5)
        return "held"

    t, outcome = submit(gate, hold)
    inside.wait(5)

    def engine():
        with gate.step():
            stepped.set()

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    assert not stepped.wait(0.05)
    leave.set()
    assert stepped.wait(5)
    t.join(5)
    th.join(5)
    assert outcome["result"] == "held"
