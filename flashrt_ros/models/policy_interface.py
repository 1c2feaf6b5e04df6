"""The contract every policy hosted by ``PolicyEngine`` fulfils, and the helpers policies share.

Why: a policy capsule is only bit-exact if nothing that shapes the next action
hides in a Python attribute. So a policy declares its state (hidden vectors,
observation history, action-chunk queue, RNG counter) as ``BufferSpec``s and its
``step`` reads and writes *only* those arena tensors, in place, with fixed
shapes and no host synchronisation, so one step can be captured as a CUDA graph.

Why a module of its own: every policy implementation (``reference_policies``, the
LeRobot models under ``models/lerobot/``) and the factory that builds one by name
(``policy_factory``) import this contract, and it imports none of them, so the
policy code has no import cycle.

Plugging in your own policy
---------------------------
Subclass :class:`PolicyModule` and

1. set ``obs_dim`` and ``act_dim`` (a policy reading more than one state
   vector, or images, declares ``input_features()`` and overrides
   ``step_observation`` instead of ``step``);
2. return every piece of mutable state from ``state_specs()`` (names start with
   ``"policy."``; shapes fixed; int64 for counters);
3. in ``step(obs, arena)`` read the state through ``arena[name]`` and write it
   back with in-place ops (``copy_``, ``add_``, ``index_copy_``); never
   ``.item()``, ``.cpu()``, Python ``if`` on tensor values, or boolean-mask
   indexing (they sync and break capture); choose with ``torch.where``;
4. if a zeroed arena is not your cold state, override ``init_state(arena)``.
5. a policy that plans chunks and then pops queued actions returns an
   ``ActionQueue`` from ``action_queue()`` and takes ``replan`` in
   ``step_observation``: the engine decides replan-or-pop on the host (no
   device read per step) and runs one body (one captured graph) for each;
   one whose replan stores the context its chunk is drawn from (a VLA's prefix
   KV) also names it (``ActionQueue.redraw_context``) and implements
   ``redraw_chunk``: the engine's ``redraw(seed)``, a third graph; one that
   also stores its encoded observation may implement ``replan_from_context``
   (``ActionQueue.replans_from_context``): the engine's verb of that name, a fourth.
6. to plan beside the control loop (the engine's ``replan="async"``), a chunking
   policy implements ``plan(observation, arena, guide, ahead)`` (a new chunk into
   the queue, no pop, no per-step update; the actions after the queued ones into
   ``ahead``) and names the queue buffer and every other buffer ``plan`` writes
   (``ActionQueue.chunk``, ``ActionQueue.planned``, ``chunk_size``, ``ahead``); a
   flow-matching policy that takes a ``Guidance`` in ``plan`` offers Real-Time
   Chunking (``replan="rtc"``, ``supports_guidance = True``: SmolVLA, π0, π0.5).

Weights are ordinary ``nn.Module`` parameters: they are not state, they enter
the engine fingerprint instead. See ``docs/policies.md``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from torch import Tensor, nn

from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.runtime.arena import BufferSpec, StateArena

STATE_PREFIX = "policy."
#: The int64 scalar a policy with a noise stream keeps its seed in (``engine.capsules.reset(seed=...)`` writes it).
RNG_SEED = "policy.rng.seed"
#: The int64 count of chunks planned this episode: the noise counter of the policies that draw per plan.
RNG_PLANS = "policy.rng.plans"


@dataclass(frozen=True)
class ActionQueue:
    """How a chunking policy's queue fills: the engine keeps ``left`` as a host mirror.

    A step replans when the queue is empty (``left == 0``): it predicts a chunk,
    puts ``refill`` actions in the queue and pops the first; any other step
    only pops. So after a step ``left`` is ``(refill if replanned else left) - 1``.

    ``redraw_context``: for a policy whose replan stores what the chunk is drawn
    from (a VLA's prefix KV), the arena scalar that is 0 until a replan stored
    it; the policy then implements ``redraw_chunk`` and the engine offers
    ``redraw(seed)``: a new noise draw of the chunk without the observation.
    ``replans_from_context``: the replan also stores the encoded observation, and
    the policy implements ``replan_from_context``: the engine's verb of the same
    name plans the last chunk again from it with the current episode state (a
    new instruction), without the observation and without its encoder.
    """

    left: str       # int64 arena scalar: actions left in the queue
    refill: int     # actions a replan (and a redraw) puts into the queue
    pop_reads_observation: bool = True   # False: a pop ignores the observation (the engine skips its copy)
    redraw_context: str | None = None    # int64 arena scalar, 0 while nothing can be redrawn; None: no redraw
    replans_from_context: bool = False   # True: ``replan_from_context`` (needs ``redraw_context``)
    chunk: str | None = None             # the queue buffer (refill, action_dim); None: no async replanning
    planned: tuple[str, ...] = ()        # other buffers ``plan`` writes (prefix KV, noise counter, ...)
    chunk_size: int = 0                  # the planned chunk's length (>= refill; RTC's weights cover it)
    ahead: int = 0                       # actions a plan predicts after the queued ones (``plan``'s ``ahead``)


@dataclass(frozen=True)
class Guidance:
    """Real-Time Chunking's inpainting target for one plan (``PolicyModule.plan``, flow matching only).

    The new chunk is pulled toward the previous chunk's actions not yet executed
    when the plan started (``actions[refill - left:]``, normalised), step ``i`` of
    the chunk with weight ``weights[i]`` (1 over the inference delay, fading to 0
    at the execution horizon: ``models.rtc.prefix_weights``), the guidance weight
    capped at ``max_weight``: LeRobot's ``RTCConfig`` / ``RTCProcessor`` fields.
    ``left`` is an int64 device scalar and ``weights`` a device vector of the
    chunk's length, so a guided plan has one shape.
    """

    actions: Tensor              # (refill, action_dim): the previous chunk's queue
    left: Tensor                 # int64 scalar: how many of them were still to run
    weights: Tensor              # (chunk length,) float32 prefix weights
    max_weight: float = 10.0


def pop_queue(queue: Tensor, left: Tensor) -> Tensor:
    """The next queued action ``queue[n - left]``; ``left`` drops by one (device ops only, no sync).

    The index is clamped into the queue so that a pop on an empty queue (which the
    engine never runs; graph capture warms the body up on the cold state) reads in bounds.
    """
    n = queue.shape[0]
    action = queue.index_select(0, (n - left).clamp(0, n - 1).view(1))[0]
    left.sub_(1)
    return action


def queue_chunk(chunk: Tensor, queue: Tensor, left: Tensor, ahead: Tensor | None = None) -> None:
    """A planned ``chunk`` (padded rows and columns allowed) into the queue, which is then full (``left``
    = its length), and the actions after the queued ones into ``ahead`` (an async plan's buffer, or None)."""
    n, dim = queue.shape
    queue.copy_(chunk[:n, :dim])
    if ahead is not None:
        ahead.copy_(chunk[n:n + ahead.shape[0], :dim])
    left.fill_(n)


class PolicyModule(nn.Module):
    """Contract every policy hosted by ``PolicyEngine`` fulfils (see module doc)."""

    obs_dim: int
    act_dim: int

    @property
    def action_dim(self) -> int:
        """Length of the action vector each step returns."""
        return self.act_dim

    def input_features(self) -> dict[str, FeatureSpec]:
        """The named inputs of one step (default: one state vector of ``obs_dim``)."""
        return {STATE: FeatureSpec((self.obs_dim,), "state")}

    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        """One step from named inputs (shapes as ``input_features``); default: ``step`` on the state.

        ``replan``: for a policy with an ``action_queue()``, whether this step plans a
        new chunk (True) or pops the queue (False), decided by the engine; else None.
        """
        return self.step(observation[STATE], arena)

    def action_queue(self) -> ActionQueue | None:
        """The queue the engine decides replan-or-pop from, or None (every step runs one body)."""
        return None

    #: ``plan`` takes a ``Guidance`` (Real-Time Chunking; flow-matching policies).
    supports_guidance = False

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: "Guidance | None" = None,
             ahead: Tensor | None = None) -> None:
        """Plan a new chunk from ``observation`` and the state into the queue (``left = refill``), without
        popping and without this step's per-step updates (they already ran): the engine's asynchronous
        replanning runs it on a copy of the state. Writes only ``ActionQueue.chunk``, ``left`` and
        ``ActionQueue.planned``. ``guide``: Real-Time Chunking (``supports_guidance`` policies only).
        ``ahead``: a ``(ActionQueue.ahead, action_dim)`` buffer for the chunk's actions after the queued
        ones, as the queue stores them: a plan merged ``d`` steps late still has ``refill`` actions."""
        raise NotImplementedError

    def redraw_chunk(self, arena: StateArena) -> None:
        """Refill the queue with the first chunk of the noise stream in ``policy.rng.seed`` over the
        context the last replan stored (no observation; device ops only: one captured graph).
        Only for an ``action_queue()`` with ``redraw_context``."""
        raise NotImplementedError

    def replan_from_context(self, arena: StateArena) -> None:
        """Refill the queue with the last plan made again from the encoded observation the last replan stored
        and the current episode state (same noise draw; device ops only: one captured graph). Only for an
        ``action_queue()`` with ``replans_from_context``."""
        raise NotImplementedError

    def state_specs(self) -> list[BufferSpec]:
        """Every mutable state buffer, names prefixed ``policy.``."""
        raise NotImplementedError

    def init_state(self, arena: StateArena) -> None:
        """Write the cold-start state into a freshly zeroed arena (default: zeros)."""

    def step(self, obs: Tensor, arena: StateArena) -> Tensor:
        """Map one observation ``[obs_dim]`` to one action ``[act_dim]``, updating state in place."""
        raise NotImplementedError

    def config(self) -> dict:
        """Hyper-parameters that define the architecture (enters the fingerprint)."""
        cfg = getattr(self, "cfg", None)
        return asdict(cfg) if cfg is not None else {}
