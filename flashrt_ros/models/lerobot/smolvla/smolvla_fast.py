"""SmolVLA's network in the ``fast`` numerics: the same plan, the same arena buffers, other kernels.

Why: what a plan computes with is free, what state it touches is not. The
``exact`` forward passes in ``modeling_smolvla.py`` keep LeRobot's arithmetic to the bit
(CPU parity); this one keeps their function and every buffer they write (the
prefix KV rows valid-first with zeros after, ``prefix_len``, the queue, the
noise counter) but runs it as few, large kernels:

- vision: all cameras through SigLIP in one batch (``siglip_fast``), then the
  connector (pixel shuffle, and its projection with the embedding scale
  ``sqrt(width)`` folded in);
- the VLM prefix in the arena's own row order: LeRobot's prefix is images,
  instruction (padded), state, and the arena keeps the valid rows first; the
  permutation (one gather of the embeddings, a function of the instruction's
  length) is applied once per plan, so every layer's row kernel writes the
  RoPE'd keys and the values straight into the arena rows with zeros from
  ``prefix_len`` on, and the attention (images and instruction do not see the
  state token) is one masked SDPA per layer (``llama_fast``);
- the expert: the cross-attention layers' keys and values depend on the
  prefix only, so they are projected once per plan; the self-attention layers'
  prefix rows are copied once per plan into a scratch buffer with room for the
  action rows, so each step's attention is one SDPA without a concatenation;
  the flow-time branch is precomputed for the fixed step schedule
  (``action_in_proj`` and the action half of ``action_time_mlp_in`` are one
  product, its time half a per-step bias);
- the velocity, the Euler sum and RTC guidance are ``models.rtc.integrate_flow``
  as in ``exact`` (float32).

``FastSmolVLA`` is built from a loaded, cast policy and takes its layers' weights
(the unfused ones are dropped): a policy is in one numerics for its life.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.smolvla.llama_fast import ALIGN, FastLlamaLayer, grouped_attention, grouped_mask
from flashrt_ros.models.lerobot.siglip_fast import FastVisionModel
from flashrt_ros.models.lerobot.smolvla.smolvla_net import pixel_shuffle, rope_tables
from flashrt_ros.models.policy_interface import Guidance, queue_chunk
from flashrt_ros.models.rtc import integrate_flow
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.ops.norms import add_rms_norm
from flashrt_ros.runtime.arena import StateArena


class FastSmolVLA(nn.Module):
    """The fused weights and precomputed tables of one SmolVLA policy (see the module doc)."""

    def __init__(self, policy) -> None:
        super().__init__()
        c, s, m = policy.cfg, policy.cfg.vlm, policy.model
        self.cfg = c
        vlm = m.vlm_with_expert.vlm.model
        expert = m.vlm_with_expert.lm_expert
        self.every = c.num_vlm_layers // c.n_expert_layers
        self.self_attn = [c.is_self_attn(i * self.every) for i in range(c.n_expert_layers)]
        with torch.no_grad():
            self.vision = FastVisionModel(vlm.vision_model)
            proj = vlm.connector.modality_projection.proj.weight
            # LeRobot scales the image tokens by sqrt(width) after the projection: folded into it
            self.connector = nn.Parameter((proj.float() * math.sqrt(s.text_hidden)).to(proj.dtype),
                                          requires_grad=False)
            vlm.connector = None                          # the unscaled copy goes
            text = vlm.text_model
            text.layers = nn.ModuleList(FastLlamaLayer(layer, s, cross=False) for layer in text.layers)
            expert.layers = nn.ModuleList(FastLlamaLayer(layer, s, cross=not self_attn)
                                          for layer, self_attn in zip(expert.layers, self.self_attn))
            self._fold_action_time(m, policy.time_embeddings)
        cos, sin = rope_tables(torch.arange(c.chunk_size), s.head_dim)
        self.register_buffer("cross_cos", cos, persistent=False)    # cross layers: positions from 0
        self.register_buffer("cross_sin", sin, persistent=False)

    def _fold_action_time(self, m: nn.Module, times: Tensor) -> None:
        """``mlp_in([action_in(x), t])`` is one product of ``x`` plus a per-step bias (folded in float32)."""
        a_in, mlp_in = m.action_in_proj, m.action_time_mlp_in
        w = a_in.weight.shape[0]
        w_in = mlp_in.weight.float()
        w_a, w_t = w_in[:, :w], w_in[:, w:]
        dtype = a_in.weight.dtype
        self.action_weight = nn.Parameter((w_a @ a_in.weight.float()).to(dtype), requires_grad=False)
        bias = w_a @ a_in.bias.float() + mlp_in.bias.float()
        t = times.to(dtype).float()                        # the embeddings as the reference takes them
        self.register_buffer("action_bias", (t @ w_t.t() + bias[None, :]).to(dtype))

    # --- the plan's two parts (same buffers as the exact ones in modeling_smolvla.py) ----------------
    def prefill(self, policy, observation: Mapping[str, Tensor], arena: StateArena) -> None:
        """The VLM over images + instruction + state, in the arena's row order; each layer's KV into the arena."""
        c, s = self.cfg, self.cfg.vlm
        P = c.prefix_capacity
        n_img = len(c.cameras) * s.image_tokens
        length = arena[policy.LANG_LEN].clamp(0, c.tokenizer_max_length)
        prefix_len = length + (n_img + 1)                 # images, the instruction, the state token
        rows = torch.arange(P, device=length.device)
        state_row = prefix_len - 1
        # arena row i holds LeRobot's prefix row order[i]: the state token right after the instruction
        order = torch.where(rows < state_row, rows, torch.where(rows == state_row, P - 1, rows - 1))
        x = self._prefix_embeddings(policy, observation, arena).index_select(0, order)
        # LeRobot's positions (cumulated valid tokens) in this order; the padding rows repeat the last token's
        positions = torch.where(rows < prefix_len, rows, prefix_len - 2)
        cos, sin = rope_tables(positions, s.head_dim)
        # every valid key, but the state token only to itself (LeRobot's attention blocks)
        keys, queries = rows[None, :], rows[:, None]
        allowed = (keys < prefix_len) & ((keys != state_row) | (queries == state_row))
        mask = grouped_mask(allowed, s.text_heads // s.text_kv_heads, x.dtype)
        layers = policy.model.vlm_with_expert.vlm.model.text_model.layers
        for i, layer in enumerate(layers):
            k, v = arena[f"{policy.KEY}{i}"], arena[f"{policy.VALUE}{i}"]
            q = layer.project_qkv(x, cos, sin, k, v, valid=prefix_len)
            if i + 1 < len(layers):                     # the last layer's output is never used
                x = layer.rest(x, grouped_attention(q, k, v, mask))
        arena[policy.PREFIX_LEN].copy_(prefix_len)

    def _prefix_embeddings(self, policy, observation: Mapping[str, Tensor], arena: StateArena) -> Tensor:
        """LeRobot's prefix rows ``(P, width)``: every camera's image tokens, the instruction's, the state's."""
        c, dtype = self.cfg, policy.dtype
        images = torch.cat([policy.camera_image(cam, observation) for cam in c.cameras])
        x = pixel_shuffle(self.vision((images * 2.0 - 1.0).to(dtype), dtype), c.vlm.scale_factor)
        tokens = x.reshape(-1, x.shape[-1]) @ self.connector.t()
        lang = policy.model.vlm_with_expert.vlm.model.text_model.embed_tokens(arena[policy.LANG])
        return torch.cat([tokens, lang * math.sqrt(lang.shape[-1]), policy.state_embedding(observation)])

    def denoise(self, policy, arena: StateArena, guide: Guidance | None = None, ahead: Tensor | None = None) -> None:
        """The Euler steps of the expert over the stored prefix (``SmolVLAPolicy.denoise``'s function, the noise
        counter advanced too)."""
        c, s = self.cfg, self.cfg.vlm
        plans = arena[policy.PLANS]
        noise = normal(arena[policy.RNG_SEED], plans, c.chunk_size * c.max_action_dim)
        x = noise.view(c.chunk_size, c.max_action_dim)
        dev, dtype = x.device, policy.dtype
        P, T = c.prefix_capacity, c.chunk_size
        total = -(-(P + T) // ALIGN) * ALIGN
        layers = policy.model.vlm_with_expert.lm_expert.layers
        kv = torch.zeros(2, len(layers), total, s.text_kv_heads, s.head_dim, dtype=dtype, device=dev)
        prefix = [(arena[f"{policy.KEY}{i * self.every}"], arena[f"{policy.VALUE}{i * self.every}"])
                  for i in range(len(layers))]
        own = [i for i, self_attn in enumerate(self.self_attn) if self_attn]
        torch._foreach_copy_([kv[j, i, :P] for i in own for j in range(2)], [t for i in own for t in prefix[i]])
        for i, layer in enumerate(layers):
            if not self.self_attn[i]:
                layer.project_kv(*prefix[i], kv[0, i, :P], kv[1, i, :P])
        prefix_len = arena[policy.PREFIX_LEN]
        keys, rows = torch.arange(total, device=dev)[None, :], torch.arange(T, device=dev)[:, None]
        visible = keys < prefix_len
        group = s.text_heads // s.text_kv_heads
        masks = (grouped_mask(visible.expand(T, total), group, dtype),                          # cross layers
                 grouped_mask(visible | ((keys >= P) & (keys - P <= rows)), group, dtype))     # self: causal
        cos, sin = rope_tables(prefix_len + torch.arange(T, device=dev), s.head_dim)

        def velocity(x: Tensor, step: int) -> Tensor:
            return self.velocity(policy, x, step, kv, masks, cos, sin)
        queue_chunk(integrate_flow(x, c.num_steps, velocity, guide), arena[policy.QUEUE], arena[policy.LEFT], ahead)
        plans.add_(1)

    def velocity(self, policy, x: Tensor, step: int, kv: Tensor, masks: tuple[Tensor, Tensor], cos: Tensor,
                 sin: Tensor) -> Tensor:
        """The expert's velocity ``(chunk, max_action_dim)`` at Euler step ``step`` (float32)."""
        c, m = self.cfg, policy.model
        P, T = c.prefix_capacity, c.chunk_size
        expert = m.vlm_with_expert.lm_expert
        z = F.silu(torch.addmm(self.action_bias[step], x.to(self.action_weight.dtype), self.action_weight.t()))
        mlp_out = m.action_time_mlp_out
        h = F.linear(z, mlp_out.weight, mlp_out.bias)
        for i, layer in enumerate(expert.layers):
            if self.self_attn[i]:
                q = layer.project_qkv(h, cos, sin, kv[0, i, P:P + T], kv[1, i, P:P + T])
            else:
                q = layer.project_q(h, self.cross_cos, self.cross_sin)
            h = layer.rest(h, grouped_attention(q, kv[0, i], kv[1, i], masks[self.self_attn[i]]))
        _, out = add_rms_norm(h, None, expert.norm.weight, expert.norm.eps, offset=False)
        proj = m.action_out_proj
        return F.linear(out, proj.weight, proj.bias).to(torch.float32)
