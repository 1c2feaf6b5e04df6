"""What makes the policy's topics tick: the control loop's own thread, or (lock-step) an executor timer.

Why apart from ``policy_io``: the topics decide what a tick does (take, step, publish);
this decides when it runs and at what priority, and records the optional per-tick
timeline (``FLASHRT_CONTROL_TIMELINE``, ``robot_io.control_timeline``) that
``benchmarks.stall_analysis`` reads. ``control_trigger: timer``: a
``robot_io.ControlThread`` (deadline clock, SCHED_FIFO where permitted, no GC inside
a tick) calls the tick, so nothing the executor runs can delay a command;
``inputs``: the inputs step, and an executor timer only watches freshness.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from flashrt_ros.robot_io.control_thread import ControlThread
from flashrt_ros.robot_io.control_timeline import ENV as TIMELINE_ENV, from_environment as timeline_from_environment


class ControlClock:
    """Calls ``tick`` every ``period_s`` on the control thread (timer trigger), or ``watch`` on an executor
    timer (inputs trigger); ``timeline`` is set when ``FLASHRT_CONTROL_TIMELINE`` names a file."""

    def __init__(self, node: Any, period_s: float, io: Any, group: Any, tick: Callable[[], None],
                 watch: Callable[[], None]) -> None:
        self._node, self._tick = node, tick
        self.timeline = timeline_from_environment()
        if self.timeline is not None:
            self.timeline.install()
        self._control: ControlThread | None = None
        self._timer: Any = None
        if io.control_trigger == "timer":
            self._control = ControlThread(period_s, self._control_tick, priority=io.control_thread_priority,
                                          on_error=self._on_tick_error)
            self._control.start()
            node.get_logger().info(f"control loop: its own thread at {1.0 / period_s:g} Hz, "
                                   f"priority {self._control.priority_report}")
        else:
            self._timer = node.create_timer(period_s, watch, callback_group=group)

    def mark(self, phase: int) -> None:
        """A phase of the tick in progress (``robot_io.control_timeline.PHASES``), when recording."""
        if self.timeline is not None:
            self.timeline.mark(phase)

    def _control_tick(self, due: float) -> None:
        tl = self.timeline
        if tl is not None:
            tl.mark(0, due)
            tl.mark(1)
        self._tick()
        if tl is not None:
            tl.end_tick()

    def _on_tick_error(self, exc: BaseException) -> None:
        self._node.get_logger().error(f"control tick failed: {type(exc).__name__}: {exc}",
                                      throttle_duration_sec=5.0)

    def status(self) -> dict[str, Any]:
        """The control thread's priority, skipped deadlines and longest GC between ticks (timer trigger)."""
        if self._control is None:
            return {}
        return {"control_priority": self._control.priority_report, "control_overruns": self._control.overruns,
                "control_gc_max_ms": round(self._control.gc_max_ms, 2)}

    def stop(self, engine: Any) -> None:
        """Stop ticking (after the tick in progress); write the timeline, with ``engine``'s plans, if recording."""
        if self._control is not None and not self._control.stop():
            self._node.get_logger().error("the control thread did not stop within 5 s")
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
        if self.timeline is not None:
            self.timeline.uninstall()
            planner = getattr(getattr(engine, "schedule", None), "planner", None)
            for start, end in getattr(planner, "spans", ()):
                self.timeline.plan(start, end)
            self.timeline.dump(os.environ[TIMELINE_ENV])
