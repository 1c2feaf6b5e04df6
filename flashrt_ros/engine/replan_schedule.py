"""Which body a control step runs: replan or pop, and (beside the loop) launch, merge or hold.

Why on the host, apart from the bodies (``policy_bodies``): a step that had to
read the queue fill from the device would start with a device-to-host sync. The
schedule mirrors the scalars it branches on (``HostMirror``): each step knows
how it changes them, and anything that writes the arena from outside (restore,
rollback, reset, session switch, ``write_state``) makes the next step read them
once more.

``SyncSchedule`` (``replan: sync``): a chunking policy replans in the step that
empties its queue, else pops. ``AsyncSchedule`` (``replan: async | rtc``): the
next chunk is planned beside the loop (``chunk_planner``) and merged a fixed
number of steps later; the control step then only pops, and the pending plan is
part of the state capsules hold. Both run inside the engine's boundary gate.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping

import torch

from flashrt_ros.engine.chunk_planner import (ACTIVE, AHEAD, COPY, LAUNCH, MERGE, READY, ChunkPlanner,
                                              ReplanConfig, blend)
from flashrt_ros.engine.host_mirror import HostMirror
from flashrt_ros.engine.policy_bodies import PolicyBodies
from flashrt_ros.engine.stats import percentile
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.runtime.arena import BOUNDARY, POSITION
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.rollback import RollbackRing


class SyncSchedule:
    """Replan in the step that empties the queue, else pop (a policy without a queue: one body)."""

    planner: ChunkPlanner | None = None

    def __init__(self, bodies: PolicyBodies, ring: RollbackRing, version: Callable[[], Hashable],
                 replan: ReplanConfig) -> None:
        self.bodies, self.arena, self.ring, self.version, self.replan = bodies, bodies.arena, ring, version, replan
        self.queue = bodies.queue
        self.left = HostMirror(version, self._read_left)      # the queue fill
        # what happened to plans made beside the loop (all 0 here)
        self.counts = {"launched": 0, "merged": 0, "held": 0, "late": 0, "dropped": 0, "delay_over_chunk": 0}

    def step(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """One committed control step (inside the gate); the action is in ``bodies.action``."""
        replan = None if self.queue is None else self.left.get() == 0
        self.ring.before_step()
        if replan is not False or self.queue.pop_reads_observation:
            self.bodies.load(inputs)
        self._run(replan)
        self.ring.record()
        if replan is not None:
            self.left.keep((self.queue.refill if replan else self.left.get()) - 1)

    def next_step_replans(self) -> bool | None:
        """Whether the next step plans a chunk in the control thread (None: no action queue)."""
        if self.queue is None:
            return None
        return self.left.get() == 0

    def status(self) -> dict[str, Any]:
        return {"mode": self.replan.mode, **({"chosen": self.replan.chosen} if self.replan.chosen else {})}

    # --- what the capsule hooks call (nothing is planned beside the loop here) -----------------
    def settle(self) -> None:
        """Before the live state is read whole: nothing in flight."""

    def has_pending(self) -> bool:
        """Whether a planned chunk waits to be merged (never here)."""
        return False

    def forget_pending(self) -> bool:
        """Inside a boundary: drop a plan in flight; False (none)."""
        return False

    def state_written(self) -> None:
        """The arena was written from outside the steps: read the mirrored scalars again."""
        self.left.keep(None)

    def refilled(self) -> None:
        """A body run at a boundary (redraw, replan from context) left a full queue."""
        self.left.keep(self.queue.refill)

    def close(self) -> None:
        """End a worker (none here)."""

    # --- internals --------------------------------------------------------------------
    def _run(self, replan: bool | None) -> None:
        try:
            self.bodies.steps[replan]()
        except BaseException:
            self.left.keep(None)          # whatever the failed body left: read it again
            raise

    def _read_left(self) -> int:
        """The queue fill, read from the arena (only after an outside write: ``HostMirror``)."""
        return int(self.arena[self.queue.left].item())


class AsyncSchedule(SyncSchedule):
    """Chunks planned beside the loop: the control step merges, pops, holds and launches."""

    def __init__(self, bodies: PolicyBodies, ring: RollbackRing, version: Callable[[], Hashable],
                 replan: ReplanConfig, *, cuda_graph: bool) -> None:
        super().__init__(bodies, ring, version, replan)
        self.planner = ChunkPlanner(bodies.policy, self.arena, bodies.inputs, self.queue, replan,
                                    cuda_graph=cuda_graph)
        self.position = HostMirror(version, lambda: int(self.arena[POSITION].item()))
        self.pending = HostMirror(version, self._read_pending)

    @staticmethod
    def check(policy: PolicyModule, queue: Any, mode: str) -> None:
        """Refuse a policy that cannot plan beside the loop in ``mode``, saying what to set instead."""
        name = type(policy).__name__
        if mode == "rtc" and not policy.supports_guidance:
            raise InvalidArgument(f"{name} takes no Real-Time Chunking guidance (a flow-matching policy does: "
                                  "SmolVLA, π0, π0.5): use replan async, with replan_blend_steps to smooth the "
                                  "switch")
        if queue is None or queue.chunk is None:
            raise InvalidArgument(f"{name} plans no action chunks (or does not name its queue): replan must be "
                                  "sync")
        if type(policy).plan is PolicyModule.plan:
            raise InvalidArgument(f"{name} cannot plan beside the loop (no plan()): replan must be sync")

    def step(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """One control step that never runs the network after the first chunk: merge a plan that is
        due and done, pop the queue (a late plan: the old queue runs on), hold the last command when
        the queue is dry (launching a plan if none is coming), launch the next plan once the queue
        is low. Only the episode's first step plans synchronously: there is no command to hold."""
        self.ring.before_step()
        pos = self.position.get()
        self._advance_pending(pos)
        left = self.left.get()
        active = self.pending.get()[0]
        if left == 0 and (active or pos > 0):
            if not active:                  # dry and nothing coming (a stale merge, a restore): plan now
                self._launch(pos + 1, 0, inputs)
            self._hold()
        else:
            replan = left == 0
            if replan or self.queue.pop_reads_observation:
                self.bodies.load(inputs)
            self._run(replan)
            left_after = (self.queue.refill if replan else left) - 1
            self.left.keep(left_after)
            if not active and left_after <= self.planner.delay_steps():
                self._launch(pos + 1, left_after + 1, inputs)
        self.position.keep(pos + 1)
        self.ring.record()

    def next_step_replans(self) -> bool | None:
        """Beside the loop only an episode's first step plans in the control thread: a dry queue
        later holds the last command instead."""
        return self.left.get() == 0 and self.position.get() == 0 and not self.pending.get()[0]

    def status(self) -> dict[str, Any]:
        """The mode, the delay, the steps a merged chunk lasts at that delay (``chunk_steps``: below the
        delay the robot holds before each merge), the plans' turnaround and what happened to them."""
        turns, delay = list(self.planner.turnaround_s), self.planner.delay_steps()
        return {**super().status(), **self.counts, "delay_steps": delay, "chunk_steps": self._chunk_steps(delay),
                "turnaround_p50_ms": percentile(turns, 50) * 1e3 if turns else float("nan"),
                "turnaround_p95_ms": percentile(turns, 95) * 1e3 if turns else float("nan")}

    # --- what the capsule hooks call ---------------------------------------------------------
    def settle(self) -> None:
        """Before the live state is read whole (snapshot, live verify, session park): a plan in flight
        finishes and its result enters the arena, so the capsule holds what the merge will use."""
        active, ready, launch, merge = self.pending.get()
        planner = self.planner
        if active and not ready and planner.busy and planner.owner == (self.version(), merge):
            planner.collect()
            self.pending.keep((1, 1, launch, merge))

    def has_pending(self) -> bool:
        return bool(self.pending.get()[0])

    def forget_pending(self) -> bool:
        """Inside a boundary: the plan in flight (if any) will not be merged. Its worker finishes it; the
        next launch waits for that. True if there was one."""
        if not self.pending.get()[0]:
            return False
        self.arena[ACTIVE].zero_()
        self.arena[READY].zero_()
        self.pending.keep((0, 0, 0, 0))
        self.counts["dropped"] += 1
        return True

    def close(self) -> None:
        self.planner.close()

    # --- the steps' parts ------------------------------------------------------------------
    def _hold(self) -> None:
        """The last command again: the robot's state does not move, so neither does the plan in
        flight's timeline (its merge then starts at the action after those the robot ran)."""
        self.counts["held"] += 1
        self.arena[POSITION].add_(1)
        self.arena[BOUNDARY].add_(1)
        active, ready, launch, merge = self.pending.get()
        if active:
            self.arena[LAUNCH].add_(1)
            self.pending.keep((active, ready, launch + 1, merge))

    def _advance_pending(self, pos: int) -> None:
        """Drop an orphaned plan, collect a finished one, merge one that is due and done. A plan due
        and not done is ``late`` (counted once): ``late: wait`` blocks for it here, ``hold`` merges it
        at the first step after it is done."""
        planner = self.planner
        active, ready, launch, merge = self.pending.get()
        if not active:
            if planner.busy and planner.done():
                planner.wait()              # an orphaned plan ended: free the worker
            return
        if not ready:
            if not (planner.busy and planner.owner == (self.version(), merge)):
                self.arena[ACTIVE].zero_()  # launched in a state since replaced (a rollback): plan again
                self.pending.keep((0, 0, 0, 0))
                self.counts["dropped"] += 1
                return
            due = pos >= merge
            if due and not planner.done():
                if pos == merge or self.replan.late == "wait":
                    self.counts["late"] += 1
                if self.replan.late == "hold":
                    return
            if not planner.done() and not due:
                return
            planner.collect()
            ready = 1
            self.pending.keep((1, 1, launch, merge))
        if pos >= merge:
            self._merge(pos, launch)

    def _merge(self, pos: int, launch: int) -> None:
        """The planned chunk replaces the queue from its action for this step (``pos - launch + 1``) on:
        up to ``refill`` of the chunk's actions (its queued ones, then those ``ahead``), placed so that the
        next pops read them."""
        q, refill, arena = self.queue, self.queue.refill, self.arena
        index = pos - launch + 1
        old_left = self.left.get()
        old = arena[q.chunk].clone() if self.replan.blend_steps else None
        for name in self.planner.planned:
            if name != q.chunk:
                arena[name].copy_(arena[COPY + name])
        planned = arena[COPY + q.chunk]
        if AHEAD in arena:
            planned = torch.cat([planned, arena[AHEAD]])
        new_left = max(min(refill, planned.shape[0] - index), 0)
        if new_left:
            arena[q.chunk][refill - new_left:].copy_(planned[index:index + new_left])
        arena[q.left].fill_(new_left)
        if old is not None and new_left:
            blend(arena[q.chunk], old, refill - new_left, refill - old_left, old_left, self.replan.blend_steps)
        arena[ACTIVE].zero_()
        arena[READY].zero_()
        self.left.keep(new_left)
        self.pending.keep((0, 0, 0, 0))
        self.counts["merged"] += 1

    def _launch(self, launch: int, leftover: int, inputs: Mapping[str, torch.Tensor]) -> None:
        """Record the plan in the arena (this step's boundary) and start it from the state now and
        this step's ``inputs``; ``leftover``: the old chunk's actions from this step's on (0: none)."""
        planner = self.planner
        if planner.busy:
            # a plan orphaned by a restore, reset, rollback or halt is still running: its worker is
            # needed now (waiting keeps the schedule exact; it happens only after such an event)
            planner.wait()
        planned_delay = planner.delay_steps()
        delay = max(1, min(planned_delay, leftover))   # the old queue lasts until the merge
        merge = launch - 1 + delay
        if self._chunk_steps(planned_delay) < planned_delay:
            # the merged chunk will run dry before the next plan (as long as this one) lands: the
            # robot holds in between; a planning delay too long for this policy's chunks
            self.counts["delay_over_chunk"] += 1
        self.arena[ACTIVE].fill_(1)
        self.arena[READY].zero_()
        self.arena[LAUNCH].fill_(launch)
        self.arena[MERGE].fill_(merge)
        self.pending.keep((1, 0, launch, merge))
        planner.launch((self.version(), merge), inputs, leftover, delay)
        self.counts["launched"] += 1

    def _chunk_steps(self, delay: int) -> int:
        """The actions a plan merged ``delay`` steps after its launch leaves in the queue: a queue's worth
        while the chunk's spare actions (``ActionQueue.ahead``) cover the delay, fewer after."""
        refill = self.queue.refill
        return max(0, min(refill, refill + self.queue.ahead - delay))

    def _read_pending(self) -> tuple[int, int, int, int]:
        values = torch.stack([self.arena[n] for n in (ACTIVE, READY, LAUNCH, MERGE)]).tolist()
        return tuple(int(v) for v in values)
