"""Planning the next action chunk beside the control loop (``replan: async | rtc``).

Why: with a synchronous replan the step that empties the queue waits for the whole
network (SmolVLA: 34-62 ms on an H100, far more on a Jetson), so a 30-50 Hz loop
stalls at every chunk boundary. Here the next chunk is planned while the control
steps keep popping the current one, and swapped in a fixed number of steps later.

Timing model (control steps, not wall time, so it replays exactly):

* launch: at the end of step ``k``, when the queue holds ``<= threshold``
  actions, the planner copies the live state and step ``k``'s inputs into a
  private arena and runs ``policy.plan`` there (a worker thread on a CPU, a side
  stream on a GPU). The new chunk's action ``i`` belongs to step ``k + i``.
* merge: at the start of step ``k + d`` (``d``: the delay in steps, fixed or
  from the measured turnaround) the planned buffers replace the live ones and
  the queue holds the chunk's actions from action ``d`` on: the first ``d`` were
  for steps the robot already ran from the old queue (LeRobot's async inference
  drops them too). A policy that predicts more actions than it queues
  (``ActionQueue.ahead``: ACT's chunk beyond ``n_action_steps``) still queues
  ``refill`` of them, so a late merge does not make plans more frequent. With
  ``blend_steps`` the next actions are blended from the old chunk into the new.
  If the plan is not done by then, that step waits for it (counted: ``late``).
* starvation: if the old queue runs dry before the merge, the step holds the
  last command (counted) and the state does not move, never an invented action.

What a capsule holds: the live arena carries the pending plan (``async.*``:
whether one is in flight, its launch and merge steps, and a copy of every buffer
it writes). A snapshot while a plan runs first waits for it and copies its result
in, so restore-then-continue merges the same chunk at the same step: the same
actions as the uninterrupted run. A plan still running when the live state is
replaced (restore, rollback, reset, session switch) or dropped (a halt) is never
merged; a state rolled back to before its result arrived plans again.
"""
from __future__ import annotations

import atexit
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from flashrt_ros.engine.graphs import StepRunner
from flashrt_ros.engine.input_staging import PinnedInputs
from flashrt_ros.engine.stats import percentile
from flashrt_ros.models.policy_interface import ActionQueue, Guidance, PolicyModule
from flashrt_ros.models.rtc import SCHEDULES, prefix_weights
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument

MODES = ("sync", "async", "rtc")
ACTIVE, READY, LAUNCH, MERGE = "async.active", "async.ready", "async.launch", "async.merge"
COPY = "async.copy."        # + the name of each buffer a plan writes
AHEAD = "async.ahead"       # the pending plan's actions after its queued ones


