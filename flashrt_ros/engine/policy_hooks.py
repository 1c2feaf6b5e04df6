"""What the policy engine does at a committed boundary on behalf of someone else than the control loop.

Why a room of its own: capsule verbs (``CapsuleVerbs``) call back into the
engine for a cold start (``reset``, a new session) and before they read the
live state whole (a plan in flight settles first); services and goals write
episode state between two steps (an instruction), refill the queue from a
stored context (redraw, re-instruct) or drop a plan in flight (a halt). Each is
one committed boundary recorded in the rollback ring, run through the
``BoundaryGate`` so it never lands inside a step, and each changes nothing when
it is refused.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from flashrt_ros.engine.graphs import StepRunner
from flashrt_ros.engine.policy_bodies import PolicyBodies
from flashrt_ros.engine.replan_schedule import SyncSchedule
from flashrt_ros.models.policy_interface import RNG_SEED
from flashrt_ros.runtime.arena import BOUNDARY, StateArena
from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.rollback import RollbackRing


class PolicyHooks:
    """Cold start, settle before a whole read, and the boundary writes of one policy engine."""

    def __init__(self, bodies: PolicyBodies, schedule: SyncSchedule, ring: RollbackRing, gate: BoundaryGate,
                 timeout_s: Callable[[], float]) -> None:
        self.bodies, self.schedule, self.ring, self.gate = bodies, schedule, ring, gate
        self.policy, self.arena = bodies.policy, bodies.arena
        self._timeout_s = timeout_s

    # --- capsule verbs' callbacks ----------------------------------------------------------
    def cold_start(self, seed: int | None = None, *, fresh: bool = True) -> None:
        """Cold start (``engine.capsules.reset(seed=...)``): ``seed`` starts this episode's
        noise stream there (policies with a ``policy.rng.seed`` buffer); without it a seed
        drawn from the OS (``fresh``; the engine's first cold start uses the policy's
        configured seed instead). ``episode_seed`` reports it. Bad input changes nothing."""
        noisy = RNG_SEED in self.arena
        if seed is not None and not noisy:
            raise InvalidArgument(f"{type(self.policy).__name__} draws no noise: it has no {RNG_SEED} to seed")
        if seed is not None:
            checked_seed(seed)
        if seed is None and fresh and noisy:
            seed = int.from_bytes(os.urandom(8), "little") >> 1        # non-negative int64
        self.arena.zero_()
        self.policy.init_state(self.arena)
        if seed is not None:
            self.arena[RNG_SEED].fill_(seed)
        self.ring.restart()         # the cold state is the first entry of a new timeline

    def before_read(self) -> None:
        """Before a snapshot, live verify or session park: a plan in flight enters the arena."""
        self.schedule.settle()

    # --- boundary writes -------------------------------------------------------------------
    def drop_pending(self, timeout: float | None) -> bool:
        """Forget the plan in flight (one committed boundary); True if there was one."""
        if self.schedule.planner is None:
            return False
        dropped: list[bool] = []

        def apply() -> None:
            dropped.append(self.schedule.has_pending())
            if dropped[0]:
                self.ring.before_step()
                self.schedule.forget_pending()
                self.arena[BOUNDARY].add_(1)
                self.ring.record()

        self.gate.run_at_boundary(apply, timeout=self._timeout(timeout))
        return dropped[0]

    def write_state(self, write: Callable[[StateArena], None], timeout: float | None) -> None:
        """``write(arena)`` as one committed boundary; a plan in flight is dropped (planned before it)."""
        def apply() -> None:
            self.ring.before_step()
            write(self.arena)
            self.schedule.forget_pending()     # planned from the state before the write: never merged
            self.arena[BOUNDARY].add_(1)
            self.ring.record()
            self.schedule.state_written()

        self.gate.run_at_boundary(apply, timeout=self._timeout(timeout))

    def redraw(self, seed: Any, timeout: float | None) -> None:
        """A new chunk drawn from noise stream ``seed`` over the stored context (one committed boundary)."""
        if self.bodies.redraw is None:
            raise InvalidArgument(f"{type(self.policy).__name__} cannot redraw a chunk: its replan stores "
                                  "no context to draw from")
        seed = checked_seed(seed)
        self._refill_from_context(self.bodies.redraw, "redraw", lambda: self.arena[RNG_SEED].fill_(seed), timeout)

    def replan_from_context(self, timeout: float | None) -> None:
        """The last chunk planned again from the stored encoded observation (one committed boundary)."""
        if self.bodies.context_replan is None:
            raise InvalidArgument(f"{type(self.policy).__name__} cannot replan from a stored observation")
        self._refill_from_context(self.bodies.context_replan, "replan", None, timeout)

    def _refill_from_context(self, runner: StepRunner, what: str, before: Callable[[], Any] | None,
                             timeout: float | None) -> None:
        """Run ``runner`` (a body that refills the queue from the stored context) as one committed boundary,
        after ``before`` (a state write); refused while no replan has stored a context."""
        queue, schedule = self.bodies.queue, self.schedule

        def apply() -> None:
            if int(self.arena[queue.redraw_context].item()) == 0:
                raise InvalidArgument(f"nothing to {what} from yet: take a step first")
            self.ring.before_step()
            schedule.forget_pending()          # a plan in flight would replace the refilled queue
            if before is not None:
                before()
            try:
                runner()
            except BaseException:
                schedule.state_written()
                raise
            self.ring.record()
            schedule.refilled()

        self.gate.run_at_boundary(apply, timeout=self._timeout(timeout))

    def _timeout(self, timeout: float | None) -> float:
        return self._timeout_s() if timeout is None else timeout


def checked_seed(seed: Any) -> int:
    """``seed`` if it is an int64 integer, else ``InvalidArgument``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(1 << 63) <= seed < 1 << 63:
        raise InvalidArgument(f"seed must be an int64 integer, got {seed!r}")
    return seed
