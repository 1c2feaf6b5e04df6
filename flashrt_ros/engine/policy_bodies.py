"""The policy engine's device work: each body one (optionally CUDA-graph captured) runner over the arena.

Why apart from the scheduling (``replan_schedule``): a body is what runs on the
device and may be captured, so it reads and writes only the arena and the
static buffers declared here, and never reads a device value back to the host.
Which body a step runs (replan or pop, launch or merge a plan beside the loop)
is decided on the host, elsewhere.

Bodies: one step body per mode (``None``: a policy without an action queue;
``True``: a replanning step; ``False``: a pop), and, for a policy whose replan
stores what its chunk is drawn from, ``redraw`` (a new noise draw over that
context) and ``context_replan`` (the last chunk planned again from the stored
encoded observation). All share one graph memory pool: they run one at a time
on one stream.
"""
from __future__ import annotations

from typing import Mapping

import torch

from flashrt_ros.engine.graphs import StepRunner
from flashrt_ros.models.policy_features import FeatureSpec
from flashrt_ros.models.policy_interface import RNG_SEED, PolicyModule
from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


class PolicyBodies:
    """The static input and action buffers and the runners of every body an engine offers."""

    def __init__(self, policy: PolicyModule, arena: StateArena, features: Mapping[str, FeatureSpec], *,
                 cuda_graph: bool) -> None:
        self.policy, self.arena = policy, arena
        device = arena.device
        # one static input buffer per feature: a captured step reads fixed addresses
        self.inputs = {name: torch.zeros(spec.shape, dtype=torch.float32, device=device)
                       for name, spec in features.items()}
        self.action = torch.zeros(policy.action_dim, dtype=torch.float32, device=device)
        self.queue = policy.action_queue()
        pool = torch.cuda.graph_pool_handle() if cuda_graph else None
        modes: tuple[bool | None, ...] = (None,) if self.queue is None else (True, False)
        self.steps = {mode: StepRunner(lambda mode=mode: self.step_body(mode), arena, enabled=cuda_graph, pool=pool)
                      for mode in modes}
        self.redraw: StepRunner | None = None
        self.context_replan: StepRunner | None = None
        if self.queue is not None and self.queue.redraw_context is not None:
            if RNG_SEED not in arena:
                raise InvalidArgument(f"{type(policy).__name__}: a redraw needs a {RNG_SEED} buffer")
            self.redraw = StepRunner(self._redraw_body, arena, enabled=cuda_graph, pool=pool)
            if self.queue.replans_from_context:
                self.context_replan = StepRunner(self._context_replan_body, arena, enabled=cuda_graph, pool=pool)

    def load(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Copy a validated observation into the static input buffers (what the next body reads)."""
        for name, value in inputs.items():
            self.inputs[name].copy_(value, non_blocking=True)

    def all(self) -> list[StepRunner]:
        """Every body this engine runs: the step bodies, then redraw and replan-from-context if offered."""
        return [r for r in (*self.steps.values(), self.redraw, self.context_replan) if r is not None]

    def capture(self) -> None:
        """Capture every body now (CUDA graphs; eager runners do nothing)."""
        for runner in self.all():
            runner.capture()

    @property
    def captured(self) -> bool:
        """Whether every body runs as a captured graph."""
        return all(r.graph is not None for r in self.all())

    # --- the bodies ----------------------------------------------------------------------
    def step_body(self, replan: bool | None) -> None:
        """Everything a step does on the device: the part captured as a graph (one per mode)."""
        with torch.no_grad():
            if replan is None:
                action = self.policy.step_observation(self.inputs, self.arena)
            else:
                action = self.policy.step_observation(self.inputs, self.arena, replan=replan)
            self.action.copy_(action)
            self.arena[POSITION].add_(1)
            self.arena[BOUNDARY].add_(1)

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
