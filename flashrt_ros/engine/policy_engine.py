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

Rooms: this façade builds the engine and offers its surface; which body a step
runs is ``replan_schedule``'s, the bodies themselves (and their graphs)
``policy_bodies``', and what runs at a boundary for someone else (cold start,
settle before a capsule read, state writes, refills, halts) ``policy_hooks``'.

Noise: ``capsules.reset()`` without a seed starts the episode from a seed drawn
from the OS (``status()["episode_seed"]`` reports it, so the episode can be
replayed with ``reset(seed=...)``); a freshly built engine starts from the
policy's configured seed.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from collections import deque
from typing import Any, Callable, Mapping, Sequence

import torch

import flashrt_ros
from flashrt_ros.engine.chunk_planner import ReplanConfig, pending_specs
from flashrt_ros.engine.policy_bodies import PolicyBodies
from flashrt_ros.engine.policy_hooks import PolicyHooks
from flashrt_ros.engine.replan_choice import choose_replan
from flashrt_ros.engine.replan_schedule import AsyncSchedule, SyncSchedule
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
        self.device = torch.device(device)
        self.replan = choose_replan(policy, self.device, replan or ReplanConfig(), lockstep=False).checked()
        specs = policy.state_specs()
        bad = [s.name for s in specs if not s.name.startswith(STATE_PREFIX)]
        if bad:
            raise InvalidArgument(f"policy state buffers must be prefixed {STATE_PREFIX!r}: {bad}")
        self.policy = policy.to(self.device).eval()
        queue = policy.action_queue()
        if self.replan.mode != "sync" or self.replan.may_switch:      # a plan in flight has its buffers
            AsyncSchedule.check(policy, queue, "async" if self.replan.may_switch else self.replan.mode)
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
        self.capsules = CapsuleVerbs(self.gate, self.store, cold_start=self._cold_start,
                                     timeout_s=gate_timeout_s)
        self.features: dict[str, FeatureSpec] = dict(policy.input_features())
        if not self.features:
            raise InvalidArgument("a policy must declare at least one input feature")
        self._latencies_ns: deque[int] = deque(maxlen=latency_window)
        if cuda_graph and self.device.type != "cuda":
            raise InvalidArgument("cuda_graph=True needs a CUDA device")
        self.bodies = PolicyBodies(self.policy, self.arena, self.features, cuda_graph=cuda_graph)
        ring, version = self.store.ring, self.capsules.version
        self.schedule: SyncSchedule = (SyncSchedule(self.bodies, ring, version, self.replan)
                                       if self.replan.mode == "sync" else
                                       AsyncSchedule(self.bodies, ring, version, self.replan, cuda_graph=cuda_graph))
        self.hooks = PolicyHooks(self.bodies, self.schedule, ring, self.gate, lambda: self.capsules.timeout_s)
        self.capsules.before_read = self.hooks.before_read
        self.hooks.cold_start(seed=None, fresh=False)
        self.bodies.capture()
        if self.schedule.planner is not None:
            self.schedule.planner.capture()

    # --- control --------------------------------------------------------------
    def step(self, observation: Mapping[str, torch.Tensor] | torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Run one control step and commit it as a boundary; returns a fresh action tensor.

        ``observation`` maps each declared feature name to a tensor of its
        shape (images float32 ``(3, H, W)`` in [0, 1]); a bare vector means
        ``{"observation.state": vector}``. Nothing changes when it is refused.
        """
        inputs = self._validated(observation)
        t0 = time.perf_counter_ns()
        with self.gate.step():
            self.schedule.step(inputs)
            action = self.bodies.action.clone()
        if self.device.type == "cuda":
            if self.schedule.planner is None:
                torch.cuda.synchronize(self.device)
            else:
                torch.cuda.current_stream(self.device).synchronize()     # not the planner's stream
        self._latencies_ns.append(time.perf_counter_ns() - t0)
        return action

    def switch_replan(self, chosen: str, *, timeout: float | None = None) -> None:
        """From ``sync`` to planning beside the loop (``async``), at a committed boundary, for good: ``replan: auto``
        when replanning in the step turned out to cost the control rate (``replan_choice.ReplanWatch``). The
        queue and the state stay; the next dry queue is refilled by a plan launched beside the loop. ``chosen``
        says why (``replan_status``). Refused for a policy that cannot plan beside the loop."""
        if self.replan.mode != "sync" or not self.replan.may_switch:
            raise InvalidArgument(f"switch_replan: replan is {self.replan.mode}" + (
                "" if self.replan.mode != "sync" else " without room for a plan in flight (only replan auto "
                                                      "that chose sync can switch)"))
        cfg = replace(self.replan, mode="async", chosen=chosen, may_switch=False).checked()

        def swap() -> None:
            schedule = AsyncSchedule(self.bodies, self.store.ring, self.capsules.version, cfg,
                                     cuda_graph=self.bodies.captured)
            if schedule.planner is not None:
                schedule.planner.capture()
            previous, self.schedule, self.hooks.schedule, self.replan = self.schedule, schedule, schedule, cfg
            previous.close()
        self.gate.run_at_boundary(swap, timeout=self.capsules.timeout_s if timeout is None else timeout)

    @property
    def counts(self) -> dict[str, int]:
        """What happened to plans made beside the loop: launched, merged, held steps, late, dropped,
        launched with the delay over the chunk (all 0 with ``replan: sync``)."""
        return self.schedule.counts

    def drop_pending(self, *, timeout: float | None = None) -> bool:
        """Forget the plan in flight (a halt: nothing planned before it reaches the robot after it);
        the queue stays. One committed boundary; True if there was one."""
        return self.hooks.drop_pending(timeout)

    def write_state(self, write: Callable[[StateArena], None], *, timeout: float | None = None) -> None:
        """Run ``write(arena)`` between two steps as one committed boundary (``rollback(1)`` undoes it):
        episode state that is not an observation, e.g. a VLA's instruction (``engine.vla``).

        ``write`` validates before it writes: an exception from it changes nothing. The
        queue fill is read from the arena again before the next step. A plan in flight
        (``replan: async | rtc``) is dropped: it was planned from the state before the write.
        """
        self.hooks.write_state(write, timeout)

    def redraw(self, seed: int, *, timeout: float | None = None) -> None:
        """Refill the queue with a new chunk drawn from noise stream ``seed`` over the context the
        last replan stored, without the observation (one committed boundary; captured on CUDA).

        Why: ``fork`` one observation's capsule and redraw each branch with its own seed, and
        N noise draws cost N denoising loops, not N VLM passes. The chunk is the one an
        episode seeded ``seed`` would plan first over that context. Needs a policy whose
        ``action_queue()`` has a ``redraw_context``, and a replan since the last reset.
        """
        self.hooks.redraw(seed, timeout)

    def replan_from_context(self, *, timeout: float | None = None) -> None:
        """Plan the last chunk again from the encoded observation the last replan stored, with the current
        episode state (e.g. an instruction set since) and the same noise draw; the queue is full again
        (one committed boundary; captured on CUDA).

        Why: re-instruct without a new observation and without its encoder (``engine.vla.reinstruct``):
        ``fork`` one observation's capsule, give each branch an instruction and replan it from the stored
        image tokens. The chunk is the one a replanning step would have planned with that instruction.
        Needs a policy whose ``action_queue()`` has ``replans_from_context``, and a replan since the last reset.
        """
        self.hooks.replan_from_context(timeout)

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
        return self.schedule.next_step_replans()

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
            "cuda_graph": self.bodies.captured,
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
        return self.schedule.status()

    def close(self) -> None:
        self.schedule.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # --- internals -------------------------------------------------------------
    def _cold_start(self, seed: int | None = None, *, fresh: bool = True) -> None:
        """The capsule verbs' cold start (``capsules.reset(seed=...)``, a new session): ``PolicyHooks``."""
        self.hooks.cold_start(seed, fresh=fresh)

    def _validated(self, observation: Any) -> dict[str, torch.Tensor]:
        """The observation as ``{feature: float32 tensor}``; ``InvalidArgument`` naming what is wrong. An image
        is float in [0, 1] or uint8 (0..255, scaled by 1 / 255 here: a camera's raw bytes must not become floats
        up to 255, which every policy would clamp to white); another integer image is refused."""
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
                value = torch.as_tensor(observation[name])
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgument(f"observation feature {name!r}: not a tensor ({exc})") from None
            if spec.kind == "image" and value.dtype == torch.uint8:
                value = value.to(torch.float32).div(255.0)
            elif spec.kind == "image" and not value.is_floating_point():
                raise InvalidArgument(f"observation feature {name!r}: an image is float in [0, 1] or uint8, "
                                      f"not {value.dtype}")
            else:
                value = value.to(torch.float32)
            if tuple(value.shape) != spec.shape:
                raise InvalidArgument(f"observation feature {name!r} must have shape {spec.shape}, "
                                      f"got {tuple(value.shape)}")
            out[name] = value
        return out

    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [*self.policy.named_parameters(), *self.policy.named_buffers()]
