"""Verbs of a vision-language-action policy between two control steps: its instruction, a chunk re-drawn.

Why a verb of its own and not an observation field: the instruction is episode
state, not a per-step reading. It lives in the policy's arena buffers (so a
capsule brings it back and ``fork`` can give each branch its own), and it must
change only at a committed boundary: it goes through the engine's gate like the
capsule verbs, and is recorded in the rollback ring as one boundary (a
``rollback(1)`` undoes it). Writing it empties the action queue, so the next
step plans with the new instruction. A refused instruction changes nothing.

``resample_chunk`` re-draws the action chunk from the prefix KV already in the
arena with another noise seed, without running the VLM again: forked capsules of
one observation become N noise draws at the cost of N denoising loops.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from flashrt_ros.runtime.arena import BOUNDARY
from flashrt_ros.runtime.errors import InvalidArgument


def set_instruction(engine, text: str, *, timeout: float | None = None) -> list[int]:
    """Tokenise ``text`` with the checkpoint's tokenizer and make it the instruction; returns the ids."""
    ids = _policy(engine).instruction_ids(text)
    set_instruction_ids(engine, ids, timeout=timeout)
    return ids


def set_instruction_ids(engine, ids: Sequence[int], *, timeout: float | None = None) -> None:
    """Make the token ids ``ids`` the instruction (at the next boundary)."""
    policy = _policy(engine)
    ids = [int(i) for i in ids]

    def write() -> None:
        engine.store.ring.before_step()
        policy.write_instruction(engine.arena, ids)          # validates before writing
        engine.arena[BOUNDARY].add_(1)
        engine.store.ring.record()

    engine.gate.run_at_boundary(write, timeout=engine.capsules.timeout_s if timeout is None else timeout)


def _policy(engine):
    policy = engine.policy
    if not hasattr(policy, "write_instruction"):
        raise InvalidArgument(f"{type(policy).__name__} takes no language instruction")
    return policy


def resample_chunk(engine, seed: int, *, timeout: float | None = None,
                   denoise: Callable[[], None] | None = None) -> None:
    """Start noise stream ``seed`` and denoise a fresh chunk over the stored prefix (one recorded boundary).

    ``denoise``: what runs the denoising loop (``PlanPopSteps`` passes its captured graph);
    default: the policy's ``denoise`` on the engine's arena, eagerly."""
    policy = engine.policy
    if not hasattr(policy, "denoise"):
        raise InvalidArgument(f"{type(policy).__name__} has no prefix to re-draw a chunk from")
    seed = int(seed)
    if denoise is None:
        def denoise() -> None:
            with torch.no_grad():
                policy.denoise(engine.arena)

    def write() -> None:
        if int(engine.arena[policy.PREFIX_LEN].item()) == 0:
            raise InvalidArgument("no prefix yet: take a step first")
        engine.store.ring.before_step()
        engine.arena[policy.RNG_SEED].fill_(seed)
        engine.arena[policy.PLANS].zero_()
        denoise()
        engine.arena[BOUNDARY].add_(1)
        engine.store.ring.record()

    engine.gate.run_at_boundary(write, timeout=engine.capsules.timeout_s if timeout is None else timeout)


class PlanPopSteps:
    """A chunked policy's step as two bodies, ``plan`` and ``pop``, the replan-or-pop choice on the host.

    Why: a one-body step must run the network every step to keep the choice on
    the device (``torch.where``); a VLA costs tens of milliseconds per plan and
    pops most steps. Here ``plan`` (prefill + denoise + queue refill) and ``pop``
    (one action off the queue, the boundary counters) are each one captured
    graph over the engine's arena (``cuda_graph=True``), sharing a memory pool,
    and the host reads the queue count between steps. Each call is one
    committed boundary through the engine's gate and rollback ring, exactly as
    ``PolicyEngine.step``. A third graph, the denoising loop alone, serves
    ``resample`` (a fork's new noise draw over the stored prefix). Interim home
    until the policy engine's own host-decision path lands; the policy contract
    (``needs_plan`` / ``plan`` / ``pop``) is the one that path reads.
    """

    def __init__(self, engine, *, cuda_graph: bool = False) -> None:
        policy = engine.policy
        for method in ("needs_plan", "plan", "pop", "denoise"):
            if not hasattr(policy, method):
                raise InvalidArgument(f"{type(policy).__name__} has no {method}(): not a chunked policy")
        from flashrt_ros.engine.graphs import StepRunner
        self.engine, self.policy = engine, policy
        enabled = cuda_graph and engine.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle() if enabled else None
        self.planner = StepRunner(self._plan_body, engine.arena, enabled=enabled, pool=pool)
        self.popper = StepRunner(self._pop_body, engine.arena, enabled=enabled, pool=pool)
        self.denoiser = StepRunner(self._denoise_body, engine.arena, enabled=enabled, pool=pool)
        for runner in (self.planner, self.popper, self.denoiser):
            runner.capture()

    def step(self, observation) -> tuple[torch.Tensor, bool]:
        """One control step; returns ``(action, planned)``. A refused observation changes nothing."""
        e = self.engine
        inputs = e._validated(observation)
        with e.gate.step():
            e.store.ring.before_step()
            for name, value in inputs.items():
                e._inputs[name].copy_(value)
            planned = bool(self.policy.needs_plan(e.arena).item())
            if planned:
                self.planner()
            self.popper()
            e.store.ring.record()
            action = e._action.clone()
        if e.device.type == "cuda":
            torch.cuda.synchronize(e.device)
        return action, planned

    def resample(self, seed: int) -> None:
        """``resample_chunk`` with the captured denoising loop: a new chunk from the stored prefix."""
        resample_chunk(self.engine, seed, denoise=self.denoiser)

    def _denoise_body(self) -> None:
        with torch.no_grad():
            self.policy.denoise(self.engine.arena)

    def _plan_body(self) -> None:
        with torch.no_grad():
            self.policy.plan(self.engine._inputs, self.engine.arena)

    def _pop_body(self) -> None:
        from flashrt_ros.runtime.arena import POSITION
        arena = self.engine.arena
        with torch.no_grad():
            self.engine._action.copy_(self.policy.pop(arena))
            arena[POSITION].add_(1)
            arena[BOUNDARY].add_(1)
