"""Gated full attention of the hybrid decoder (GQA, q/k RMSNorm, partial RoPE, sigmoid gate).

The KV cache is this layer's slice of the shared static ``kv_cache`` buffer
(the MTP head's layer: of its own ``mtp.kv_cache``).
``ops.rope_write_and_attend`` does the norms, RoPE, the cache write at
``positions`` and causal attention (see there for the CPU, CUDA and triton
paths), so shapes never depend on the position and the step stays capturable. q, gate, k and v come
from one fused matrix (rows reordered at load time from transformers' per-head
``[query, gate]`` pairs).
"""
from __future__ import annotations

import torch
from torch import nn

from flashrt_ros.models.base import KV_CACHE, kv_views
from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops.gating import sigmoid_mul
from flashrt_ros.ops.linear import Linear, fused_linear
from flashrt_ros.ops.static_kv_attention import rope_write_and_attend
from flashrt_ros.runtime.arena import StateArena


class GatedAttention(nn.Module):
    def __init__(self, cfg: HybridConfig, kv_index: int, kv_buffer: str = KV_CACHE) -> None:
        super().__init__()
        self.rotary_dim, self.eps = cfg.rotary_dim, cfg.rms_norm_eps
        self.n_heads, self.n_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv_heads * self.head_dim
        self.wqkv = Linear(cfg.hidden_size, 2 * self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.kv_index = kv_index          # this layer's slot in the shared KV cache
        self.kv_buffer = kv_buffer        # that cache's arena buffer (the MTP head has its own)

    def forward(self, x: torch.Tensor, norm: OffsetRMSNorm, positions: torch.Tensor, inv_freq: torch.Tensor,
                arena: StateArena) -> torch.Tensor:
        """The residual stream ``x`` plus this mixer's output on ``norm(x)`` (the norm with the first product,
        the residual add with the last: ``ops.linear.fused_linear``)."""
        t = x.shape[0]
        qkv = fused_linear(x, self.wqkv.weight, norm="offset", norm_weight=norm.weight, eps=norm.eps,
                           bias=self.wqkv.bias)
        q, gate, k, v = qkv.split([self.q_size, self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = rope_write_and_attend(
            q.view(t, self.n_heads, self.head_dim), k.view(t, self.n_kv_heads, self.head_dim),
            v.view(t, self.n_kv_heads, self.head_dim), *kv_views(arena, self.kv_index, self.kv_buffer), positions,
            inv_freq, self.rotary_dim, q_norm=self.q_norm.weight, k_norm=self.k_norm.weight, eps=self.eps)
        return fused_linear(sigmoid_mul(out, gate), self.o_proj.weight, epilogue="residual", residual=x,
                            bias=self.o_proj.bias)
