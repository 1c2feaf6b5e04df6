"""Gated full attention of the hybrid decoder (GQA, q/k RMSNorm, partial RoPE, sigmoid gate).

The KV cache is two static arena buffers per layer, written at ``positions``
with ``index_copy_``; attention runs over the whole ``[max_context]`` buffer
under a ``key_pos <= query_pos`` mask, so shapes never depend on the position
and the step stays capturable. q, gate, k and v come from one fused matrix
(rows reordered at load time from transformers' per-head ``[query, gate]`` pairs).
"""
from __future__ import annotations

import torch
from torch import nn

from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops import apply_partial_rope
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.ops.static_kv_attention import write_and_attend


class GatedAttention(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv_heads * self.head_dim
        self.wqkv = nn.Linear(cfg.hidden_size, 2 * self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_name = f"layers.{layer}.kv.k"
        self.v_name = f"layers.{layer}.kv.v"

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, arena: StateArena) -> torch.Tensor:
        t = x.shape[0]
        q, gate, k, v = self.wqkv(x).split([self.q_size, self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_partial_rope(self.q_norm(q.view(t, self.n_heads, self.head_dim)), cos, sin)
        k = apply_partial_rope(self.k_norm(k.view(t, self.n_kv_heads, self.head_dim)), cos, sin)
        v = v.view(t, self.n_kv_heads, self.head_dim)
        out = write_and_attend(q, k, v, arena[self.k_name], arena[self.v_name], positions)
        return self.o_proj(out * torch.sigmoid(gate))
