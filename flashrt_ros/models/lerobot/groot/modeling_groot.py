"""A LeRobot GR00T N1.5 checkpoint as an arena-backed ``PolicyModule`` (``exact`` on the CPU, ``fast`` anywhere).

State (every buffer under ``policy.groot.`` and ``policy.rng.``):

* ``images`` (cameras x tokens per image, LLM width) and ``state`` (max_state_dim): the encoded observation of
  the last replan: SigLIP + ``mlp1`` tokens and the normalised, padded state; a re-instruct replans from them;
* ``prompt`` (capacity) and ``prompt_len``: the Eagle prompt's token ids for the current instruction (the chat
  template around the images and ``str([task])``), written between steps;
* ``features`` (capacity, backbone width) and ``features_len`` (group ``prefix``): the backbone's output the
  action head reads (the language model over the prompt with the image tokens written in, then ``eagle_linear``),
  valid rows first, zero after; ``features_len`` is 0 until a replan stored them. A redraw draws a new chunk from
  them without any of the backbone; a new instruction leaves them as they are (its next replan recomputes them);
* ``queue`` (n_action_steps, action_dim) and ``queue_left``: the chunk's LAST n_action_steps rows, normalised
  (LeRobot's ``deque(maxlen=n_action_steps)`` keeps the last rows of the 16-row chunk);
* ``policy.rng.seed`` / ``policy.rng.plans``: replan p draws its noise from our counter stream
  (``ops.counter_rng.normal(seed, p)``), so a capsule restores the noise too.

A replan: the cameras through ``processor_groot.eagle_pixels`` and SigLIP + ``mlp1`` into ``images``, the
state into ``state``, the language model over the prompt with the image tokens written in into ``features``
(``_encode_prompt``), the action head's four flow steps from the plan's noise over them (``_denoise``); the
queue refilled. The engine's capsule verbs come from that split: ``redraw`` runs only the action head, and
``replan_from_context`` (``engine.vla.reinstruct``) the language model and the action head, not SigLIP: the
LLM attends over the image tokens and the instruction together, so a new instruction needs it again.

Numerics (``use_numerics``, once, at load):

* ``exact`` reads the prompt's and the features' lengths on the host and runs one unpadded prompt, as LeRobot
  does at batch 1: the DiT attends to every backbone token, so padding would change the actions. Bit-identical
  to LeRobot on the CPU; CUDA is refused (a host read cannot be captured, and parity is measured on the CPU);
* ``fast`` runs the same function with every shape fixed by the prompt buffer's capacity and no host read, so a
  replan, a redraw and a replan from context can be captured as CUDA graphs. The language model runs over all
  ``prompt_capacity`` rows (right-padded with id 0): its causal attention keeps the padding out of the prompt's
  rows. The features' length is copied on the device from the prompt's and the rows past it are zeroed by a
  device mask (the capsule holds what ``exact``'s does). The action head then takes all rows with a key mask made
  on the device from ``features_len``: the VL self-attention's keys and every DiT cross-attention block's keys
  are the prompt's rows only, which is why the padding does not move the actions (without the mask it would);
  the rows past ``features_len`` are computed over but weigh exactly 0, so what a restore leaves there (a
  capsule copies the live rows only) changes no bit.
  The flow's time tables and the language model's RoPE table are made once per device and kept (pure functions
  of the weights, which are loaded before the first plan). What may differ from ``exact`` is the rounding of
  products over more rows and of masked attention: equal within float32 rounding, not promised bit-identical
  (``test_groot_fast.py`` declares the bound; on its CPU the episode measured bit-identical).

Precision (``cast``): float32, or bfloat16 as LeRobot's ``use_bf16`` runs it: the weights stay float32 and every
plan (a replan, a redraw, a replan from context) runs under ``torch.autocast(bfloat16)``, with the camera pixels
and the normalised state rounded to bf16 first (``GR00TN15.prepare_input``). So the products run in bf16 and the
norms, the RoPE tables and the Euler sum in float32, where LeRobot runs them: bit-identical to LeRobot's bf16 on
the CPU (``test_groot_bf16.py``). The arena buffers keep their float32 dtype (every bf16 value fits), and the
capsule fingerprint names the precision.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, jsonable
from flashrt_ros.models.lerobot.groot.action_head import FlowmatchingActionHead, TimeTables
from flashrt_ros.models.lerobot.groot.configuration_groot import GrootConfig, read_groot_config
from flashrt_ros.models.lerobot.groot.eagle import EagleBackbone
from flashrt_ros.models.lerobot.groot.processor_groot import (EaglePrompt, eagle_pixels, normalize_state,
                                                              unnormalize_action)
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.models.policy_interface import (RNG_PLANS, RNG_SEED, ActionQueue, Guidance, PolicyModule, pop_queue,
                                                 queue_chunk)
from flashrt_ros.models.rtc import guided_rising_velocity, leftover_target
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument

SIGLIP_HEAD = "_groot_model.backbone.eagle_model.vision_model.vision_model.head."
#: room for the instruction beyond the prompt with an empty one (token ids)
INSTRUCTION_ROOM = 96


class GrootModel(nn.Module):
    """``_groot_model``: LeRobot's ``GR00TN15`` names (``backbone``, ``action_head``)."""

    def __init__(self, cfg: GrootConfig) -> None:
        super().__init__()
        self.backbone = EagleBackbone(cfg.eagle_sizes(), cfg.project_to_dim)
        self.action_head = FlowmatchingActionHead(cfg.head_sizes())


