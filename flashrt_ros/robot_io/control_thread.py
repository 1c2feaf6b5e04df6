"""The control loop on a thread of its own: a deadline clock, the highest priority the OS allows, no GC in a tick.

Why not a ROS timer: an rclpy timer callback waits for the executor (its wait
set, its Python bookkeeping, a free worker thread, the callback group shared
with other timers), and runs at the priority of every other callback; on a
loaded 2-core machine that cost the node single command gaps of 250-780 ms
(docs/robot_io.md, "What stalled the commands"). Here:

* **a deadline clock**: tick ``k`` is due at ``start + k * period`` and the thread
  sleeps until then (``CLOCK_MONOTONIC``); a tick that overran its next deadline
  skips the missed ones (counted in ``overruns``) instead of bursting;
* **priority**: ``SCHED_FIFO`` at ``priority`` where the OS permits it
  (``CAP_SYS_NICE``, or ``RLIMIT_RTPRIO``), else the lowest nice value it permits,
  else the default; ``priority_report`` says which, and why;
* **no Python GC inside a tick**: the objects alive at start are frozen
  (``gc.freeze``: a collection never scans the model or ROS again), automatic
  collection is off while the loop runs, and the thread collects the young
  generations itself right after a tick's command went out, in the period's
  slack (the oldest one only when the slack is large); ``gc_max_ms`` reports the
  longest;
* a short GIL switch interval (1 ms): a Python thread that holds the GIL
  (a planner between two torch ops, the executor) hands it over within 1 ms.

No ROS here: ``ros/policy_io.py`` gives the tick (take inputs, step, publish).
"""
from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from typing import Callable

#: the GIL switch interval while a control thread runs (Python's default is 5 ms)
SWITCH_INTERVAL_S = 0.001
#: a tick's slack (until the next deadline) must be this many times the longest full collection so far
#: for the thread to run one; otherwise only the young generations are collected
FULL_GC_SLACK_FACTOR = 3.0
FULL_GC_EVERY_S = 10.0


def raise_priority(priority: int) -> str:
    """Give the calling thread ``SCHED_FIFO`` ``priority``, else the lowest nice the OS allows; says which."""
    if priority <= 0:
        return "default (control_thread_priority 0)"
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(min(priority, os.sched_get_priority_max(os.SCHED_FIFO))))
        return f"SCHED_FIFO {priority}"
    except (OSError, AttributeError) as exc:
        fifo = f"SCHED_FIFO refused: {exc.strerror if isinstance(exc, OSError) else exc}"
    for nice in (-20, -10, -5, -1):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)      # Linux: per thread
            return f"nice {nice} ({fifo})"
        except (OSError, AttributeError):
            continue
    return f"default ({fifo}; negative nice refused)"


class ControlThread:
    """Calls ``tick(due)`` every ``period_s`` on a thread of its own until ``stop``."""

    def __init__(self, period_s: float, tick: Callable[[float], None], *, priority: int = 50,
                 name: str = "flashrt-control", manage_gc: bool = True,
                 on_error: Callable[[BaseException], None] = lambda exc: None) -> None:
        if period_s <= 0:
            raise ValueError("the control period must be > 0")
        self.period_s, self.priority, self.manage_gc = period_s, priority, manage_gc
        self._tick, self._on_error = tick, on_error
        self.priority_report = "not started"
        self.overruns = 0                 # deadlines skipped because a tick ran past them
        self.ticks = 0
        self.gc_max_ms = 0.0              # the longest collection this thread ran between ticks
        self._full_gc_s = 0.0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._switch_interval = sys.getswitchinterval()
        self._gc_was_enabled = gc.isenabled()

    def start(self) -> None:
        if self.manage_gc:
            gc.collect()
            gc.freeze()                   # everything alive now (model, ROS, imports) is never scanned again
            gc.disable()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        self._thread.start()
        self._started.wait(5.0)

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop after the tick in progress (if any); True when the thread ended. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        alive = self._thread.is_alive()
        if not alive:
            sys.setswitchinterval(self._switch_interval)
            if self.manage_gc and self._gc_was_enabled:
                gc.enable()
        return not alive

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        self.priority_report = raise_priority(self.priority)
        self._started.set()
        period = self.period_s
        due = time.monotonic() + period
        last_full = time.monotonic()
        while not self._stop.is_set():
            remaining = due - time.monotonic()
            if remaining > 0 and self._stop.wait(remaining):
                break
            try:
                self._tick(due)
            except BaseException as exc:  # noqa: BLE001 - the loop must outlive a bad tick
                self._on_error(exc)
            self.ticks += 1
            due += period
            now = time.monotonic()
            if now > due:                 # ran past the next deadline: skip what was missed, never burst
                missed = math.ceil((now - due) / period)
                self.overruns += missed
                due += missed * period
            if self.manage_gc:
                last_full = self._collect(due - now, now, last_full)

    def _collect(self, slack_s: float, now: float, last_full: float) -> float:
        """Collect between ticks: the young generations always, all of them when the slack allows."""
        full = now - last_full >= FULL_GC_EVERY_S and slack_s > FULL_GC_SLACK_FACTOR * self._full_gc_s
        t0 = time.perf_counter()
        gc.collect(2 if full else (1 if self.ticks % 10 == 0 else 0))
        spent = time.perf_counter() - t0
        self.gc_max_ms = max(self.gc_max_ms, 1e3 * spent)
        if full:
            self._full_gc_s = max(spent, 0.5 * self._full_gc_s)
            return now
        return last_full
