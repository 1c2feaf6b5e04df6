"""Hosts one robot policy: a control step per call, capsules between steps.

Why: a robot controller must be interruptible (teleoperation takes over, a
recovery behaviour runs, a planner tries an alternative) and then resume as if
nothing happened. The engine keeps the policy's entire state in one
``StateArena`` so a capsule is a byte copy; every ``step`` is one committed
boundary recorded in the rollback ring; capsule verbs (``engine.capsules``,
the surface the LLM engine shares) go through the ``BoundaryGate`` so a request
from another thread (a ROS service) applies only between two steps, never inside one.

On CUDA the step can be captured once as a CUDA graph (``cuda_graph=True``):
restore copies bytes into the same addresses, so the graph stays valid.

Replan or pop: a chunking policy (``policy.action_queue()``) runs one of two
bodies, each its own graph: a replanning step (the whole network) when its
queue is empty, else a pop (a few small kernels). The engine decides on the
host from the queue fill it mirrors (``HostMirror``): each step knows how it
changes the fill, and anything that writes the arena from outside (restore,
rollback, reset, session switch, ``write_state``) makes the engine read it once more.
A policy whose replan stores what its chunk is drawn from (a VLA's prefix KV:
``ActionQueue.redraw_context``) gets a third body, ``redraw(seed)``: a new noise
draw of the chunk over that context without the observation (a fork's N draws
at the cost of N denoising loops), its own graph too; one that also stores its
encoded observation (``ActionQueue.replans_from_context``: π0's image tokens)
gets a fourth, ``replan_from_context()``: the last chunk planned again with the
current instruction, without the observation's encoder.

Asynchronous replanning (``replan=ReplanConfig(mode="async" | "rtc")``): the next
chunk is planned beside the control loop and merged a fixed number of steps later
(``chunk_planner``); the control step then only pops, and the pending plan is part
of the state capsules hold.

Noise: ``capsules.reset()`` without a seed starts the episode from a seed drawn
from the OS (``status()["episode_seed"]`` reports it, so the episode can be
replayed with ``reset(seed=...)``); a freshly built engine starts from the
policy's configured seed.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

import torch

import flashrt_ros
from flashrt_ros.engine.chunk_planner import (AHEAD, ACTIVE, COPY, LAUNCH, MERGE, READY, ChunkPlanner, ReplanConfig,
                                              blend, pending_specs)
from flashrt_ros.engine.graphs import StepRunner
from flashrt_ros.engine.host_mirror import HostMirror
from flashrt_ros.engine.stats import percentile
from flashrt_ros.models.policy_interface import RNG_SEED, STATE_PREFIX, PolicyModule
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena, core_meta_specs
from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.capsule_verbs import CapsuleVerbs
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.fingerprint import compute_fingerprint
from flashrt_ros.runtime.store import CapsuleStore

MiB = 1 << 20


class PolicyEngine:
    """One policy, one arena, one capsule store; ``step(obs) -> action``."""

    def __init__(
        self,
        policy: PolicyModule,
        *,
        device: torch.device | str = "cpu",
        device_budget_bytes: int = 64 * MiB,
        host_budget_bytes: int = 256 * MiB,
        disk_budget_bytes: int = 1024 * MiB,
        directory: str | None = None,
        rollback_depth: int = 8,
        default_tier: str = "device",
        cuda_graph: bool = False,
        gate_timeout_s: float = 1.0,
        latency_window: int = 10_000,
        replan: ReplanConfig | None = None,
    ) -> None:
        self.replan = (replan or ReplanConfig()).checked()
        specs = policy.state_specs()
        bad = [s.name for s in specs if not s.name.startswith(STATE_PREFIX)]
        if bad:
            raise InvalidArgument(f"policy state buffers must be prefixed {STATE_PREFIX!r}: {bad}")
        self.device = torch.device(device)
        self.policy = policy.to(self.device).eval()
        queue = policy.action_queue()
        if self.replan.mode != "sync":
            self._check_async(policy, queue, self.replan.mode)
            specs = specs + pending_specs(specs, queue)
        self.arena = StateArena(specs + core_meta_specs(), self.device)
        self.fingerprint = compute_fingerprint(
            {"engine": "policy", "class": type(policy).__qualname__, **policy.config()},
            self._named_weights(), self.arena, flashrt_ros.__version__)
        self._tmpdir = None
        if directory is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="flashrt_policy_")
            directory = self._tmpdir.name
        self.store = CapsuleStore(
            self.arena, self.fingerprint, device_budget_bytes=device_budget_bytes,
            host_budget_bytes=host_budget_bytes, disk_budget_bytes=disk_budget_bytes,
            directory=directory, rollback_depth=rollback_depth, default_tier=default_tier)
        self.gate = BoundaryGate()
        self.capsules = CapsuleVerbs(self.gate, self.store, cold_start=self._reset_state,
                                     timeout_s=gate_timeout_s)
        self.features: dict[str, FeatureSpec] = dict(policy.input_features())
        if not self.features:
            raise InvalidArgument("a policy must declare at least one input feature")
        # one static input buffer per feature: a captured step reads fixed addresses
        self._inputs = {name: torch.zeros(spec.shape, dtype=torch.float32, device=self.device)
                        for name, spec in self.features.items()}
        self._action = torch.zeros(policy.action_dim, dtype=torch.float32, device=self.device)
        self._latencies_ns: deque[int] = deque(maxlen=latency_window)
        if cuda_graph and self.device.type != "cuda":
            raise InvalidArgument("cuda_graph=True needs a CUDA device")
        self._queue = policy.action_queue()
        pool = torch.cuda.graph_pool_handle() if cuda_graph else None
        modes: tuple[bool | None, ...] = (None,) if self._queue is None else (True, False)
        self._runners = {mode: StepRunner(lambda mode=mode: self._step_body(mode), self.arena,
                                          enabled=cuda_graph, pool=pool) for mode in modes}
        self._redraw = self._context_replan = None
        if self._queue is not None and self._queue.redraw_context is not None:
            if RNG_SEED not in self.arena:
                raise InvalidArgument(f"{type(policy).__name__}: a redraw needs a {RNG_SEED} buffer")
            self._redraw = StepRunner(self._redraw_body, self.arena, enabled=cuda_graph, pool=pool)
            if self._queue.replans_from_context:
                self._context_replan = StepRunner(self._context_replan_body, self.arena, enabled=cuda_graph,
                                                  pool=pool)
        self._left = HostMirror(self.capsules.version, self._read_left)
        self._planner: ChunkPlanner | None = None
        self.counts = {"launched": 0, "merged": 0, "held": 0, "late": 0, "dropped": 0, "delay_over_chunk": 0}
        if self.replan.mode != "sync":
            self._planner = ChunkPlanner(policy, self.arena, self._inputs, self._queue, self.replan,
                                         cuda_graph=cuda_graph)
            self._position = HostMirror(self.capsules.version, lambda: int(self.arena[POSITION].item()))
            self._pending = HostMirror(self.capsules.version, self._read_pending)
            self.capsules.before_read = self._settle_pending
        self._reset_state(seed=None, fresh=False)
        for runner in self._all_runners():
            runner.capture()
        if self._planner is not None:
            self._planner.capture()

    # --- control --------------------------------------------------------------
    def step(self, observation: Mapping[str, torch.Tensor] | torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Run one control step and commit it as a boundary; returns a fresh action tensor.

        ``observation`` maps each declared feature name to a tensor of its
        shape (images float32 ``(3, H, W)`` in [0, 1]); a bare vector means
        ``{"observation.state": vector}``. Nothing changes when it is refused.
        """
        inputs = self._validated(observation)
        t0 = time.perf_counter_ns()
        if self._planner is not None:
            return self._timed(t0, self._step_async, inputs)
        with self.gate.step():
            replan = None if self._queue is None else self._left.get() == 0
            self.store.ring.before_step()
            if replan is not False or self._queue.pop_reads_observation:
                for name, value in inputs.items():
                    self._inputs[name].copy_(value, non_blocking=True)
            try:
                self._runners[replan]()
            except BaseException:
                self._left.keep(None)         # whatever the failed body left: read it again
                raise
            self.store.ring.record()
            if replan is not None:
                self._left.keep((self._queue.refill if replan else self._left.get()) - 1)
            action = self._action.clone()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._latencies_ns.append(time.perf_counter_ns() - t0)
        return action

    def _timed(self, t0: int, step: Callable[[dict[str, torch.Tensor]], torch.Tensor],
               inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.gate.step():
            action = step(inputs)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()     # not the planner's stream
        self._latencies_ns.append(time.perf_counter_ns() - t0)
        return action

    # --- asynchronous replanning ----------------------------------------------------------
    def _step_async(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """One control step that never runs the network after the first chunk: merge a plan that is
        due and done, pop the queue (a late plan: the old queue runs on), hold the last command when
        the queue is dry (launching a plan if none is coming), launch the next plan once the queue
        is low. Only the episode's first step plans synchronously: there is no command to hold."""
        self.store.ring.before_step()
        pos = self._position.get()
        self._advance_pending(pos)
        left = self._left.get()
        active = self._pending.get()[0]
        if left == 0 and (active or pos > 0):
            if not active:                  # dry and nothing coming (a stale merge, a restore): plan now
                self._launch(pos + 1, 0, inputs)
            self._hold()
        else:
            replan = left == 0
            if replan or self._queue.pop_reads_observation:
                for name, value in inputs.items():
                    self._inputs[name].copy_(value, non_blocking=True)
            try:
                self._runners[replan]()
            except BaseException:
                self._left.keep(None)
                raise
            left_after = (self._queue.refill if replan else left) - 1
            self._left.keep(left_after)
            if not active and left_after <= self._planner.delay_steps():
                self._launch(pos + 1, left_after + 1, inputs)
        self._position.keep(pos + 1)
        self.store.ring.record()
        return self._action.clone()

    def _hold(self) -> None:
        """The last command again: the robot's state does not move, so neither does the plan in
        flight's timeline (its merge then starts at the action after those the robot ran)."""
        self.counts["held"] += 1
        self.arena[POSITION].add_(1)
        self.arena[BOUNDARY].add_(1)
        active, ready, launch, merge = self._pending.get()
        if active:
            self.arena[LAUNCH].add_(1)
            self._pending.keep((active, ready, launch + 1, merge))

    def _advance_pending(self, pos: int) -> None:
        """Drop an orphaned plan, collect a finished one, merge one that is due and done. A plan due
        and not done is ``late`` (counted once): ``late: wait`` blocks for it here, ``hold`` merges it
        at the first step after it is done."""
        planner = self._planner
        active, ready, launch, merge = self._pending.get()
        if not active:
            if planner.busy and planner.done():
                planner.wait()              # an orphaned plan ended: free the worker
            return
        if not ready:
            if not (planner.busy and planner.owner == (self.capsules.version(), merge)):
                self.arena[ACTIVE].zero_()  # launched in a state since replaced (a rollback): plan again
                self._pending.keep((0, 0, 0, 0))
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
            self._pending.keep((1, 1, launch, merge))
        if pos >= merge:
            self._merge(pos, launch)

    def _merge(self, pos: int, launch: int) -> None:
        """The planned chunk replaces the queue from its action for this step (``pos - launch + 1``) on:
        up to ``refill`` of the chunk's actions (its queued ones, then those ``ahead``), placed so that the
        next pops read them."""
        q, refill = self._queue, self._queue.refill
        index = pos - launch + 1
        old_left = self._left.get()
        old = self.arena[q.chunk].clone() if self.replan.blend_steps else None
        for name in self._planner.planned:
            if name != q.chunk:
                self.arena[name].copy_(self.arena[COPY + name])
        planned = self.arena[COPY + q.chunk]
        if AHEAD in self.arena:
            planned = torch.cat([planned, self.arena[AHEAD]])
        new_left = max(min(refill, planned.shape[0] - index), 0)
        if new_left:
            self.arena[q.chunk][refill - new_left:].copy_(planned[index:index + new_left])
        self.arena[q.left].fill_(new_left)
        if old is not None and new_left:
            blend(self.arena[q.chunk], old, refill - new_left, refill - old_left, old_left, self.replan.blend_steps)
        self.arena[ACTIVE].zero_()
        self.arena[READY].zero_()
        self._left.keep(new_left)
        self._pending.keep((0, 0, 0, 0))
        self.counts["merged"] += 1

    def _launch(self, launch: int, leftover: int, inputs: dict[str, torch.Tensor]) -> None:
        """Record the plan in the arena (this step's boundary) and start it from the state now and
        this step's ``inputs``; ``leftover``: the old chunk's actions from this step's on (0: none)."""
        planner = self._planner
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
        self._pending.keep((1, 0, launch, merge))
        planner.launch((self.capsules.version(), merge), inputs, leftover, delay)
        self.counts["launched"] += 1

    def _chunk_steps(self, delay: int) -> int:
        """The actions a plan merged ``delay`` steps after its launch leaves in the queue: a queue's worth
        while the chunk's spare actions (``ActionQueue.ahead``) cover the delay, fewer after."""
        refill = self._queue.refill
        return max(0, min(refill, refill + self._queue.ahead - delay))

    def _settle_pending(self) -> None:
        """Before the live state is read whole (snapshot, live verify, session park): a plan in flight
        finishes and its result enters the arena, so the capsule holds what the merge will use."""
        active, ready, launch, merge = self._pending.get()
        planner = self._planner
        if active and not ready and planner.busy and planner.owner == (self.capsules.version(), merge):
            planner.collect()
            self._pending.keep((1, 1, launch, merge))

    def drop_pending(self, *, timeout: float | None = None) -> bool:
        """Forget the plan in flight (a halt: nothing planned before it reaches the robot after it);
        the queue stays. One committed boundary; True if there was one."""
        if self._planner is None:
            return False
        dropped: list[bool] = []

        def apply() -> None:
            active = bool(self._pending.get()[0])
            dropped.append(active)
            if active:
                self.store.ring.before_step()
                self._forget_pending()
                self.arena[BOUNDARY].add_(1)
                self.store.ring.record()

        self.gate.run_at_boundary(apply, timeout=self.capsules.timeout_s if timeout is None else timeout)
        return dropped[0]

    def _forget_pending(self) -> None:
        """Inside a boundary: the plan in flight (if any) will not be merged. Its worker finishes it; the
        next launch waits for that."""
        if self._planner is not None and self._pending.get()[0]:
            self.arena[ACTIVE].zero_()
            self.arena[READY].zero_()
            self._pending.keep((0, 0, 0, 0))
            self.counts["dropped"] += 1

    def _read_pending(self) -> tuple[int, int, int, int]:
        values = torch.stack([self.arena[n] for n in (ACTIVE, READY, LAUNCH, MERGE)]).tolist()
        return tuple(int(v) for v in values)

    @staticmethod
    def _check_async(policy: PolicyModule, queue: Any, mode: str) -> None:
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

    def write_state(self, write: Callable[[StateArena], None], *, timeout: float | None = None) -> None:
        """Run ``write(arena)`` between two steps as one committed boundary (``rollback(1)`` undoes it):
        episode state that is not an observation, e.g. a VLA's instruction (``engine.vla``).

        ``write`` validates before it writes: an exception from it changes nothing. The
        queue fill is read from the arena again before the next step. A plan in flight
        (``replan: async | rtc``) is dropped: it was planned from the state before the write.
        """
        def apply() -> None:
            self.store.ring.before_step()
            write(self.arena)
            self._forget_pending()          # planned from the state before the write: never merged
            self.arena[BOUNDARY].add_(1)
            self.store.ring.record()
            self._left.keep(None)

        self.gate.run_at_boundary(apply, timeout=self.capsules.timeout_s if timeout is None else timeout)

    def redraw(self, seed: int, *, timeout: float | None = None) -> None:
        """Refill the queue with a new chunk drawn from noise stream ``seed`` over the context the
        last replan stored, without the observation (one committed boundary; captured on CUDA).

        Why: ``fork`` one observation's capsule and redraw each branch with its own seed, and
        N noise draws cost N denoising loops, not N VLM passes. The chunk is the one an
        episode seeded ``seed`` would plan first over that context. Needs a policy whose
        ``action_queue()`` has a ``redraw_context``, and a replan since the last reset.
        """
        if self._redraw is None:
            raise InvalidArgument(f"{type(self.policy).__name__} cannot redraw a chunk: its replan stores "
                                  "no context to draw from")
        seed = self._checked_seed(seed)
        self._refill_from_context(self._redraw, "redraw", lambda: self.arena[RNG_SEED].fill_(seed), timeout)

    def replan_from_context(self, *, timeout: float | None = None) -> None:
        """Plan the last chunk again from the encoded observation the last replan stored, with the current
        episode state (e.g. an instruction set since) and the same noise draw; the queue is full again
        (one committed boundary; captured on CUDA).

        Why: re-instruct without a new observation and without its encoder (``engine.vla.reinstruct``):
        ``fork`` one observation's capsule, give each branch an instruction and replan it from the stored
        image tokens. The chunk is the one a replanning step would have planned with that instruction.
        Needs a policy whose ``action_queue()`` has ``replans_from_context``, and a replan since the last reset.
        """
        if self._context_replan is None:
            raise InvalidArgument(f"{type(self.policy).__name__} cannot replan from a stored observation")
        self._refill_from_context(self._context_replan, "replan", None, timeout)

    def planned_actions(self) -> torch.Tensor:
        """Actions after the one just taken that the policy has already planned (``(k, action_dim)``
        on the CPU, k may be 0): a trajectory command sends them. Read at a boundary."""
        plan = getattr(self.policy, "planned_actions", None)
        if plan is None:
            return torch.zeros(0, int(self.policy.action_dim))
        return self.gate.run_at_boundary(lambda: plan(self.arena).detach().cpu().clone(),
                                         timeout=self.capsules.timeout_s)

    def next_step_replans(self) -> bool | None:
        """Whether the next step plans a new chunk in the control thread (None: the policy has no
        action queue). Beside the loop (``replan: async | rtc``) only an episode's first step does:
        a dry queue later holds the last command instead.

        From the host mirrors of the queue fill and the pending plan: no device read unless the
        state was written from outside since the last step. Call between steps.
        """
        if self._queue is None:
            return None
        if self._planner is not None:
            return self._left.get() == 0 and self._position.get() == 0 and not self._pending.get()[0]
        return self._left.get() == 0

    @property
    def episode_seed(self) -> int | None:
        """The live episode's noise seed (host read: call between steps); None if the policy draws none."""
        return int(self.arena[RNG_SEED].item()) if RNG_SEED in self.arena else None

    @property
    def position(self) -> int:
        """Steps committed since the last reset (host read: call between steps)."""
        return int(self.arena[POSITION].item())

    # --- introspection ------------------------------------------------------------
    def latency(self) -> dict[str, float]:
        """Step latency percentiles in milliseconds over the recent window."""
        if not self._latencies_ns:
            return {"count": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
        xs = list(self._latencies_ns)
        return {"count": len(xs), "p50_ms": percentile(xs, 50) / 1e6, "p99_ms": percentile(xs, 99) / 1e6,
                "max_ms": max(xs) / 1e6}

    def status(self) -> dict[str, Any]:
        """A flat summary for diagnostics (host reads: call between steps)."""
        return {
            "policy": type(self.policy).__name__,
            "device": str(self.device),
            "cuda_graph": all(r.graph is not None for r in self._all_runners()),
            "episode_seed": self.episode_seed,
            "position": int(self.arena[POSITION].item()),
            "boundary": int(self.arena[BOUNDARY].item()),
            "arena_bytes": self.arena.nbytes,
            "live_bytes": self.arena.live_nbytes(),
            "session": self.capsules.sessions.current,
            "fingerprint": self.fingerprint,
            "latency": self.latency(),
            "store": self.store.stats(),
            "replan": self.replan_status(),
        }

    def replan_status(self) -> dict[str, Any]:
        """How chunks are planned: the mode and, beside the loop, the delay, the steps a merged chunk
        lasts at that delay (``chunk_steps``: below the delay the robot holds before each merge), the
        plans' turnaround and what happened to them (launched, merged, held steps, late, dropped,
        launched with the delay over the chunk)."""
        out: dict[str, Any] = {"mode": self.replan.mode}
        if self._planner is not None:
            turns, delay = list(self._planner.turnaround_s), self._planner.delay_steps()
            out.update(self.counts, delay_steps=delay, chunk_steps=self._chunk_steps(delay),
                       turnaround_p50_ms=percentile(turns, 50) * 1e3 if turns else float("nan"),
                       turnaround_p95_ms=percentile(turns, 95) * 1e3 if turns else float("nan"))
        return out

    def close(self) -> None:
        if self._planner is not None:
            self._planner.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # --- internals -------------------------------------------------------------
    def _validated(self, observation: Any) -> dict[str, torch.Tensor]:
        """The observation as ``{feature: float32 tensor}``; ``InvalidArgument`` naming what is wrong."""
        if not isinstance(observation, Mapping):
            observation = {STATE: observation}
        missing = sorted(set(self.features) - set(observation))
        unknown = sorted(set(observation) - set(self.features))
        if missing or unknown:
            raise InvalidArgument(f"observation features: missing {missing}, unknown {unknown}; "
                                  f"the policy reads {sorted(self.features)}")
        out = {}
        for name, spec in self.features.items():
            try:
                value = torch.as_tensor(observation[name], dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgument(f"observation feature {name!r}: not a tensor ({exc})") from None
            if tuple(value.shape) != spec.shape:
                raise InvalidArgument(f"observation feature {name!r} must have shape {spec.shape}, "
                                      f"got {tuple(value.shape)}")
            out[name] = value
        return out

    def _read_left(self) -> int:
        """The queue fill, read from the arena (only after an outside write: ``HostMirror``)."""
        return int(self.arena[self._queue.left].item())

    def _step_body(self, replan: bool | None) -> None:
        """Everything a step does on the device: the part captured as a graph (one per mode)."""
        with torch.no_grad():
            if replan is None:
                action = self.policy.step_observation(self._inputs, self.arena)
            else:
                action = self.policy.step_observation(self._inputs, self.arena, replan=replan)
            self._action.copy_(action)
            self.arena[POSITION].add_(1)
            self.arena[BOUNDARY].add_(1)

    def _refill_from_context(self, runner: StepRunner, what: str, before: Callable[[], Any] | None,
                             timeout: float | None) -> None:
        """Run ``runner`` (a body that refills the queue from the stored context) as one committed boundary,
        after ``before`` (a state write); refused while no replan has stored a context."""
        def apply() -> None:
            if int(self.arena[self._queue.redraw_context].item()) == 0:
                raise InvalidArgument(f"nothing to {what} from yet: take a step first")
            self.store.ring.before_step()
            self._forget_pending()          # a plan in flight would replace the refilled queue
            if before is not None:
                before()
            try:
                runner()
            except BaseException:
                self._left.keep(None)
                raise
            self.store.ring.record()
            self._left.keep(self._queue.refill)

        self.gate.run_at_boundary(apply, timeout=self.capsules.timeout_s if timeout is None else timeout)

    def _all_runners(self) -> list[StepRunner]:
        """Every body this engine runs: the step bodies, then redraw and replan-from-context if offered."""
        return [r for r in (*self._runners.values(), self._redraw, self._context_replan) if r is not None]

    def _context_replan_body(self) -> None:
        """The replan from the stored observation on the device (its own graph)."""
        with torch.no_grad():
            self.policy.replan_from_context(self.arena)
            self.arena[BOUNDARY].add_(1)

    def _redraw_body(self) -> None:
        """The redraw on the device (its own graph): the policy's chunk over the stored context."""
        with torch.no_grad():
            self.policy.redraw_chunk(self.arena)
            self.arena[BOUNDARY].add_(1)

    @staticmethod
    def _checked_seed(seed: Any) -> int:
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(1 << 63) <= seed < 1 << 63:
            raise InvalidArgument(f"seed must be an int64 integer, got {seed!r}")
        return seed

    def _reset_state(self, seed: int | None = None, *, fresh: bool = True) -> None:
        """Cold start (``engine.capsules.reset(seed=...)``): ``seed`` starts this episode's
        noise stream there (policies with a ``policy.rng.seed`` buffer); without it a seed
        drawn from the OS (``fresh``; the engine's first cold start uses the policy's
        configured seed instead). ``episode_seed`` reports it. Bad input changes nothing."""
        noisy = RNG_SEED in self.arena
        if seed is not None and not noisy:
            raise InvalidArgument(f"{type(self.policy).__name__} draws no noise: it has no {RNG_SEED} to seed")
        if seed is not None:
            self._checked_seed(seed)
        if seed is None and fresh and noisy:
            seed = int.from_bytes(os.urandom(8), "little") >> 1        # non-negative int64
        self.arena.zero_()
        self.policy.init_state(self.arena)
        if seed is not None:
            self.arena[RNG_SEED].fill_(seed)
        self.store.ring.restart()         # the cold state is the first entry of a new timeline

    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [*self.policy.named_parameters(), *self.policy.named_buffers()]