class GrootPolicy(PolicyModule):
    """A LeRobot GR00T N1.5 checkpoint as a ``PolicyModule`` (see the module doc for its state)."""

    PREFIX = "policy.groot."
    supports_guidance = True     # Real-Time Chunking (``_guidance``); LeRobot's GR00T has none (docs/policies.md)
    #: weights LeRobot saves that GR00T never reads: SigLIP's pooling head and the LLM's vocabulary head
    OPTIONAL_WEIGHTS = tuple(SIGLIP_HEAD + k for k in (
        "probe", "attention.in_proj_weight", "attention.in_proj_bias", "attention.out_proj.weight",
        "attention.out_proj.bias", "layernorm.weight", "layernorm.bias", "mlp.fc1.weight", "mlp.fc1.bias",
        "mlp.fc2.weight", "mlp.fc2.bias")) + ("_groot_model.backbone.eagle_model.language_model.lm_head.weight",)
    #: Qwen3 ties its embedding to its head: safetensors keeps only ``lm_head``
    TIED_WEIGHTS = {"_groot_model.backbone.eagle_model.language_model.model.embed_tokens.weight":
                    "_groot_model.backbone.eagle_model.language_model.lm_head.weight"}
    IMAGES, STATE_VEC = PREFIX + "images", PREFIX + "state"
    PROMPT, PROMPT_LEN = PREFIX + "prompt", PREFIX + "prompt_len"
    FEATURES, FEATURES_LEN = PREFIX + "features", PREFIX + "features_len"
    QUEUE, LEFT = PREFIX + "queue", PREFIX + "queue_left"
    RNG_SEED, PLANS = RNG_SEED, RNG_PLANS
    #: ``exact`` (LeRobot's bits on the CPU) or ``fast`` (fixed shapes, no host read; module doc)
    numerics = "exact"

    def __init__(self, cfg: GrootConfig, stats: Mapping[str, Tensor], instruction: str = "") -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
        self.compute_dtype = torch.float32              # ``cast``: bfloat16 runs the plans under LeRobot's autocast
        self._groot_model = GrootModel(cfg)
        self.prompt = EaglePrompt(cfg.assets_dir, cfg.tokens_per_image)
        for name in ("observation.state.min", "observation.state.max", "action.min", "action.max"):
            if name not in stats:
                raise InvalidArgument(f"GR00T checkpoint: its preprocessor's pack step has no {name!r} statistic "
                                      f"(min-max normalisation)")
        self.register_buffer("state_min", stats["observation.state.min"].float().flatten(), persistent=False)
        self.register_buffer("state_max", stats["observation.state.max"].float().flatten(), persistent=False)
        self.register_buffer("action_min", stats["action.min"].float().flatten(), persistent=False)
        self.register_buffer("action_max", stats["action.max"].float().flatten(), persistent=False)
        # the embodiment id on the policy's device (a device tensor made per plan would be a host-to-device copy)
        self.register_buffer("embodiment", torch.tensor([cfg.embodiment_id], dtype=torch.int64), persistent=False)
        #: fast: per device, what a plan's fixed shapes fix (the flow's time tables, the LLM's RoPE table)
        self._fixed: dict[torch.device, tuple[TimeTables, tuple[Tensor, Tensor]]] = {}
        self.prompt_capacity = len(self.prompt.ids("", len(cfg.cameras))[0]) + INSTRUCTION_ROOM
        self.set_default_instruction(instruction)

    # --- contract ---------------------------------------------------------------------------------
    def input_features(self) -> dict[str, FeatureSpec]:
        out = {STATE: FeatureSpec((self.cfg.state_dim,), "state")}
        for cam in self.cfg.cameras:
            out[cam] = FeatureSpec(tuple(self.cfg.image_shape), "image")
        return out

    def config(self) -> dict:
        sizes = jsonable({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.cfg).items()})
        return {"type": "groot", "numerics": self.numerics, "compute_dtype": str(self.compute_dtype), **sizes}

    def use_numerics(self, numerics: str) -> None:
        """``exact`` or ``fast`` (module doc), chosen once, at load: ``exact`` -> ``fast``, not back (the capsule
        fingerprint names the numerics, ``config``)."""
        if numerics == self.numerics:
            return
        if numerics != "fast" or self.numerics != "exact":
            raise InvalidArgument(f"GR00T: numerics {numerics!r} after {self.numerics!r}: exact or fast, chosen "
                                  f"once, at load")
        self.numerics = numerics

    def cast(self, dtype: torch.dtype) -> None:
        """float32, or bfloat16 as LeRobot's ``use_bf16`` (module doc: float32 weights, plans under bf16
        autocast), in both numerics; chosen at load (the capsule fingerprint names it)."""
        if dtype not in (torch.float32, torch.bfloat16):
            raise InvalidArgument(f"GR00T runs in float32 or bfloat16 (LeRobot's use_bf16 autocast), not {dtype}")
        self.compute_dtype = dtype

    def _compute(self, device: torch.device):
        """The plan's precision context: LeRobot's bf16 autocast, or nothing for float32."""
        if self.compute_dtype != torch.bfloat16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def _rounded(self, x: Tensor) -> Tensor:
        """An input as ``GR00TN15.prepare_input`` hands it on: rounded to bf16 under ``use_bf16``."""
        return x.to(torch.bfloat16) if self.compute_dtype == torch.bfloat16 else x

    @property
    def dtype(self) -> torch.dtype:
        """The language model's dtype (the image tokens are kept in it)."""
        return self._groot_model.backbone.eagle_model.language_model.model.embed_tokens.weight.dtype

    def state_specs(self) -> list[BufferSpec]:
        c, sizes = self.cfg, self.cfg.eagle_sizes()
        rows = len(c.cameras) * c.tokens_per_image
        return [
            BufferSpec(self.IMAGES, (rows, sizes.text.width), self.dtype, group="observation",
                       doc="image tokens of the last replan (SigLIP + mlp1), cameras in sorted order"),
            BufferSpec(self.STATE_VEC, (c.max_state_dim,), torch.float32, group="observation",
                       doc="min-max normalised, zero-padded state of the last replan"),
            BufferSpec(self.FEATURES, (self.prompt_capacity, self.backbone_width), self.dtype, group="prefix",
                       live_axis=0, length_from=self.FEATURES_LEN,
                       doc="backbone output of the last replan's prompt (language model + eagle_linear)"),
            BufferSpec(self.FEATURES_LEN, (), torch.int64, group="prefix",
                       doc="valid backbone feature rows (the prompt's length; 0 before a replan)"),
            BufferSpec(self.PROMPT, (self.prompt_capacity,), torch.int64, group="instruction",
                       doc="the Eagle prompt's token ids for the instruction (right-padded)"),
            BufferSpec(self.PROMPT_LEN, (), torch.int64, group="instruction", doc="prompt length in tokens"),
            BufferSpec(self.QUEUE, (c.n_action_steps, c.max_action_dim), torch.float32, group="policy",
                       doc="action queue: the chunk's last n_action_steps rows (normalised)"),
            BufferSpec(self.LEFT, (), torch.int64, group="policy", doc="actions left in the queue"),
            BufferSpec(self.RNG_SEED, (), torch.int64, group="rng", doc="noise seed of this episode"),
            BufferSpec(self.PLANS, (), torch.int64, group="rng", doc="chunks planned (the noise counter)"),
        ]

    @property
    def backbone_width(self) -> int:
        """Width of the backbone's output (``eagle_linear``: Identity when ``project_to_dim`` is None)."""
        return self.cfg.text.width if self.cfg.project_to_dim is None else self.cfg.project_to_dim

    def init_state(self, arena: StateArena) -> None:
        self.write_instruction(arena, self._default_ids)

    def action_queue(self) -> ActionQueue:
        """Replan-or-pop on the host; a pop reads no observation; the stored features can be redrawn from and
        the stored observation re-planned from; a plan (beside the loop too: ``replan: async``) writes the
        encoded observation, the features, their length, the queue and the noise counter.

        ``ahead`` stays 0: the queue holds the chunk's LAST n_action_steps rows (LeRobot's bounded deque), so
        no action follows the queued ones and a plan merged ``d`` steps late keeps ``n_action_steps - d``
        (``chunk_size``: the queued rows, which RTC's prefix weights cover: ``_guidance``)."""
        c = self.cfg
        return ActionQueue(self.LEFT, c.n_action_steps, pop_reads_observation=False,
                           redraw_context=self.FEATURES_LEN, replans_from_context=True, chunk=self.QUEUE,
                           planned=(self.IMAGES, self.STATE_VEC, self.FEATURES, self.FEATURES_LEN, self.PLANS),
                           chunk_size=c.n_action_steps)

    # --- instruction --------------------------------------------------------------------------------
    def set_default_instruction(self, text: str) -> None:
        self._default_ids = self.instruction_ids(text)
        self.default_instruction = text

    def instruction_ids(self, text: str) -> list[int]:
        """The whole prompt's ids: LeRobot's chat template around the cameras' image tokens and ``str([text])``
        (an empty instruction is LeRobot's ``"Perform the task."``)."""
        return self.prompt.ids(text, len(self.cfg.cameras))[0].tolist()

    def write_instruction(self, arena: StateArena, ids: list[int]) -> None:
        """Make ``ids`` (a whole prompt, ``instruction_ids``) the prompt and empty the queue (between steps).
        ``features`` stay those of the last replan: the next replan, or ``replan_from_context``, recomputes them."""
        n, images = self.prompt_capacity, ids.count(self.cfg.image_token_id)
        if len(ids) > n:
            raise InvalidArgument(f"GR00T prompt of {len(ids)} tokens: room for {n} (an instruction of at most "
                                  f"about {INSTRUCTION_ROOM} tokens)")
        if images != len(self.cfg.cameras) * self.cfg.tokens_per_image:
            raise InvalidArgument(f"GR00T prompt with {images} image tokens, the cameras need "
                                  f"{len(self.cfg.cameras) * self.cfg.tokens_per_image}")
        tokens = torch.zeros(n, dtype=torch.int64)
        tokens[:len(ids)] = torch.tensor(ids, dtype=torch.int64)
        arena[self.PROMPT].copy_(tokens)
        arena[self.PROMPT_LEN].fill_(len(ids))
        arena[self.LEFT].zero_()

    # --- steps ----------------------------------------------------------------------------------------
    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        if replan is None:
            raise InvalidArgument("GR00T: the caller decides replan (see action_queue)")
        if replan:
            self.plan(observation, arena)
        action = pop_queue(arena[self.QUEUE], arena[self.LEFT])
        return unnormalize_action(action, self.action_min, self.action_max)

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: Guidance | None = None,
             ahead: Tensor | None = None) -> None:
        """Encode the observation, the prompt over it, and denoise a chunk with the next noise draw (``ahead``:
        nothing, ``action_queue`` says why)."""
        if self.numerics == "exact" and arena[self.QUEUE].device.type == "cuda":
            raise InvalidArgument("GR00T's exact numerics run on the CPU only (they read lengths on the host); "
                                  "use numerics fast on CUDA")
        eagle = self._groot_model.backbone.eagle_model
        frames = [observation[cam] for cam in self.cfg.cameras]
        pixels = self._rounded(eagle_pixels(frames, eagle.sizes.image_size))   # the preprocessor: no autocast
        state = normalize_state(observation[STATE], self.state_min, self.state_max, self.cfg.max_state_dim)
        arena[self.STATE_VEC].copy_(state.flatten())
        with self._compute(arena[self.IMAGES].device):
            arena[self.IMAGES].copy_(eagle.image_tokens(pixels).flatten(0, 1))
            self._encode_prompt(arena)
            self._denoise(arena, arena[self.PLANS], guide)
        arena[self.PLANS].add_(1)

    def redraw_chunk(self, arena: StateArena) -> None:
        """The noise stream's first chunk over the stored features (``PolicyEngine.redraw``; only the action head)."""
        arena[self.PLANS].zero_()
        with self._compute(arena[self.PLANS].device):
            self._denoise(arena, arena[self.PLANS])
        arena[self.PLANS].add_(1)

    def replan_from_context(self, arena: StateArena) -> None:
        """The last chunk planned again from the stored image tokens and state with the current prompt and the
        same noise draw (``PolicyEngine.replan_from_context``): the language model and the action head run,
        SigLIP does not. Equal to the plan a replanning step with this instruction made."""
        with self._compute(arena[self.PLANS].device):
            self._encode_prompt(arena)
            self._denoise(arena, (arena[self.PLANS] - 1).clamp(min=0))

    def _encode_prompt(self, arena: StateArena) -> None:
        """The language model over the prompt with the stored image tokens written in, through ``eagle_linear``,
        into ``features`` (rows past the prompt zeroed) and its length into ``features_len``."""
        if self.numerics == "fast":
            return self._encode_fixed(arena)
        eagle = self._groot_model.backbone.eagle_model
        length = int(arena[self.PROMPT_LEN].item())           # exact: one unpadded prompt (module doc)
        ids = arena[self.PROMPT][:length].unsqueeze(0)
        features = self._groot_model.backbone.eagle_linear(
            eagle.features(eagle.embed(ids, arena[self.IMAGES].unsqueeze(0))))
        arena[self.FEATURES][:length].copy_(features[0])
        arena[self.FEATURES][length:].zero_()
        arena[self.FEATURES_LEN].fill_(length)

    def _encode_fixed(self, arena: StateArena) -> None:
        """``fast``'s ``_encode_prompt``: the language model over every row of the prompt buffer (causal: the
        padding after the prompt reaches none of its rows), the length copied and the rows past it zeroed on
        the device."""
        eagle = self._groot_model.backbone.eagle_model
        ids = arena[self.PROMPT].unsqueeze(0)
        _tables, rope_table = self._fixed_tables(ids.device)
        features = self._groot_model.backbone.eagle_linear(
            eagle.features(eagle.embed_fixed(ids, arena[self.IMAGES].unsqueeze(0)), rope_table))[0]
        valid = torch.arange(self.prompt_capacity, device=ids.device) < arena[self.PROMPT_LEN]
        arena[self.FEATURES].copy_(torch.where(valid.unsqueeze(1), features, features.new_zeros(())))
        arena[self.FEATURES_LEN].copy_(arena[self.PROMPT_LEN])

    def _fixed_tables(self, device: torch.device) -> tuple[TimeTables, tuple[Tensor, Tensor]]:
        """``fast``: the action head's time tables (batch 1) and the language model's RoPE table of the prompt
        buffer's positions, made on first use on ``device`` and kept (pure functions of the weights)."""
        if device not in self._fixed:
            eagle = self._groot_model.backbone.eagle_model
            with torch.no_grad():
                self._fixed[device] = (self._groot_model.action_head.time_tables(1),
                                       eagle.rope_table(self.prompt_capacity, device, self.dtype))
        return self._fixed[device]

    def key_mask(self, arena: StateArena) -> Tensor:
        """``fast``: (1, 1, 1, prompt_capacity), True at the stored features' valid rows (``features_len``), made
        on the device. At least row 0: a redraw before any replan, or a graph's warm-up on the cold state, has no
        valid row, and what SDPA makes of a query with every key masked depends on its backend (zeros or NaN);
        with row 0 kept it draws from one zero feature row, ``exact``'s function over ``features[:1]``."""
        rows = torch.arange(self.prompt_capacity, device=arena[self.FEATURES_LEN].device)
        return (rows < arena[self.FEATURES_LEN].clamp(min=1)).view(1, 1, 1, -1)

    def _denoise(self, arena: StateArena, counter: Tensor, guide: Guidance | None = None) -> None:
        """The action head's flow steps from plan ``counter``'s noise over the stored features, state and
        embodiment (each guided toward the old chunk's leftover: ``guide``, Real-Time Chunking); the chunk's
        last n_action_steps rows into the queue."""
        head = self._groot_model.action_head
        tables, key_mask = None, None
        if self.numerics == "fast":                            # every row, the padding masked (module doc)
            features = arena[self.FEATURES].unsqueeze(0)
            tables, _rope = self._fixed_tables(features.device)
            key_mask = self.key_mask(arena)
        else:
            length = int(arena[self.FEATURES_LEN].item())     # exact: the unpadded rows (module doc)
            features = arena[self.FEATURES][:length].unsqueeze(0)
        s = head.sizes
        noise = normal(arena[self.RNG_SEED], counter, s.action_horizon * s.action_dim).view(1, s.action_horizon,
                                                                                         s.action_dim)
        state = self._rounded(arena[self.STATE_VEC].view(1, 1, -1))
        correct = None if guide is None else self._guidance(guide, s.action_horizon, s.action_dim)
        chunk = head.sample(features, state, self.embodiment, noise, tables, key_mask, correct)
        queue_chunk(chunk[0, s.action_horizon - self.cfg.n_action_steps:], arena[self.QUEUE], arena[self.LEFT])

    def _guidance(self, guide: Guidance, horizon: int, width: int) -> Callable[[Tensor, float, Tensor], Tensor]:
        """Real-Time Chunking's velocity correction for the action head (``guided_rising_velocity``: GR00T's
        flow rises from noise at t = 0). The queue holds the chunk's last n_action_steps rows, so the leftover
        and the prefix weights are laid on those rows; the rows before them never run and are not guided. The
        leftover's padding columns (past the robot's action_dim) are not guided either: LeRobot's RTC queue
        keeps only the robot's dims, and its ``RTCProcessor`` pads them with zeros."""
        n = self.cfg.n_action_steps
        skip = horizon - n
        target = leftover_target(guide.actions[:, :self.cfg.action_dim], guide.left, n, width)
        target = F.pad(target, (0, 0, skip, 0))
        weights = F.pad(guide.weights[:n], (skip, 0))
        return lambda x, t, v: guided_rising_velocity(x, t, v, target, weights, guide.max_weight)

    def planned_actions(self, arena: StateArena) -> Tensor:
        n = self.cfg.n_action_steps
        left = max(0, min(n, int(arena[self.LEFT].item())))
        return unnormalize_action(arena[self.QUEUE][n - left:], self.action_min, self.action_max)


def build_groot(ckpt: LeRobotCheckpoint, instruction: str = "") -> GrootPolicy:
    """Our GR00T for a checkpoint (weights not yet loaded); the min-max statistics from its pack step."""
    stats = {f"{feature}.{stat}": t for feature, d in ckpt.normalize.stats.items() for stat, t in d.items()}
    return GrootPolicy(read_groot_config(ckpt), stats, instruction)
