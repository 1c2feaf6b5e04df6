"""SmolVLA (LeRobot 0.4.x) as an arena-backed ``PolicyModule``: VLM prefix KV, action queue, noise, instruction.

Why: LeRobot keeps a SmolVLA episode in Python (a ``deque`` of actions, the
prefix ``past_key_values`` dict rebuilt per chunk, noise from torch's global
RNG), so nothing of it can be captured or brought back. Here every bit that
shapes the next action is an arena buffer updated in place:

- ``policy.smolvla.kv.{k,v}.<layer>``: the VLM prefix keys (RoPE'd) and values of
  each layer, ``(P, kv_heads, head_dim)``, valid rows first; the live extent is
  ``policy.smolvla.prefix_len`` (images + instruction + state tokens), so a
  capsule copies only the live rows of each layer;
- ``policy.smolvla.lang_tokens`` / ``lang_len``: the instruction's token ids;
- ``policy.smolvla.queue`` / ``queue_left``: the chunk being executed (normalised);
- ``policy.rng.seed`` / ``policy.rng.plans``: the flow-matching noise stream
  (plan ``p`` draws its ``(chunk_size, max_action_dim)`` noise with counter ``p``).

A step only pops when the queue holds actions; when it is empty it replans
first (``plan``: prefill the prefix KV, denoise ``num_steps`` Euler steps from
the noise, refill the queue). The engine makes that choice on the host
(``action_queue``) and captures the two bodies as two graphs, so a pop never
runs the VLM. ``prefill`` and ``denoise`` are separate too: ``redraw_chunk``
denoises the stored prefix from another noise seed (the engine's ``redraw``,
a third graph), so one prefix serves several noise draws.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, feature_specs, jsonable
from flashrt_ros.models.lerobot.flow_time import flow_time_embeddings
from flashrt_ros.models.lerobot.instruction import LanguageInstruction
from flashrt_ros.models.lerobot.normalize import PolicyNormalization
from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import PUBLISHED_VLM, SmolVLAConfig, vlm_sizes
from flashrt_ros.models.lerobot.smolvla.smolvla_net import VLMWithExpert, attention, rope
from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings, tokenizer_file, tokenizer_settings
from flashrt_ros.models.policy_interface import ActionQueue, Guidance, PolicyModule, pop_queue, queue_chunk
from flashrt_ros.models.rtc import integrate_flow
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


def resize_with_pad(img: Tensor, width: int, height: int) -> Tensor:
    """LeRobot's ``resize_with_pad`` (bilinear, aspect kept, zero padding on the left and top)."""
    h, w = img.shape[2:]
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    img = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False)
    return F.pad(img, (max(0, width - rw), 0, max(0, height - rh), 0), value=0.0)


