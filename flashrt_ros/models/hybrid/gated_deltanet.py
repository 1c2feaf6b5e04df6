"""Gated DeltaNet token mixer: the linear-attention layer of the hybrid decoder.

Why its state is two arena buffers: everything the next token depends on is the
recurrent matrix per value head (``layers.{i}.gdn.recurrent [heads, dk, dv]``)
and the last ``kernel-1`` conv inputs (``layers.{i}.gdn.conv [conv_dim, kernel-1]``).
Both are read and overwritten in place, so a capsule of the arena captures the
layer exactly, and a KV-only restore visibly is not enough.

The input projection is one fused matrix whose rows were reordered at load time
from transformers' per-key-head grouping to ``[q | k | v | z | b | a]``, so the
forward is a split, not a shuffle.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.norms import GatedRMSNorm
from flashrt_ros.ops import causal_conv1d_with_state, chunk_gated_delta_rule, recurrent_gated_delta_step
from flashrt_ros.runtime.arena import StateArena


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = cfg.linear_key_dim, cfg.linear_value_dim
        self.conv_dim = cfg.conv_dim
        self.chunk_size = cfg.gdn_chunk_size
        self.in_proj = nn.Linear(cfg.hidden_size, self.conv_dim + self.value_dim + 2 * self.num_v_heads,
                                 bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.conv_dim, cfg.linear_conv_kernel_dim))
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.recurrent_name = f"layers.{layer}.gdn.recurrent"
        self.conv_name = f"layers.{layer}.gdn.conv"

    def forward(self, x: torch.Tensor, arena: StateArena) -> torch.Tensor:
        t = x.shape[0]
        mixed, z, b, a = self.in_proj(x).split(
            [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        mixed = causal_conv1d_with_state(mixed, arena[self.conv_name], self.conv_weight)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(t, self.num_k_heads, self.head_k_dim)
        k = k.reshape(t, self.num_k_heads, self.head_k_dim)
        v = v.reshape(t, self.num_v_heads, self.head_v_dim)
        groups = self.num_v_heads // self.num_k_heads
        if groups > 1:  # each key head serves `groups` consecutive value heads
            q, k = q.repeat_interleave(groups, dim=1), k.repeat_interleave(groups, dim=1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        state = arena[self.recurrent_name]
        if t == 1:
            out, new_state = recurrent_gated_delta_step(q, k, v, g, beta, state)
        else:
            out, new_state = chunk_gated_delta_rule(q, k, v, g, beta, state, self.chunk_size)
        state.copy_(new_state)
        out = self.norm(out.to(x.dtype), z.reshape(t, self.num_v_heads, self.head_v_dim))
        return self.out_proj(out.reshape(t, self.value_dim))
