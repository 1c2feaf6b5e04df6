"""A LeRobot GR00T N1.5 checkpoint as an arena-backed ``PolicyModule`` (``exact`` numerics, CPU first).

State (every buffer under ``policy.groot.`` and ``policy.rng.``):

* ``images`` (cameras x tokens per image, LLM width) and ``state`` (max_state_dim): the encoded observation of
  the last replan: SigLIP + ``mlp1`` tokens and the normalised, padded state; a re-instruct replans from them;
* ``prompt`` (capacity) and ``prompt_len``: the Eagle prompt's token ids for the current instruction (the chat
  template around the images and ``str([task])``), written between steps;
* ``queue`` (n_action_steps, action_dim) and ``queue_left``: the chunk's LAST n_action_steps rows, normalised
  (LeRobot's ``deque(maxlen=n_action_steps)`` keeps the last rows of the 16-row chunk);
* ``policy.rng.seed`` / ``policy.rng.plans``: replan p draws its noise from our counter stream
  (``ops.counter_rng.normal(seed, p)``), so a capsule restores the noise too.

A replan: the cameras through ``processor_groot.eagle_pixels`` and SigLIP + ``mlp1`` into ``images``, the
state into ``state``, the language model over the prompt with the image tokens written in, the action head's
four flow steps from the plan's noise; the queue refilled. The prompt's length is read on the host (``exact``
runs one unpadded prompt, as LeRobot does at batch 1: the DiT attends to every backbone token, so padding would
change the actions); a captured plan needs the ``fast`` numerics, not built yet, so CUDA is refused.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, jsonable
from flashrt_ros.models.lerobot.groot.action_head import FlowmatchingActionHead
from flashrt_ros.models.lerobot.groot.configuration_groot import GrootConfig, read_groot_config
from flashrt_ros.models.lerobot.groot.eagle import EagleBackbone
from flashrt_ros.models.lerobot.groot.processor_groot import (EaglePrompt, eagle_pixels, normalize_state,
                                                              unnormalize_action)
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.models.policy_interface import RNG_PLANS, RNG_SEED, ActionQueue, PolicyModule, pop_queue, queue_chunk
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
    QUEUE, LEFT = PREFIX + "queue", PREFIX + "queue_left"
    RNG_SEED, PLANS = RNG_SEED, RNG_PLANS
    numerics = "exact"

    def __init__(self, cfg: GrootConfig, stats: Mapping[str, Tensor], instruction: str = "") -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
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
        self.prompt_capacity = len(self.prompt.ids("", len(cfg.cameras))[0]) + INSTRUCTION_ROOM
        self.set_default_instruction(instruction)

    # --- contract ---------------------------------------------------------------------------------
    def input_features(self) -> dict[str, FeatureSpec]:
        out = {STATE: FeatureSpec((self.cfg.state_dim,), "state")}
        for cam in self.cfg.cameras:
            out[cam] = FeatureSpec(tuple(self.cfg.image_shape), "image")
        return out

    def config(self) -> dict:
        return {"type": "groot", "numerics": self.numerics, **jsonable({k: str(v) if isinstance(v, Path) else v
                                                                       for k, v in asdict(self.cfg).items()})}

    def use_numerics(self, numerics: str) -> None:
        """Only ``exact`` so far: GR00T's ``fast`` numerics (and with them CUDA graphs) are not built."""
        if numerics != "exact":
            raise InvalidArgument(f"GR00T: numerics {numerics!r} is not built yet; use exact (on the CPU)")

    def cast(self, dtype: torch.dtype) -> None:
        """float32 only so far (the parity-checked precision; LeRobot's bf16 autocast is not reproduced)."""
        if dtype != torch.float32:
            raise InvalidArgument(f"GR00T runs in float32 so far, not {dtype}")

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
            BufferSpec(self.PROMPT, (self.prompt_capacity,), torch.int64, group="instruction",
                       doc="the Eagle prompt's token ids for the instruction (right-padded)"),
            BufferSpec(self.PROMPT_LEN, (), torch.int64, group="instruction", doc="prompt length in tokens"),
            BufferSpec(self.QUEUE, (c.n_action_steps, c.max_action_dim), torch.float32, group="policy",
                       doc="action queue: the chunk's last n_action_steps rows (normalised)"),
            BufferSpec(self.LEFT, (), torch.int64, group="policy", doc="actions left in the queue"),
            BufferSpec(self.RNG_SEED, (), torch.int64, group="rng", doc="noise seed of this episode"),
            BufferSpec(self.PLANS, (), torch.int64, group="rng", doc="chunks planned (the noise counter)"),
        ]

    def init_state(self, arena: StateArena) -> None:
        self.write_instruction(arena, self._default_ids)

    def action_queue(self) -> ActionQueue:
        c = self.cfg
        return ActionQueue(self.LEFT, c.n_action_steps, pop_reads_observation=False)

    # --- instruction --------------------------------------------------------------------------------
    def set_default_instruction(self, text: str) -> None:
        self._default_ids = self.instruction_ids(text)
        self.default_instruction = text

    def instruction_ids(self, text: str) -> list[int]:
        """The whole prompt's ids: LeRobot's chat template around the cameras' image tokens and ``str([text])``
        (an empty instruction is LeRobot's ``"Perform the task."``)."""
        return self.prompt.ids(text, len(self.cfg.cameras))[0].tolist()

    def write_instruction(self, arena: StateArena, ids: list[int]) -> None:
        """Make ``ids`` (a whole prompt, ``instruction_ids``) the prompt and empty the queue (between steps)."""
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

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide=None, ahead=None) -> None:
        if guide is not None:
            raise InvalidArgument("GR00T: Real-Time Chunking is not supported yet")
        if arena[self.QUEUE].device.type == "cuda":
            raise InvalidArgument("GR00T runs exact numerics on the CPU only so far (its captured plan is not built)")
        eagle = self._groot_model.backbone.eagle_model
        frames = [observation[cam] for cam in self.cfg.cameras]
        arena[self.IMAGES].copy_(eagle.image_tokens(eagle_pixels(frames, eagle.sizes.image_size)).flatten(0, 1))
        state = normalize_state(observation[STATE], self.state_min, self.state_max, self.cfg.max_state_dim)
        arena[self.STATE_VEC].copy_(state.flatten())
        self._denoise(arena, arena[self.PLANS])
        arena[self.PLANS].add_(1)

    def _denoise(self, arena: StateArena, counter: Tensor) -> None:
        eagle, head = self._groot_model.backbone.eagle_model, self._groot_model.action_head
        length = int(arena[self.PROMPT_LEN].item())           # exact: one unpadded prompt (module doc)
        ids = arena[self.PROMPT][:length].unsqueeze(0)
        features = self._groot_model.backbone.eagle_linear(
            eagle.features(eagle.embed(ids, arena[self.IMAGES].unsqueeze(0))))
        s = head.sizes
        noise = normal(arena[self.RNG_SEED], counter, s.action_horizon * s.action_dim).view(1, s.action_horizon,
                                                                                         s.action_dim)
        chunk = head.sample(features, arena[self.STATE_VEC].view(1, 1, -1),
                            torch.tensor([self.cfg.embodiment_id], device=features.device), noise)
        queue_chunk(chunk[0, s.action_horizon - self.cfg.n_action_steps:], arena[self.QUEUE], arena[self.LEFT])

    def planned_actions(self, arena: StateArena) -> Tensor:
        n = self.cfg.n_action_steps
        left = max(0, min(n, int(arena[self.LEFT].item())))
        return unnormalize_action(arena[self.QUEUE][n - left:], self.action_min, self.action_max)


def build_groot(ckpt: LeRobotCheckpoint, instruction: str = "") -> GrootPolicy:
    """Our GR00T for a checkpoint (weights not yet loaded); the min-max statistics from its pack step."""
    stats = {f"{feature}.{stat}": t for feature, d in ckpt.normalize.stats.items() for stat, t in d.items()}
    return GrootPolicy(read_groot_config(ckpt), stats, instruction)
