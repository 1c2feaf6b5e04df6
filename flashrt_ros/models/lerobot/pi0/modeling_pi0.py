"""π0 and π0.5 (LeRobot 0.4.x) as arena-backed ``PolicyModule``s: encoded observation, prefix KV, queue, noise, instruction.

Why: LeRobot keeps a π episode in Python (a ``deque`` of actions, the prefix
``past_key_values`` rebuilt per chunk, noise from torch's global RNG), so nothing
of it can be captured or brought back. Here every bit that shapes the next
action is an arena buffer, updated in place by device ops only:

- ``policy.pi0.images``: the image tokens of the last replan (SigLIP + projector
  output, ``(cameras x tokens, width)``) and ``policy.pi0.state``: its normalised,
  padded state (group ``observation``). A re-instruction re-runs the language
  model over them with another instruction: the images are not encoded again;
- ``policy.pi0.kv.{k,v}.<layer>``: the language model's prefix keys (RoPE'd) and
  values, ``(P, kv_heads, head_dim)``: the image tokens, then the instruction's
  tokens (π0.5: the prompt with the state tokens), valid rows first; the live
  extent is ``policy.pi0.prefix_len`` (group ``kv``);
- ``policy.pi0.lang_tokens`` / ``lang_len``: the instruction (π0: its tokens
  with the newline; π0.5: the ``"Task: ..., State:"`` head of the prompt);
- ``policy.pi0.queue`` / ``queue_left``: the chunk being executed (normalised);
- ``policy.rng.seed`` / ``policy.rng.plans``: the flow-matching noise stream
  (plan ``p`` draws its ``(chunk_size, max_action_dim)`` noise with counter ``p``).

A replanning step encodes the cameras, stores the state, prefills the prefix KV
(``prefill_from_context``) and runs ``num_inference_steps`` Euler steps of the
expert over it (``denoise``); a pop only takes the next queued action. The
prefix is bidirectional (every image token attends to the instruction in
every layer, as in PaliGemma), so a new instruction needs the whole language
model again; what it can skip is the vision tower: ``replan_from_context``
(the engine's ``replan_from_context``, ``engine.vla.reinstruct``) re-plans the
last chunk from the stored image tokens and state with the current
instruction, bit-identically to a cold replan of that observation.

Beside the control loop (the engine's ``replan: async | rtc``) ``plan`` runs on
a copy of the arena and writes the buffers ``action_queue().planned`` names;
with ``rtc`` its Euler steps are guided toward the leftover of the chunk being
executed (Real-Time Chunking, ``models.rtc``), as LeRobot's ``sample_actions``
with ``rtc_config`` enabled.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, feature_specs, jsonable
from flashrt_ros.models.lerobot.flow_time import flow_time_embeddings
from flashrt_ros.models.lerobot.instruction import LanguageInstruction, PrefixedName
from flashrt_ros.models.lerobot.normalize import PolicyNormalization
from flashrt_ros.models.lerobot.precision import cast_keeping_float32
from flashrt_ros.models.lerobot.pi0.configuration_pi0 import PALIGEMMA_TOKENIZER, PI0Config
from flashrt_ros.models.lerobot.pi0.gemma import gqa_attention
from flashrt_ros.models.lerobot.pi0.pi0_net import PiModel
from flashrt_ros.models.lerobot.pi0.processor_pi05 import StatePrompt
from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings, tokenizer_file, tokenizer_settings
from flashrt_ros.models.policy_interface import ActionQueue, Guidance, PolicyModule, pop_queue, queue_chunk
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.models.rtc import integrate_flow
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.ops.rope import rope_inv_freq
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


def resize_with_pad(img: Tensor, height: int, width: int) -> Tensor:
    """LeRobot's ``resize_with_pad_torch`` on ``(1, 3, H, W)`` images in [0, 1]: bilinear, aspect kept,
    clamped to [-1, 1], centred, padded with -1 (which the [-1, 1] rescale then turns into -3, as LeRobot's)."""
    h, w = img.shape[2:]
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    img = F.interpolate(img.contiguous(memory_format=torch.channels_last), size=(rh, rw), mode="bilinear",
                        align_corners=False).clamp(-1.0, 1.0)
    top, left = (height - rh) // 2, (width - rw) // 2
    return F.pad(img, (left, width - rw - left, top, height - rh - top), value=-1.0)


class PI0Policy(LanguageInstruction, PolicyModule):
    """A LeRobot π0 or π0.5 checkpoint as a ``PolicyModule`` (see the module doc for its state)."""

    PREFIX = "policy.pi0."            # the buffer names (``KEY``, ``QUEUE``, ...): ``LanguageInstruction``
    IMAGES = PrefixedName("images")
    STATE_VEC = PrefixedName("state")
    #: checkpoint weights inference never reads (the two language heads); accepted when present
    OPTIONAL_WEIGHTS = ("model.paligemma_with_expert.paligemma.lm_head.weight",
                        "model.paligemma_with_expert.gemma_expert.lm_head.weight")
    #: PaliGemma ties its head to the embeddings: safetensors may keep only ``lm_head``
    TIED_WEIGHTS = {"model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight":
                    "model.paligemma_with_expert.paligemma.lm_head.weight"}

    def __init__(self, cfg: PI0Config, ckpt: LeRobotCheckpoint | None = None,
                 tokenizer: TokenizerSettings = TokenizerSettings(PALIGEMMA_TOKENIZER),
                 tokenizer_file: Path | None = None, instruction: str = "") -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
        self.tokenizer_settings, self.tokenizer_file = tokenizer, tokenizer_file
        self.model = PiModel(cfg.vision, cfg.image_resolution[0], cfg.vlm, cfg.expert, pi05=cfg.pi05,
                             max_state_dim=cfg.max_state_dim, max_action_dim=cfg.max_action_dim)
        self.norm = PolicyNormalization(ckpt)
        self.prompt = StatePrompt(self.tokenizer(), cfg.tokenizer_max_length, cfg.state_width) if cfg.pi05 else None
        self.register_buffer("time_embeddings", flow_time_embeddings(cfg.num_inference_steps, cfg.expert.width,
                                                                     cfg.min_period, cfg.max_period), persistent=False)
        # the expert's own attention: π0's state token (block 1) sees itself, the actions (block 2) see
        # the state and each other; π0.5's actions see each other
        blocks = torch.tensor(([] if cfg.pi05 else [1]) + [2] * cfg.chunk_size)
        self.register_buffer("suffix_mask", blocks[None, :] <= blocks[:, None], persistent=False)
        self.set_default_instruction(instruction)

    # --- contract ---------------------------------------------------------------------------
    def input_features(self) -> dict[str, FeatureSpec]:
        return feature_specs(self.cfg)

    def config(self) -> dict:
        return {"type": "pi05" if self.cfg.pi05 else "pi0", "numerics": self.numerics, **jsonable(asdict(self.cfg))}

    #: ``exact``: LeRobot's arithmetic (bit-identical on CPU); ``fast``: the same plan in fused kernels
    #: (``pi0_fast``); ``fp8``: ``fast`` on float8 weights; chosen once by ``use_numerics`` after the weights are
    #: loaded and cast
    numerics = "exact"

    def use_numerics(self, numerics: str) -> None:
        """Switch to ``fast``, or ``fp8`` (``fast`` with the language model's and the expert's products on float8
        weights); irreversible: the fused weights replace the unfused ones."""
        if numerics == self.numerics:
            return
        if numerics not in ("fast", "fp8") or self.numerics != "exact":
            raise InvalidArgument(f"π0: numerics {numerics!r} after {self.numerics!r}: choose it once, at load")
        from flashrt_ros.models.lerobot.pi0.pi0_fast import FastPi
        self.fast = FastPi(self, fp8=numerics == "fp8")
        self.numerics = numerics

    #: ``numerics: fp8`` is available (``factory.load_lerobot_policy`` refuses it for other policies)
    has_fp8 = True

    @property
    def fused(self) -> bool:
        """The plan runs ``pi0_fast`` (``fast`` or ``fp8`` numerics)."""
        return self.numerics != "exact"

    @property
    def dtype(self) -> torch.dtype:
        """The language model's dtype (the prefix KV and image tokens are kept in it)."""
        return self.model.language_model.embed_tokens.weight.dtype

    def cast(self, dtype: torch.dtype) -> None:
        """The networks in ``dtype`` (``cast_networks``), keeping in float32, with the checkpoint's exact values,
        what LeRobot keeps in float32 in bf16 mode (norms, patch and position embeddings, the projections around
        the expert: ``precision.cast_keeping_float32``, no round trip through bf16); the RoPE
        frequencies, time embeddings and normalisation statistics are not cast at all."""
        if dtype not in (torch.float32, torch.bfloat16):
            raise InvalidArgument(f"π0 runs in float32 or bfloat16, not {dtype}")
        keep = ("patch_embedding", "position_embedding", "input_layernorm", "post_attention_layernorm",
                "model.norm", "action_in_proj", "action_out_proj", "state_proj", "time_mlp")
        cast_keeping_float32(self.model, dtype, [module for name, module in self.model.named_modules()
                                                 if any(k in name for k in keep)
                                                 and next(module.children(), None) is None])
        for stack in (self.model.language_model, self.model.expert):
            stack.inv_freq = rope_inv_freq(self.cfg.vlm.head_dim, self.cfg.vlm.rope_theta).to(stack.inv_freq.device)

    def state_specs(self) -> list[BufferSpec]:
        c = self.cfg
        kv_shape = (c.prefix_capacity, c.vlm.num_kv_heads, c.vlm.head_dim)
        return self.prefix_specs(c.vlm.depth, kv_shape, "language model") + [
            BufferSpec(self.IMAGES, (c.image_rows, c.vlm.width), self.dtype, group="observation",
                       doc="image tokens of the last replan (vision tower + projector)"),
            BufferSpec(self.STATE_VEC, (c.state_width,), torch.float32, group="observation",
                       doc="normalised, zero-padded state of the last replan"),
        ] + self.episode_specs("instruction token ids, right-padded (π0.5: the prompt's head)")

    # --- instruction (``LanguageInstruction``) -------------------------------------------------
    def instruction_ids(self, text: str) -> list[int]:
        """π0: the instruction's tokens with a newline (LeRobot's ``Pi0NewLineProcessor``); π0.5: the
        prompt's ``"Task: ..., State:"`` head, checked to join with the state tokens (``StatePrompt``)."""
        if self.prompt is None:
            return super().instruction_ids(text)
        return self.prompt.head_ids(text)

    # --- steps ------------------------------------------------------------------------------------
    def action_queue(self) -> ActionQueue:
        """Replan-or-pop on the host; a pop reads no observation; the stored prefix can be redrawn from and
        the stored observation re-planned from; a plan (beside the loop too) writes the encoded observation,
        the prefix KV, its length, the queue and the noise counter."""
        c = self.cfg
        kv = tuple(f"{name}{i}" for i in range(c.vlm.depth) for name in (self.KEY, self.VALUE))
        return ActionQueue(self.LEFT, c.n_action_steps, pop_reads_observation=False,
                           redraw_context=self.PREFIX_LEN, replans_from_context=True, chunk=self.QUEUE,
                           planned=(self.IMAGES, self.STATE_VEC, *kv, self.PREFIX_LEN, self.PLANS),
                           chunk_size=c.chunk_size, ahead=c.chunk_size - c.n_action_steps)

    #: Real-Time Chunking: ``plan`` takes a ``Guidance`` (``flashrt_ros.models.rtc``).
    supports_guidance = True

    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        """``replan`` (the engine's choice): plan a chunk, then pop; else only pop (no network)."""
        if replan is None:
            raise InvalidArgument("π0: the caller decides replan (see action_queue)")
        if replan:
            self.plan(observation, arena)
        return self.norm.action(pop_queue(arena[self.QUEUE], arena[self.LEFT]))

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: Guidance | None = None,
             ahead: Tensor | None = None) -> None:
        """Encode the observation, prefill the prefix KV, denoise a chunk with the next noise draw (pulled
        toward ``guide``'s leftover with Real-Time Chunking; the actions after the queued ones into ``ahead``)."""
        self.encode_observation(observation, arena)
        self.prefill_from_context(arena)
        self.denoise(arena, arena[self.PLANS], guide, ahead)
        arena[self.PLANS].add_(1)

    def redraw_chunk(self, arena: StateArena) -> None:
        """The noise stream's first chunk over the stored prefix (``PolicyEngine.redraw``; no network but the expert)."""
        arena[self.PLANS].zero_()
        self.denoise(arena, arena[self.PLANS])
        arena[self.PLANS].add_(1)

    def replan_from_context(self, arena: StateArena) -> None:
        """The last chunk planned again from the stored image tokens and state with the current instruction and
        the same noise draw (``PolicyEngine.replan_from_context``): the language model and the expert run, the
        vision tower does not. Equal to the plan a replanning step with this instruction made."""
        self.prefill_from_context(arena)
        self.denoise(arena, (arena[self.PLANS] - 1).clamp(min=0))

    def planned_actions(self, arena: StateArena) -> Tensor:
        """The queued actions after the one just taken, unnormalised ``(left, action_dim)`` (host read)."""
        n = self.cfg.n_action_steps
        left = max(0, min(n, int(arena[self.LEFT].item())))
        return self.norm.action(arena[self.QUEUE][n - left:])

    # --- network ------------------------------------------------------------------------------------
    def camera_image(self, cam: str, observation: Mapping[str, Tensor]) -> Tensor:
        """One camera's image normalised and resized with padding to ``image_resolution``: ``(1, 3, S, S)``."""
        img = self.norm.input(cam, observation[cam].unsqueeze(0))
        side = self.cfg.image_resolution
        return img if tuple(img.shape[2:]) == side else resize_with_pad(img, *side)

    def store_state(self, observation: Mapping[str, Tensor], arena: StateArena) -> None:
        """The normalised state, zero-padded, into ``state``."""
        c = self.cfg
        state = self.norm.input(STATE, observation[STATE])
        arena[self.STATE_VEC].copy_(F.pad(state, (0, c.state_width - c.state_dim)))

    def encode_observation(self, observation: Mapping[str, Tensor], arena: StateArena) -> None:
        """Each camera through the vision tower and projector into ``images``; the state into ``state``."""
        if self.fused:
            return self.fast.encode(self, observation, arena)
        c, m = self.cfg, self.model
        vision = m.vision
        n = c.image_tokens
        for i, cam in enumerate(c.cameras):
            img = self.camera_image(cam, observation)
            x = vision.embeddings((img * 2.0 - 1.0).to(vision.embeddings.patch_embedding.weight.dtype))
            x = x.to(vision.post_layernorm.weight.dtype)
            for layer in vision.encoder.layers:
                x = layer(x)
            x = vision.post_layernorm(x)
            proj = m.paligemma_with_expert.paligemma.model.multi_modal_projector.linear
            arena[self.IMAGES][i * n:(i + 1) * n].copy_(proj(x.to(proj.weight.dtype))[0])
        self.store_state(observation, arena)

    def language_tokens(self, arena: StateArena) -> tuple[Tensor, Tensor]:
        """The prefix's token ids ``(max_length,)`` and length: π0 the instruction, π0.5 the prompt."""
        if self.prompt is None:
            return arena[self.LANG], arena[self.LANG_LEN]
        return self.prompt.build(arena[self.LANG], arena[self.LANG_LEN], arena[self.STATE_VEC])

    def prefill_from_context(self, arena: StateArena) -> None:
        """The language model over the stored image tokens and the instruction: each layer's KV into the arena."""
        if self.fused:
            return self.fast.prefill(self, arena)
        c, lm = self.cfg, self.model.language_model
        ids, length = self.language_tokens(arena)
        lang = lm.embed_tokens(ids)
        lang = lang * math.sqrt(lang.shape[-1])
        x = torch.cat([arena[self.IMAGES], lang])
        dev = x.device
        valid = torch.cat([torch.ones(c.image_rows, dtype=torch.bool, device=dev),
                           torch.arange(c.tokenizer_max_length, device=dev) < length])
        mask = valid[None, :].expand(c.prefix_capacity, c.prefix_capacity)   # bidirectional over valid tokens
        cos, sin = lm.rope(torch.arange(c.prefix_capacity, device=dev), x.dtype)
        for i, layer in enumerate(lm.layers):
            q, k, v, _ = layer.qkv(x, cos, sin)
            arena[f"{self.KEY}{i}"].copy_(torch.where(valid[:, None, None], k, 0))
            arena[f"{self.VALUE}{i}"].copy_(torch.where(valid[:, None, None], v, 0))
            if i + 1 < len(lm.layers):                 # the last layer's output is never used
                x = layer.finish(x, gqa_attention(q, k, v, mask), None)
        arena[self.PREFIX_LEN].copy_(c.image_rows + length)

    def denoise(self, arena: StateArena, counter: Tensor, guide: Guidance | None = None,
                ahead: Tensor | None = None) -> None:
        """``num_inference_steps`` Euler steps from plan ``counter``'s noise over the stored prefix; refill the queue.

        ``guide``: Real-Time Chunking (LeRobot's ``RTCProcessor`` arithmetic, ``models.rtc``); ``ahead``: the
        actions after the queued ones (an async plan's)."""
        if self.fused:
            return self.fast.denoise(self, arena, counter, guide, ahead)
        c, m = self.cfg, self.model
        x = normal(arena[self.RNG_SEED], counter, c.chunk_size * c.max_action_dim).view(c.chunk_size,
                                                                                         c.max_action_dim)
        prefix_len = arena[self.PREFIX_LEN]
        dev = x.device
        prefix_mask = (torch.arange(c.prefix_capacity, device=dev) < prefix_len)[None, :]
        mask = torch.cat([prefix_mask.expand(c.suffix_len, c.prefix_capacity), self.suffix_mask], dim=1)
        cos, sin = m.expert.rope(prefix_len + torch.arange(c.suffix_len, device=dev), self.dtype)
        kv = [(arena[f"{self.KEY}{i}"], arena[f"{self.VALUE}{i}"]) for i in range(c.expert.depth)]
        state = None if c.pi05 else m.state_proj(arena[self.STATE_VEC][None, :].to(m.state_proj.weight.dtype))
        x = integrate_flow(x, c.num_inference_steps, lambda x, s: self.velocity(x, s, state, kv, mask, cos, sin),
                           guide)
        queue_chunk(x, arena[self.QUEUE], arena[self.LEFT], ahead)

    def velocity(self, x: Tensor, step: int, state: Tensor | None, kv: list[tuple[Tensor, Tensor]], mask: Tensor,
                 cos: Tensor, sin: Tensor) -> Tensor:
        """The expert's velocity ``v_t (chunk, max_action_dim)`` at Euler step ``step`` (float32)."""
        m = self.model
        a = m.action_in_proj(x.to(m.action_in_proj.weight.dtype))
        t = self.time_embeddings[step].to(a.dtype)[None, :]
        if self.cfg.pi05:
            cond = F.silu(m.time_mlp_out(F.silu(m.time_mlp_in(t))))
            h = a
        else:
            cond = None
            fused = m.action_time_mlp_out(F.silu(m.action_time_mlp_in(torch.cat([a, t.expand_as(a)], dim=-1))))
            h = torch.cat([state.to(fused.dtype), fused])
        h = h.to(self.dtype)
        for i, layer in enumerate(m.expert.layers):
            q, k, v, gate = layer.qkv(h, cos, sin, cond)
            pk, pv = kv[i]
            y = gqa_attention(q, torch.cat([pk, k]), torch.cat([pv, v]), mask)
            h = layer.finish(h, y, gate, cond)
        out, _ = m.expert.norm(h, cond)
        out = out[-self.cfg.chunk_size:].to(torch.float32)
        return m.action_out_proj(out.to(m.action_out_proj.weight.dtype)).to(torch.float32)


# --- loading -------------------------------------------------------------------------------

def build_pi0(ckpt: LeRobotCheckpoint, instruction: str = "") -> PI0Policy:
    """Our π0 / π0.5 for a checkpoint (weights not yet loaded)."""
    settings = tokenizer_settings(ckpt, default_name=PALIGEMMA_TOKENIZER)
    cfg = PI0Config.from_checkpoint(ckpt, settings)
    file = tokenizer_file(ckpt, settings)
    if cfg.pi05 and file is None:
        raise InvalidArgument(f"π0.5 writes the state into its prompt and needs the checkpoint's tokenizer: put the "
                              f"tokenizer.json of {settings.name!r} into {ckpt.path}")
    return PI0Policy(cfg, ckpt, settings, file, instruction)
