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
  (a planner between two torch ops, the executor) hands it over within 1 ms,
  and the process's other threads at nice -10 where permitted (given back when
  the loop stops): a GIL holder
  preempted by the machine's other work would otherwise keep the control
  thread waiting until the scheduler runs it again (measured: control steps of
  66-174 ms on a loaded 2-core machine with the control thread alone raised).

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
#: the nice value given to the process's other threads (where permitted): whichever of them holds the GIL
#: when the control thread wants it must get a core at once, not wait behind the machine's other work
OTHERS_NICE = -10
#: a tick's slack (until the next deadline) must be this many times the longest full collection so far
#: for the thread to run one; otherwise only the young generations are collected
FULL_GC_SLACK_FACTOR = 3.0
FULL_GC_EVERY_S = 10.0


class _ProcessSettings:
    """The process-wide settings control threads share (GC off, a short switch interval): taken by the
    first loop that starts, given back by the last that stops, so loops of several nodes in one process
    never undo each other's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: tuple[bool, float] = (True, 0.005)

    def take(self, manage_gc: bool) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = (gc.isenabled(), sys.getswitchinterval())
                sys.setswitchinterval(min(self._saved[1], SWITCH_INTERVAL_S))
            self._holders += 1
            if manage_gc:
                gc.collect()
                gc.freeze()           # everything alive now (model, ROS, imports) is never scanned again
                gc.disable()

    def give_back(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                enabled, interval = self._saved
                sys.setswitchinterval(interval)
                gc.unfreeze()         # what the loop froze is collectable again (a node that deactivates)
                if enabled:
                    gc.enable()


_SETTINGS = _ProcessSettings()


def raise_priority(priority: int) -> str:
    """Give the calling thread ``SCHED_FIFO`` ``priority``, else the lowest nice the OS allows; says which.

    With ``SCHED_RESET_ON_FORK``: threads this one starts (torch's intra-op workers, when a sync replan runs
    on it: their spin-waits at real-time priority starved every other thread of a 2-core machine) start at
    the default policy and nice 0 instead of inheriting the control thread's."""
    if priority <= 0:
        return "default (control_thread_priority 0)"
    tid = threading.get_native_id()
    reset = getattr(os, "SCHED_RESET_ON_FORK", 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | reset,
                              os.sched_param(min(priority, os.sched_get_priority_max(os.SCHED_FIFO))))
        return f"SCHED_FIFO {priority}"
    except (OSError, AttributeError) as exc:
        fifo = f"SCHED_FIFO refused: {exc.strerror if isinstance(exc, OSError) else exc}"
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER | reset, os.sched_param(0))    # children start at nice 0
    except (OSError, AttributeError):
        pass
    for nice in (-20, -10, -5, -1):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)      # Linux: per thread
            return f"nice {nice} ({fifo})"
        except (OSError, AttributeError):
            continue
    return f"default ({fifo}; negative nice refused)"


def raise_other_threads(nice: int = OTHERS_NICE, changed: dict[int, int] | None = None) -> str:
    """Give every other thread of this process (the executor's, the planner's, torch's and the middleware's;
    threads they start later inherit it) ``nice`` where permitted and lower than now; says what was done.

    Why: the control thread needs the GIL for each Python step between its torch calls, and a GIL holder
    preempted by another process's work keeps it until the scheduler runs it again (on a 2-core machine
    beside busy loops: tens of ms; a priority inversion no switch interval can end). Linux keeps nice per
    thread, and a new thread starts with its creator's. ``changed`` collects ``{thread id: its nice
    before}`` of the threads changed (``restore_threads`` gives them back)."""
    me = threading.get_native_id()
    count = refused = 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return "other threads unchanged (no /proc)"
    for tid in tids:
        if tid == me:
            continue
        try:
            before = os.getpriority(os.PRIO_PROCESS, tid)
            if before > nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                count += 1
                if changed is not None:
                    changed[tid] = before
        except OSError:
            refused += 1
    if refused and not count:
        return "other threads unchanged (nice refused)"
    return f"other threads nice {nice}"


def restore_threads(changed: dict[int, int]) -> None:
    """Give the threads ``raise_other_threads`` changed their nice back (those still alive)."""
    for tid, before in changed.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, before)
        except OSError:
            pass                          # ended since, or not permitted: nothing to give back
    changed.clear()


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
        self._holding = False
        self._reniced: dict[int, int] = {}     # the other threads raised for this loop: {id: nice before}

    def start(self) -> None:
        _SETTINGS.take(self.manage_gc)
        self._holding = True
        self._thread.start()
        self._started.wait(5.0)

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop after the tick in progress (if any); True when the thread ended. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        alive = self._thread.is_alive()
        if not alive and self._holding:
            self._holding = False
            _SETTINGS.give_back()
            restore_threads(self._reniced)
        return not alive

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        self.priority_report = raise_priority(self.priority)
        if self.priority > 0:
            self.priority_report += f"; {raise_other_threads(changed=self._reniced)}"
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
            except Exception as exc:  # noqa: BLE001 - the loop outlives a bad tick (on_error logs it)
                self._on_error(exc)
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: reported, never swallowed
                self._on_error(exc)
                raise
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
