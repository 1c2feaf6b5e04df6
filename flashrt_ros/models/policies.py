"""Robot policies whose whole recurrent state lives in arena buffers.

Why: a policy capsule is only bit-exact if nothing that shapes the next action
hides in a Python attribute. So a policy declares its state (hidden vectors,
observation history, action-chunk queue, RNG counter) as ``BufferSpec``s and its
``step`` reads and writes *only* those arena tensors, in place, with fixed
shapes and no host synchronisation, so one step can be captured as a CUDA graph.

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

Weights are ordinary ``nn.Module`` parameters: they are not state, they enter
the engine fingerprint instead. See ``docs/policies.md``.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.ops.counter_rng import normal as counter_normal
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument

STATE_PREFIX = "policy."
#: The int64 scalar a policy with a noise stream keeps its seed in (``engine.capsules.reset(seed=...)`` writes it).
RNG_SEED = "policy.rng.seed"


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


def pop_queue(queue: Tensor, left: Tensor) -> Tensor:
    """The next queued action ``queue[n - left]``; ``left`` drops by one (device ops only, no sync).

    The index is clamped into the queue so that a pop on an empty queue (which the
    engine never runs; graph capture warms the body up on the cold state) reads in bounds.
    """
    n = queue.shape[0]
    action = queue.index_select(0, (n - left).clamp(0, n - 1).view(1))[0]
    left.sub_(1)
    return action


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


# --- (a) GRU policy -----------------------------------------------------------

@dataclass(frozen=True)
class GRUPolicyConfig:
    obs_dim: int = 6
    act_dim: int = 2
    hidden: int = 64
    max_action: float = 1.0
    seed: int = 0


class GRUPolicy(PolicyModule):
    """obs -> MLP -> GRU cell -> tanh head; the GRU hidden vector is the state."""

    HIDDEN = "policy.gru.hidden"

    def __init__(self, cfg: GRUPolicyConfig = GRUPolicyConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.obs_dim, cfg.act_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.encoder = nn.Linear(cfg.obs_dim, cfg.hidden)
            self.cell = nn.GRUCell(cfg.hidden, cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.act_dim)

    def state_specs(self) -> list[BufferSpec]:
        return [BufferSpec(self.HIDDEN, (self.cfg.hidden,), torch.float32, group="recurrent",
                           doc="GRU hidden state")]

    def step(self, obs: Tensor, arena: StateArena) -> Tensor:
        h = arena[self.HIDDEN]
        x = F.silu(self.encoder(obs.to(h.dtype)))
        h_new = self.cell(x.unsqueeze(0), h.unsqueeze(0)).squeeze(0)
        h.copy_(h_new)
        return self.cfg.max_action * torch.tanh(self.head(h_new))


# --- (b) transformer policy with action chunking --------------------------------

@dataclass(frozen=True)
class ChunkedTransformerPolicyConfig:
    obs_dim: int = 6
    act_dim: int = 2
    history: int = 8          # T: observations kept in the ring
    chunk: int = 8            # H: future actions predicted per chunk
    replan_every: int = 2     # k: a new chunk every k steps
    ensemble_decay: float = 0.5   # m in w_i = exp(-m * i), i = 0 for the oldest chunk
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    noise_std: float = 0.05
    max_action: float = 1.0
    rng_seed: int = 1234      # seed written into the arena at cold start
    seed: int = 0             # weight initialisation seed

    @property
    def chunk_slots(self) -> int:
        """How many chunks can overlap one time step."""
        return -(-self.chunk // self.replan_every)


class _Block(nn.Module):
    """Pre-norm transformer block with a key mask."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor, key_valid: Tensor) -> Tensor:
        t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.n_heads, d // self.n_heads).permute(1, 2, 0, 3)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_valid.view(1, 1, t))
        x = x + self.proj(y.transpose(0, 1).reshape(t, d))
        return x + self.mlp(self.norm2(x))