class SmolVLAPolicy(LanguageInstruction, PolicyModule):
    """A LeRobot SmolVLA checkpoint as a ``PolicyModule`` (see the module doc for its state)."""

    PREFIX = "policy.smolvla."        # the buffer names (``KEY``, ``QUEUE``, ...): ``LanguageInstruction``
    #: checkpoint weights inference never reads; accepted when present, not required
    OPTIONAL_WEIGHTS = ("model.vlm_with_expert.vlm.lm_head.weight",)
    #: a VLM with tied embeddings is saved with only ``lm_head`` (safetensors keeps the first name in order)
    TIED_WEIGHTS = {"model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight":
                    "model.vlm_with_expert.vlm.lm_head.weight"}

    def __init__(self, cfg: SmolVLAConfig, ckpt: LeRobotCheckpoint | None = None,
                 tokenizer: TokenizerSettings = TokenizerSettings(PUBLISHED_VLM), tokenizer_file: Path | None = None,
                 instruction: str = "") -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
        self.tokenizer_settings, self.tokenizer_file = tokenizer, tokenizer_file
        cross = [not cfg.is_self_attn(i) for i in range(cfg.n_expert_layers)]
        self.model = nn.Module()
        self.model.vlm_with_expert = VLMWithExpert(cfg.vlm, cfg.num_vlm_layers, cfg.expert_hidden,
                                                   cfg.n_expert_layers, cross)
        d, e = cfg.vlm.text_hidden, cfg.expert_hidden
        self.model.state_proj = nn.Linear(cfg.max_state_dim, d)
        self.model.action_in_proj = nn.Linear(cfg.max_action_dim, e)
        self.model.action_out_proj = nn.Linear(e, cfg.max_action_dim)
        self.model.action_time_mlp_in = nn.Linear(2 * e, e)
        self.model.action_time_mlp_out = nn.Linear(e, e)
        self.norm = PolicyNormalization(ckpt)
        self.register_buffer("time_embeddings", flow_time_embeddings(cfg.num_steps, e, cfg.min_period, cfg.max_period),
                             persistent=False)
        self.set_default_instruction(instruction)

    # --- contract ---------------------------------------------------------------------
    def input_features(self) -> dict[str, FeatureSpec]:
        return feature_specs(self.cfg)

    def config(self) -> dict:
        return {"type": "smolvla", "numerics": self.numerics, **jsonable(asdict(self.cfg))}

    #: ``exact``: LeRobot's arithmetic (bit-identical on CPU); ``fast``: the same plan in fused kernels
    #: (``smolvla_fast``), chosen once by ``use_numerics`` after the weights are loaded and cast
    numerics = "exact"

    def use_numerics(self, numerics: str) -> None:
        """Switch to ``fast`` (irreversible: its fused weights replace the unfused ones)."""
        if numerics == self.numerics:
            return
        if numerics != "fast":
            raise InvalidArgument(f"SmolVLA: numerics {numerics!r} after {self.numerics!r}: choose it once, at load")
        from flashrt_ros.models.lerobot.smolvla.smolvla_fast import FastSmolVLA
        self.fast = FastSmolVLA(self)
        self.numerics = "fast"

    @property
    def dtype(self) -> torch.dtype:
        return self.model.state_proj.weight.dtype

    def state_specs(self) -> list[BufferSpec]:
        c, s = self.cfg, self.cfg.vlm
        kv_shape = (c.prefix_capacity, s.text_kv_heads, s.head_dim)
        return self.prefix_specs(c.num_vlm_layers, kv_shape, "VLM") + self.episode_specs()

    # --- step --------------------------------------------------------------------------
    def action_queue(self) -> ActionQueue:
        """Replan-or-pop on the host; a pop reads no observation; the prefix KV can be redrawn from."""
        kv = tuple(f"{name}{i}" for i in range(self.cfg.num_vlm_layers) for name in (self.KEY, self.VALUE))
        return ActionQueue(self.LEFT, self.cfg.n_action_steps, pop_reads_observation=False,
                           redraw_context=self.PREFIX_LEN, chunk=self.QUEUE,
                           planned=(*kv, self.PREFIX_LEN, self.PLANS), chunk_size=self.cfg.chunk_size,
                           ahead=self.cfg.chunk_size - self.cfg.n_action_steps)

    #: Real-Time Chunking: ``plan`` takes a ``Guidance`` (``flashrt_ros.models.rtc``).
    supports_guidance = True

    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        """``replan`` (the engine's choice): plan a chunk, then pop; else only pop (no VLM, no expert)."""
        if replan is None:
            raise InvalidArgument("SmolVLA: the caller decides replan (see action_queue)")
        if replan:
            self.plan(observation, arena)
        return self.norm.action(pop_queue(arena[self.QUEUE], arena[self.LEFT]))

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: Guidance | None = None,
             ahead: Tensor | None = None) -> None:
        """Prefill the prefix KV from the observation and instruction, denoise a chunk (pulled toward
        ``guide``'s leftover with Real-Time Chunking), refill the queue."""
        self.prefill(observation, arena)
        self.denoise(arena, guide, ahead)

    def redraw_chunk(self, arena: StateArena) -> None:
        """The noise stream's first chunk over the stored prefix (``PolicyEngine.redraw``; no VLM run)."""
        arena[self.PLANS].zero_()
        self.denoise(arena)

    def planned_actions(self, arena: StateArena) -> Tensor:
        """The queued actions after the one just taken, unnormalised ``(left, action_dim)`` (host read)."""
        n = self.cfg.n_action_steps
        left = max(0, min(n, int(arena[self.LEFT].item())))
        return self.norm.action(arena[self.QUEUE][n - left:])

    def prefill(self, observation: Mapping[str, Tensor], arena: StateArena) -> None:
        """Run the VLM over images + instruction + state; write each layer's KV (valid rows first)."""
        if self.numerics == "fast":
            return self.fast.prefill(self, observation, arena)
        embs, valid, blocks = self._prefix_embeddings(observation, arena)
        kv = self._prefix_kv(embs, valid, blocks)
        order = torch.sort((~valid).to(torch.int64), stable=True).indices     # valid rows first
        keep = torch.sort(valid.to(torch.int64), descending=True, stable=True).values.bool()
        for i, (k, v) in enumerate(kv):
            arena[f"{self.KEY}{i}"].copy_(torch.where(keep[:, None, None], k[order], 0))
            arena[f"{self.VALUE}{i}"].copy_(torch.where(keep[:, None, None], v[order], 0))
        arena[self.PREFIX_LEN].copy_(valid.sum())

    def denoise(self, arena: StateArena, guide: Guidance | None = None, ahead: Tensor | None = None) -> None:
        """``num_steps`` Euler steps of the flow from this plan's noise over the stored prefix; refill the queue.

        ``guide``: Real-Time Chunking (LeRobot's ``RTCProcessor`` arithmetic, ``models.rtc``)."""
        if self.numerics == "fast":
            return self.fast.denoise(self, arena, guide, ahead)
        c = self.cfg
        plans = arena[self.PLANS]
        x = normal(arena[self.RNG_SEED], plans, c.chunk_size * c.max_action_dim).view(c.chunk_size, c.max_action_dim)
        prefix_len = arena[self.PREFIX_LEN]
        P = c.prefix_capacity
        prefix_mask = torch.arange(P, device=x.device) < prefix_len
        causal = torch.ones(c.chunk_size, c.chunk_size, dtype=torch.bool, device=x.device).tril()
        self_mask = torch.cat([prefix_mask[None, :].expand(c.chunk_size, P), causal], dim=1)
        cross_mask = prefix_mask[None, :].expand(c.chunk_size, P)
        steps = torch.arange(c.chunk_size, device=x.device)
        kv = [(arena[f"{self.KEY}{i}"], arena[f"{self.VALUE}{i}"]) for i in range(c.num_vlm_layers)]
        x = integrate_flow(x, c.num_steps, lambda x, s: self.velocity(x, s, kv, self_mask, cross_mask,
                                                                      prefix_len + steps, steps), guide)
        queue_chunk(x, arena[self.QUEUE], arena[self.LEFT], ahead)
        plans.add_(1)

    # --- network --------------------------------------------------------------------------
    def camera_image(self, cam: str, observation: Mapping[str, Tensor]) -> Tensor:
        """One camera's image normalised and (when configured) resized with padding: ``(1, 3, H, W)`` in [0, 1]."""
        img = self.norm.input(cam, observation[cam].unsqueeze(0))
        side = self.cfg.resize_imgs_with_padding
        return img if side is None else resize_with_pad(img, *side)

    def state_embedding(self, observation: Mapping[str, Tensor]) -> Tensor:
        """The state token ``(1, width)``: the normalised state, zero-padded, through ``state_proj``."""
        c = self.cfg
        state = self.norm.input(STATE, observation[STATE].unsqueeze(0)).to(self.dtype)
        return self.model.state_proj(F.pad(state, (0, c.max_state_dim - c.state_dim)))

    def _prefix_embeddings(self, observation: Mapping[str, Tensor], arena: StateArena) -> tuple[Tensor, Tensor, Tensor]:
        """Prefix embeddings ``(P, D)``, the valid-token mask ``(P,)``, and the attention block ids
        (images and instruction share block 0, the state is block 1: LeRobot's ``att_masks``)."""
        c, vlm = self.cfg, self.model.vlm_with_expert.vlm.model
        dtype, dev = self.dtype, arena[self.LANG].device
        embs = []
        for cam in c.cameras:
            img = vlm.connector(vlm.vision_model((self.camera_image(cam, observation) * 2.0 - 1.0).to(dtype)))[0]
            embs.append(img * img.shape[-1] ** 0.5)     # LeRobot: a tensor of the same float value
        lang = vlm.text_model.embed_tokens(arena[self.LANG])
        embs.append(lang * math.sqrt(lang.shape[-1]))
        embs.append(self.state_embedding(observation))
        n_img = len(c.cameras) * c.vlm.image_tokens
        lang_valid = torch.arange(c.tokenizer_max_length, device=dev) < arena[self.LANG_LEN]
        ones = torch.ones(n_img, dtype=torch.bool, device=dev)
        valid = torch.cat([ones, lang_valid, ones[:1]])
        # built on the device (no host scalar written into it: the plan is captured as a CUDA graph)
        blocks = torch.cat([torch.zeros(c.prefix_capacity - 1, dtype=torch.int64, device=dev),
                            torch.ones(1, dtype=torch.int64, device=dev)])
        return torch.cat(embs), valid, blocks

    def _prefix_kv(self, x: Tensor, valid: Tensor, blocks: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each VLM layer's RoPE'd keys and values over the prefix (padding rows finite, never attended to)."""
        s = self.cfg.vlm
        positions = torch.cumsum(valid.to(torch.int64), 0) - 1
        # a key is visible when valid and in a block <= the query's; padding queries see the valid keys too
        # (their rows are never read, but must stay finite)
        mask = (blocks[None, :] <= blocks[:, None]) & valid[None, :]
        layers = self.model.vlm_with_expert.vlm.model.text_model.layers
        out = []
        for i, layer in enumerate(layers):
            h = layer.input_layernorm(x)
            a = layer.self_attn
            q = rope(a.q_proj(h).view(-1, s.text_heads, s.head_dim), positions)
            k = rope(a.k_proj(h).view(-1, s.text_kv_heads, s.head_dim), positions)
            v = a.v_proj(h).view(-1, s.text_kv_heads, s.head_dim)
            out.append((k, v))
            if i + 1 < len(layers):               # the last layer's output is never used
                x = layer.finish(x, attention(q, k, v, mask, s.text_kv_heads))
        return out

    def velocity(self, x: Tensor, step: int, kv: list[tuple[Tensor, Tensor]], self_mask: Tensor,
                 cross_mask: Tensor, self_positions: Tensor, cross_positions: Tensor) -> Tensor:
        """The expert's velocity ``v_t (chunk, max_action_dim)`` at Euler step ``step`` (float32)."""
        c, s, m = self.cfg, self.cfg.vlm, self.model
        a = m.action_in_proj(x.to(self.dtype))
        t = self.time_embeddings[step].to(a.dtype)[None, :].expand_as(a)
        h = m.action_time_mlp_out(F.silu(m.action_time_mlp_in(torch.cat([a, t], dim=-1))))
        expert = m.vlm_with_expert.lm_expert
        every = c.num_vlm_layers // c.n_expert_layers
        for i in range(c.num_vlm_layers):
            if i % every:
                continue                            # no expert layer here: the action tokens pass through
            layer = expert.layers[i // every]
            attn = layer.self_attn
            g = layer.input_layernorm(h)
            q = attn.q_proj(g).view(-1, s.text_heads, s.head_dim)
            pk, pv = kv[i]
            if c.is_self_attn(i):
                k = rope(attn.k_proj(g).view(-1, s.text_kv_heads, s.head_dim), self_positions)
                v = attn.v_proj(g).view(-1, s.text_kv_heads, s.head_dim)
                y = attention(rope(q, self_positions), torch.cat([pk, k]), torch.cat([pv, v]), self_mask,
                              s.text_kv_heads)
            else:
                k = attn.k_proj(pk.flatten(1).to(self.dtype)).view(pk.shape[0], -1, s.head_dim)
                v = attn.v_proj(pv.flatten(1).to(self.dtype)).view(pv.shape[0], -1, s.head_dim)
                y = attention(rope(q, cross_positions), k, v, cross_mask, s.text_kv_heads)
            h = layer.finish(h, y)
        return m.action_out_proj(expert.norm(h).to(torch.float32).to(self.dtype)).to(torch.float32)


# --- loading -------------------------------------------------------------------------------

def build_smolvla(ckpt: LeRobotCheckpoint, instruction: str = "") -> SmolVLAPolicy:
    """Our SmolVLA for a checkpoint (weights not yet loaded)."""
    settings = tokenizer_settings(ckpt, default_name=str(ckpt.config.get("vlm_model_name") or PUBLISHED_VLM))
    cfg = SmolVLAConfig.from_checkpoint(ckpt, vlm_sizes(ckpt), settings)
    return SmolVLAPolicy(cfg, ckpt, settings, tokenizer_file(ckpt, settings), instruction)
