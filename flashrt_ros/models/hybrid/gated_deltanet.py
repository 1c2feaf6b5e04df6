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
from torch import nn

from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.norms import GatedRMSNorm, OffsetRMSNorm
from flashrt_ros.models.hybrid.verification import VerifyScratch
from flashrt_ros.ops import causal_conv1d_with_state, chunk_gated_delta_rule
from flashrt_ros.ops.causal_conv import causal_conv1d_sections
from flashrt_ros.ops.gated_delta import gated_delta_decode, gated_delta_verify, gdn_gates
from flashrt_ros.ops.linear import Linear, fused_linear
from flashrt_ros.runtime.arena import StateArena


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = cfg.linear_key_dim, cfg.linear_value_dim
        self.conv_dim = cfg.conv_dim
        self.chunk_size = cfg.gdn_chunk_size
        self.in_proj = Linear(cfg.hidden_size, self.conv_dim + self.value_dim + 2 * self.num_v_heads,
                              bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.conv_dim, cfg.linear_conv_kernel_dim))
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.recurrent_name = f"layers.{layer}.gdn.recurrent"
        self.conv_name = f"layers.{layer}.gdn.conv"

    def forward(self, x: torch.Tensor, norm: OffsetRMSNorm, arena: StateArena,
                scratch: VerifyScratch | None = None) -> torch.Tensor:
        """The residual stream ``x`` plus this mixer's output on ``norm(x)`` (the norm with the input product,
        the residual add with the output one: ``ops.linear.fused_linear``). ``scratch``: a speculative
        verification; every token's state goes there, the arena's recurrent state is left as it was
        (``VerifyScratch.keep_prefix`` picks one afterwards)."""
        return fused_linear(self._mixed(x, norm, arena, scratch), self.out_proj.weight, epilogue="residual",
                            residual=x)

    def _mixed(self, x: torch.Tensor, norm: OffsetRMSNorm, arena: StateArena,
               scratch: VerifyScratch | None) -> torch.Tensor:
        """The gated, normed delta-rule output ``[T, value_dim]``, before ``out_proj``."""
        t = x.shape[0]
        projected = fused_linear(x, self.in_proj.weight, norm="offset", norm_weight=norm.weight, eps=norm.eps)
        mixed, z, b, a = projected.split([self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        state = arena[self.recurrent_name]
        if scratch is not None:
            return self._verify(mixed, z, b, a, state, arena[self.conv_name], scratch)
        if t == 1:
            mixed = causal_conv1d_with_state(mixed, arena[self.conv_name], self.conv_weight)
            out = gated_delta_decode(mixed[0], z[0], b[0], a[0], self.A_log, self.dt_bias, state,
                                     self.norm.weight, self.norm.eps, self.num_k_heads, self.head_k_dim,
                                     self.head_v_dim)
            return out.reshape(1, self.value_dim)
        q, k, v = causal_conv1d_sections(mixed, arena[self.conv_name], self.conv_weight,
                                         (self.key_dim, self.key_dim, self.value_dim))
        q = q.reshape(t, self.num_k_heads, self.head_k_dim)   # each key head serves Hv/Hk value heads
        k = k.reshape(t, self.num_k_heads, self.head_k_dim)
        v = v.reshape(t, self.num_v_heads, self.head_v_dim)
        g, beta = gdn_gates(a, b, self.A_log, self.dt_bias)
        out, new_state = chunk_gated_delta_rule(q, k, v, g, beta, state, self.chunk_size)
        state.copy_(new_state)
        out = self.norm(out.to(x.dtype), z.reshape(t, self.num_v_heads, self.head_v_dim))
        return out.reshape(t, self.value_dim)

    def _verify(self, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                state: torch.Tensor, conv_state: torch.Tensor, scratch: VerifyScratch) -> torch.Tensor:
        t = mixed.shape[0]
        window = scratch.conv[self.conv_name]
        width = conv_state.shape[-1]
        window[:, :width].copy_(conv_state)                   # the window before the tokens ...
        window[:, width:width + t].copy_(mixed.transpose(0, 1))   # ... and their conv inputs
        mixed = causal_conv1d_with_state(mixed, conv_state, self.conv_weight)
        out = gated_delta_verify(mixed, z, b, a, self.A_log, self.dt_bias, state,
                                 scratch.recurrent[self.recurrent_name], self.norm.weight, self.norm.eps,
                                 self.num_k_heads, self.head_k_dim, self.head_v_dim)
        return out.reshape(t, self.value_dim)