class ChunkedTransformerPolicy(PolicyModule):
    """Transformer over an observation-history ring, predicting action chunks.

    Every step: write ``obs`` into the ring, encode the (masked) history, and,
    if ``t % k == 0``, push the predicted chunk of H actions into the chunk
    queue. The executed action is the temporal ensemble (ACT-style, weights
    ``exp(-m*i)`` with the oldest overlapping chunk at ``i=0``) of every queued
    chunk that covers step ``t``, plus Gaussian noise from the counter RNG.
    The network runs every step and ``torch.where`` decides whether its chunk is
    kept: one fixed graph, no data-dependent branch.
    """

    RING = "policy.obs_ring"
    RING_INDEX = "policy.ring_index"      # observations written so far == step t
    QUEUE = "policy.chunk_queue"
    QUEUE_STEP = "policy.chunk_step"      # step at which each slot's chunk was predicted
    QUEUE_INDEX = "policy.queue_index"    # chunks predicted so far
    RNG_SEED = RNG_SEED
    RNG_COUNTER = "policy.rng.counter"

    def __init__(self, cfg: ChunkedTransformerPolicyConfig = ChunkedTransformerPolicyConfig()) -> None:
        super().__init__()
        if cfg.replan_every < 1 or cfg.replan_every > cfg.chunk:
            raise InvalidArgument("replan_every must be in [1, chunk] so every step is covered")
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.obs_dim, cfg.act_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.embed = nn.Linear(cfg.obs_dim, cfg.d_model)
            self.age_embed = nn.Parameter(0.02 * torch.randn(cfg.history, cfg.d_model))
            self.blocks = nn.ModuleList(_Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
            self.norm = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.chunk * cfg.act_dim)

    def state_specs(self) -> list[BufferSpec]:
        c = self.cfg
        return [
            BufferSpec(self.RING, (c.history, c.obs_dim), torch.float32, group="policy", doc="observation ring"),
            BufferSpec(self.RING_INDEX, (), torch.int64, group="policy", doc="ring write index (= step)"),
            BufferSpec(self.QUEUE, (c.chunk_slots, c.chunk, c.act_dim), torch.float32, group="policy",
                       doc="queued action chunks"),
            BufferSpec(self.QUEUE_STEP, (c.chunk_slots,), torch.int64, group="policy",
                       doc="step each chunk was predicted at"),
            BufferSpec(self.QUEUE_INDEX, (), torch.int64, group="policy", doc="chunks predicted so far"),
            BufferSpec(self.RNG_SEED, (), torch.int64, group="rng", doc="noise seed"),
            BufferSpec(self.RNG_COUNTER, (), torch.int64, group="rng", doc="noise draws so far"),
        ]

    def init_state(self, arena: StateArena) -> None:
        arena[self.RNG_SEED].fill_(self.cfg.rng_seed)

    def predict_chunk(self, history: Tensor, valid: Tensor) -> Tensor:
        """History ``[T, obs]`` (oldest first) -> chunk ``[H, act]`` of bounded actions."""
        x = self.embed(history) + self.age_embed
        for block in self.blocks:
            x = block(x, valid)
        out = self.head(self.norm(x[-1]))
        return self.cfg.max_action * torch.tanh(out.view(self.cfg.chunk, self.act_dim))

    def step(self, obs: Tensor, arena: StateArena) -> Tensor:
        c = self.cfg
        ring, ring_index = arena[self.RING], arena[self.RING_INDEX]
        queue, queue_step, queue_index = arena[self.QUEUE], arena[self.QUEUE_STEP], arena[self.QUEUE_INDEX]
        dev = ring.device
        t = ring_index.clone()

        # 1. observation ring: write at t mod T, read oldest -> newest
        ring.index_copy_(0, (t % c.history).view(1), obs.to(ring.dtype).view(1, -1))
        ring_index.add_(1)
        abs_step = t - (c.history - 1) + torch.arange(c.history, device=dev)
        history = ring.index_select(0, abs_step % c.history)
        chunk = self.predict_chunk(history, abs_step >= 0)

        # 2. chunk queue: keep the new chunk only on re-planning steps
        due = (t % c.replan_every) == 0
        slot = (queue_index % c.chunk_slots).view(1)
        queue.index_copy_(0, slot, torch.where(due, chunk, queue.index_select(0, slot)[0]).unsqueeze(0))
        queue_step.index_copy_(0, slot, torch.where(due, t, queue_step.index_select(0, slot)[0]).view(1))
        queue_index.add_(due.to(torch.int64))

        # 3. temporal ensemble of every chunk that covers step t
        slots = torch.arange(c.chunk_slots, device=dev)
        age = t - queue_step
        covers = (slots < queue_index) & (age >= 0) & (age < c.chunk)
        picked = queue[slots, age.clamp(0, c.chunk - 1)]                  # [C, act]
        # oldest chunk has the largest age; i = (max_age - age) / k, shifted to stay <= 0
        w = torch.exp(-c.ensemble_decay * (c.chunk - 1 - age).to(picked.dtype) / c.replan_every)
        w = torch.where(covers, w, torch.zeros_like(w))
        mean = (w.unsqueeze(1) * picked).sum(0) / w.sum()

        # 4. stochastic sampling from the counter RNG
        seed, counter = arena[self.RNG_SEED], arena[self.RNG_COUNTER]
        noise = counter_normal(seed, counter, self.act_dim, mean.dtype)
        counter.add_(1)
        action = mean + c.noise_std * noise
        return action.clamp(-c.max_action, c.max_action)

    def planned_actions(self, arena: StateArena) -> Tensor:
        """The newest chunk's actions after the last step, ``[k, act]`` (a trajectory to publish).

        Host reads (call between steps, never in a captured step); without ensembling or noise.
        """
        chunks = int(arena[self.QUEUE_INDEX].item())
        if chunks == 0:
            return arena[self.QUEUE].new_zeros(0, self.act_dim)
        slot = (chunks - 1) % self.cfg.chunk_slots
        last_step = int(arena[self.RING_INDEX].item()) - 1
        start = last_step - int(arena[self.QUEUE_STEP][slot].item()) + 1
        return arena[self.QUEUE][slot, start:].clone()


# --- lookup by name (node parameter ``policy``) ----------------------------------

REFERENCE_POLICIES = {"gru": GRUPolicy, "transformer": ChunkedTransformerPolicy}


LEROBOT_PREFIX = "lerobot:"


def make_policy(spec: str, dtype: torch.dtype = torch.float32) -> PolicyModule:
    """``'gru'``, ``'transformer'``, ``'lerobot:<checkpoint dir>'`` (ACT, Diffusion Policy, SmolVLA, π0, π0.5), or
    ``'package.module:factory'`` (a callable returning a PolicyModule).

    ``dtype`` applies to LeRobot checkpoints (float32, bfloat16, float16); the others are float32.
    """
    if spec in REFERENCE_POLICIES:
        return REFERENCE_POLICIES[spec]()
    if spec.startswith(LEROBOT_PREFIX):
        from flashrt_ros.models.lerobot import load_lerobot_policy
        return load_lerobot_policy(spec[len(LEROBOT_PREFIX):], dtype=dtype)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"policy {spec!r}: use one of {sorted(REFERENCE_POLICIES)}, "
                              "'lerobot:<checkpoint dir>' or 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"policy {spec!r}: cannot import: {exc}") from exc
    policy = factory()
    if not isinstance(policy, PolicyModule):
        raise InvalidArgument(f"policy {spec!r} returned {type(policy).__name__}, not a PolicyModule")
    return policy