@dataclass(frozen=True)
class ReplanConfig:
    """How chunks are planned: ``sync`` (in the step that empties the queue), ``async`` (beside the
    loop, replacing or blending), ``rtc`` (async with Real-Time Chunking guidance), ``auto`` (resolved
    to sync or async when the engine is built: ``replan_choice``)."""

    mode: str = "sync"
    delay_steps: int = 0          # > 0: the merge delay in control steps; 0: from the measured turnaround
    blend_steps: int = 0          # 0: replace; N: blend the old chunk into the new over N steps
    period_s: float = 0.02        # the control period (the delay from the turnaround needs it)
    rtc_horizon: int = 10         # LeRobot RTCConfig.execution_horizon
    rtc_schedule: str = "linear"  # RTCConfig.prefix_attention_schedule: zeros | ones | linear | exp
    rtc_max_weight: float = 10.0  # RTCConfig.max_guidance_weight
    late: str = "hold"            # a plan not done when due: hold the last command (real time) | wait (exact)
    chosen: str = ""              # mode auto: what it resolved to and why (``replan_choice``)
    may_switch: bool = False      # auto resolved to sync where async could run: the engine keeps room for a plan in
                                  # flight and may switch in the run (``PolicyEngine.switch_replan``)

    def checked(self) -> "ReplanConfig":
        if self.mode not in MODES:
            raise InvalidArgument(f"replan must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.delay_steps < 0 or self.blend_steps < 0:
            raise InvalidArgument("replan delay_steps and blend_steps must be >= 0")
        if self.period_s <= 0:
            raise InvalidArgument("the control period must be > 0")
        if self.rtc_schedule not in SCHEDULES:
            raise InvalidArgument(f"rtc schedule must be one of {', '.join(SCHEDULES)}, got {self.rtc_schedule!r}")
        if self.late not in ("hold", "wait"):
            raise InvalidArgument(f"late must be hold or wait, got {self.late!r}")
        if self.rtc_horizon < 1 or self.rtc_max_weight <= 0:
            raise InvalidArgument("rtc horizon must be >= 1 and rtc max guidance weight > 0")
        return self


def pending_specs(specs: list[BufferSpec], queue: ActionQueue) -> list[BufferSpec]:
    """The live arena's record of a plan in flight: flags, steps, and a copy of each planned buffer."""
    scalar = lambda name, doc: BufferSpec(name, (), torch.int64, group="async", doc=doc)  # noqa: E731
    by_name = {s.name: s for s in specs}
    copies = []
    for name in planned_buffers(queue):
        s = by_name[name]
        copies.append(BufferSpec(COPY + name, s.shape, s.dtype, group="async", live_axis=s.live_axis,
                                 length_from=COPY + s.length_from if s.length_from else None,
                                 doc=f"the pending plan's {name}"))
    if queue.ahead:
        chunk = by_name[queue.chunk]
        copies.append(BufferSpec(AHEAD, (queue.ahead, *chunk.shape[1:]), chunk.dtype, group="async",
                                 doc="the pending plan's actions after its queued ones"))
    return [scalar(ACTIVE, "1 while a planned chunk waits to be merged"),
            scalar(READY, "1 once its result is in the async.copy buffers"),
            scalar(LAUNCH, "position after the step that launched it"),
            scalar(MERGE, "position at which the next step merges it"), *copies]


def planned_buffers(queue: ActionQueue) -> list[str]:
    """The buffers a plan writes, the queue first (``left`` is set by the merge)."""
    return [queue.chunk, *[n for n in queue.planned if n != queue.chunk]]


class ChunkPlanner:
    """``policy.plan`` on a private copy of the state, on a worker (thread or side stream)."""

    def __init__(self, policy: PolicyModule, live: StateArena, inputs: Mapping[str, torch.Tensor],
                 queue: ActionQueue, cfg: ReplanConfig, *, cuda_graph: bool) -> None:
        """``inputs``: the engine's static input buffers (their shapes and dtypes)."""
        self.policy, self.live, self.queue, self.cfg = policy, live, queue, cfg
        self.device = live.device
        self.private = StateArena(live.specs, self.device)
        self.inputs = {name: torch.zeros_like(t) for name, t in inputs.items()}
        self.guide_left = torch.zeros((), dtype=torch.int64, device=self.device)
        self.guide_weights = torch.zeros(max(queue.chunk_size, queue.refill), dtype=torch.float32,
                                         device=self.device)
        self.ahead = (torch.zeros_like(self.private[AHEAD]) if queue.ahead else None)
        pool = torch.cuda.graph_pool_handle() if cuda_graph else None     # never shared: runs beside the steps
        self.runner = StepRunner(self._body, self.private, enabled=cuda_graph, pool=pool)
        self.planned = planned_buffers(queue)
        self.turnaround_s: deque[float] = deque(maxlen=64)
        self.spans: deque[tuple[float, float]] = deque(maxlen=4096)   # (start, end) of each plan on a CPU worker
        self.busy = False                # a plan was launched and its end not yet seen
        self.owner: Any = None           # what launched it (the engine's state version + launch position)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._started = self._finished = 0.0
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging = PinnedInputs(self.inputs) if self._stream is not None else None
        self._events: tuple[Any, Any] | None = None
        self._wake = threading.Condition()
        self._job = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if self._stream is None:
            self._thread = threading.Thread(target=self._serve, daemon=True, name="flashrt-planner")
            self._thread.start()
            atexit.register(self.close)      # an engine never closed: the worker still ends before torch does

    # --- the plan -----------------------------------------------------------------------
    def _body(self) -> None:
        with torch.no_grad():
            guide = None
            if self.cfg.mode == "rtc":
                guide = Guidance(self.private[self.queue.chunk], self.guide_left, self.guide_weights,
                                 self.cfg.rtc_max_weight)
            self.policy.plan(self.inputs, self.private, guide, self.ahead)

    def capture(self) -> int:
        """Capture the plan as a CUDA graph now (on the private arena; changes nothing)."""
        return self.runner.capture()

    def delay_steps(self) -> int:
        """The merge delay: the configured one, else the p95 turnaround in periods, plus one."""
        if self.cfg.delay_steps:
            return self.cfg.delay_steps
        if not self.turnaround_s:
            return 2
        return max(1, math.ceil(percentile(list(self.turnaround_s), 95) / self.cfg.period_s)) + 1

    def launch(self, owner: Any, inputs: Mapping[str, torch.Tensor], leftover: int, delay: int) -> None:
        """Start planning from the live state as it is now (after a step) and that step's ``inputs``;
        ``leftover``: the old chunk's actions from the launching step's on (RTC's target: the chunk's
        action 0 is for that step; LeRobot keeps the horizon within the leftover)."""
        staged = None
        if self._staging is None:                  # a CPU worker: plain copies (the arena and one observation)
            self.private.block.copy_(self.live.block)
            for name, value in inputs.items():
                self.inputs[name].copy_(value, non_blocking=True)
        else:                                      # CUDA: a memcpy into pinned memory; the device copies below
            staged = self._staging.stage(inputs)
        leftover = min(leftover, self.queue.refill)
        self.guide_left.fill_(leftover)
        if self.cfg.mode == "rtc":
            self.guide_weights.copy_(prefix_weights(delay, min(self.cfg.rtc_horizon, leftover),
                                                    self.guide_weights.shape[0], self.cfg.rtc_schedule))
        self.busy, self.owner, self._error = True, owner, None
        self._done.clear()
        self._started = time.perf_counter()
        if self._stream is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                start.record()
                # the state and the observation of this step, copied on the side stream: the control step
                # queues them and goes on; the next step's writes to the live arena wait for the read
                self.private.block.copy_(self.live.block, non_blocking=True)
                self._staging.copy_to(staged, inputs, self.inputs, self._stream)
                read = torch.cuda.Event()
                read.record()
                self.runner()
                end.record()
            current.wait_event(read)
            self._events = (start, end)
        else:
            with self._wake:
                self._job = True
                self._wake.notify()

    def done(self) -> bool:
        if self._stream is not None:
            return self._events is None or self._events[1].query()
        return self._done.is_set()

    def wait(self) -> None:
        """Block until the plan in flight has ended (raises what it raised)."""
        if self._stream is not None:
            if self._events is not None:
                self._events[1].synchronize()
        else:
            self._done.wait()
        self._finish()

    def collect(self) -> None:
        """Copy the finished plan's buffers into the live ``async.copy`` buffers (control thread)."""
        self.wait()
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
        for name in self.planned:
            self.live[COPY + name].copy_(self.private[name])
        if self.ahead is not None:
            self.live[AHEAD].copy_(self.ahead)
        self.live[READY].fill_(1)

    def _finish(self) -> None:
        if not self.busy:
            return
        self.busy = False
        if self._events is not None:
            self.turnaround_s.append(self._events[0].elapsed_time(self._events[1]) / 1e3)
            self._events = None
        elif self._error is None:
            self.turnaround_s.append(self._finished - self._started)
            self.spans.append((self._started, self._finished))
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._job and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._job = False
            try:
                self.runner()
            except BaseException as exc:  # noqa: BLE001 - handed to the control thread
                self._error = exc
            self._finished = time.perf_counter()
            self._done.set()

    def close(self) -> None:
        """End the worker thread (after the plan it runs, if any). Idempotent."""
        if self._thread is not None:
            with self._wake:
                self._closed = True
                self._wake.notify()
            self._thread.join(5)
            atexit.unregister(self.close)
            self._thread = None


def blend(new: torch.Tensor, old: torch.Tensor, new_start: int, old_start: int, old_left: int, steps: int) -> int:
    """Blend the old chunk's next actions into the new queue from ``new_start`` on, in place:
    ``(1 - w) old + w new`` with ``w = (j + 1) / (steps + 1)`` for ``j < steps``, where the old chunk
    still had an action. Returns how many were blended."""
    m = min(steps, new.shape[0] - new_start, old_left)
    if m > 0:
        w = (torch.arange(1, m + 1, device=new.device, dtype=new.dtype) / (steps + 1))[:, None]
        new[new_start:new_start + m] = (1 - w) * old[old_start:old_start + m] + w * new[new_start:new_start + m]
    return max(m, 0)
