"""Llama decoder layers (SmolVLA's VLM and action expert) in the ``fast`` numerics: fused, folded, grouped.

Why a second form of the layer: ``smolvla_net.LlamaLayer`` keeps LeRobot's
arithmetic (a float32 RMSNorm, separate q / k / v products, RoPE as torch ops,
float32 attention scores over repeated key heads), about 40 kernels a layer.
Here a layer is four matrix products, one attention and two row kernels
(``ops.fused_rows``), as ``gemma_fast`` does for π0:

- q / k / v are one product and gate / up another; Llama's RMSNorm weight ``w``
  (not Gemma's ``1 + w``) is folded into the product's columns and the row's
  ``rsqrt`` applied after it, inside the row kernel that follows;
- the RoPE of queries and keys and the write of keys and values straight into
  their static rows are one kernel (``qkv_rope``); the output and down products
  add the residual in cuBLAS (``addmm``); the SiLU gate is one row kernel; the
  expert's few rows (a chunk, at most 64) take ``ops.rows_matmul`` instead: one
  kernel a product with the norm, the RoPE, the gate or the residual fused in
  (π0's few-row kernels; the CPU computes the same torch expressions as before);
- attention with grouped key heads (SmolVLM: 15 query heads over 5 key heads)
  without repeating keys: the query heads are stored group-major (head
  ``g * kv_heads + j`` reads key head ``j``; the q rows of the fused weight and
  the output product's columns are permuted once), so each key head's queries
  are the rows ``l * group + g`` of one SDPA over that head, with the static
  key rows as strided views; masked, on CUDA, through the memory-efficient
  kernel (capturable, takes the mask and the strides as they are).

A cross-attention layer of the expert (keys and values projected from the
VLM's prefix keys and values) keeps its k / v products apart (``project_kv``:
once per plan, not once per flow step) and ropes its queries alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import VLMSizes
from flashrt_ros.models.lerobot.smolvla.smolvla_net import LlamaLayer
from flashrt_ros.ops.rows_matmul import gelu_gate_rows, matmul_rows, qkv_rope_rows

#: SDPA's memory-efficient kernel reads a mask without padding it when its rows are 16-element aligned
ALIGN = 16


def _fold(weight: Tensor, norm_weight: Tensor) -> Tensor:
    """``W diag(w)``: Llama's RMSNorm weight folded into the linear layer after it (float32, rounded once)."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def group_major(heads: int, kv_heads: int) -> list[int]:
    """The original head of each group-major slot: slot ``g * kv_heads + j`` holds head ``j * group + g``."""
    group = heads // kv_heads
    return [j * group + g for g in range(group) for j in range(kv_heads)]


def _head_rows(weight: Tensor, order: list[int], head_dim: int) -> Tensor:
    """A projection's output rows (heads of ``head_dim``) in the order ``order``."""
    return weight.view(-1, head_dim, weight.shape[-1])[order].reshape(weight.shape)


class FastLlamaLayer(nn.Module):
    """One layer's fused weights, heads group-major; ``cross``: keys and values come from the prefix."""

    def __init__(self, layer: LlamaLayer, sizes: VLMSizes, cross: bool) -> None:
        super().__init__()
        s = sizes
        self.sizes, self.cross = s, cross
        a, mlp = layer.self_attn, layer.mlp
        order = group_major(s.text_heads, s.text_kv_heads)
        q = _head_rows(a.q_proj.weight, order, s.head_dim)
        if cross:
            self.q = nn.Parameter(_fold(q, layer.input_layernorm.weight), requires_grad=False)
            self.k_in = nn.Parameter(a.k_proj.weight.detach(), requires_grad=False)
            self.v_in = nn.Parameter(a.v_proj.weight.detach(), requires_grad=False)
        else:
            qkv = torch.cat([q, a.k_proj.weight, a.v_proj.weight])
            self.qkv = nn.Parameter(_fold(qkv, layer.input_layernorm.weight), requires_grad=False)
        o = a.o_proj.weight.detach()
        o = o.view(o.shape[0], -1, s.head_dim)[:, order].reshape(o.shape)
        self.o = nn.Parameter(o, requires_grad=False)
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.gate_up = nn.Parameter(_fold(gate_up, layer.post_attention_layernorm.weight), requires_grad=False)
        self.down = nn.Parameter(mlp.down_proj.weight.detach(), requires_grad=False)

    def project_qkv(self, x: Tensor, cos: Tensor, sin: Tensor, k_dst: Tensor, v_dst: Tensor,
                    valid: Tensor | None = None) -> Tensor:
        """Queries ``(L, heads, D)`` (group-major) of the raw residual rows ``x``; keys and values into
        ``k_dst`` / ``v_dst`` (``(L, kv_heads, D)`` static rows; rows from ``valid`` on: zeros)."""
        s = self.sizes
        q = torch.empty(x.shape[0], s.text_heads, s.head_dim, dtype=x.dtype, device=x.device)
        qkv_rope_rows(x, self.qkv, cos, sin, s.text_heads, s.text_kv_heads, q, k_dst, v_dst, norm_eps=s.rms_norm_eps,
                      valid=valid)
        return q

    def project_q(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """A cross-attention layer's queries (its keys and values are ``project_kv``'s)."""
        s = self.sizes
        q = torch.empty(x.shape[0], s.text_heads, s.head_dim, dtype=x.dtype, device=x.device)
        none = q[:, :0]
        qkv_rope_rows(x, self.q, cos, sin, s.text_heads, 0, q, none, none, norm_eps=s.rms_norm_eps)
        return q

    def project_kv(self, keys: Tensor, values: Tensor, k_dst: Tensor, v_dst: Tensor) -> None:
        """A cross-attention layer's keys and values from the prefix's ``(P, kv_heads, D)`` rows, written into
        ``k_dst`` / ``v_dst`` (contiguous rows of the same shape)."""
        rows = keys.shape[0]
        torch.mm(keys.reshape(rows, -1), self.k_in.t(), out=k_dst.view(rows, -1))
        torch.mm(values.reshape(rows, -1), self.v_in.t(), out=v_dst.view(rows, -1))

    def rest(self, x: Tensor, attn: Tensor) -> Tensor:
        """Output product (+ residual), then the MLP with its folded norm (+ residual)."""
        x = matmul_rows(attn, self.o, residual=x)
        return matmul_rows(gelu_gate_rows(x, self.gate_up, norm_eps=self.sizes.rms_norm_eps, silu=True), self.down,
                           residual=x)


#: a masked attention on CUDA: the memory-efficient kernel (masks, capturable), else the math one
MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
ANY_BACKEND = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """``q (L, H, D)`` with group-major heads against ``keys, values (S, kv, D)`` (strided views are fine):
    per key head, its queries as rows ``l * group + g`` of one SDPA. ``mask``: ``grouped_mask``'s.
    Returns ``(L, H * D)`` in the same group-major head order."""
    L, H, D = q.shape
    S, kv, _ = keys.shape
    rows = q.view(L * (H // kv), kv, D).transpose(0, 1)[None]
    with sdpa_kernel(MASKED_BACKENDS if q.is_cuda else ANY_BACKEND):
        out = F.scaled_dot_product_attention(rows, keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                                             attn_mask=mask)
    return out[0].transpose(0, 1).reshape(L, H * D)


def grouped_mask(allowed: Tensor, group: int, dtype: torch.dtype) -> Tensor:
    """The additive mask ``(1, 1, L * group, S)`` of ``grouped_attention`` from a boolean ``(L, S)`` (each
    query row repeated for its ``group`` heads); rows stored 16-aligned so SDPA takes it without a copy."""
    L, S = allowed.shape
    width = -(-S // ALIGN) * ALIGN
    out = torch.full((L * group, width), float("-inf"), dtype=dtype, device=allowed.device)
    out[:, :S].masked_fill_(allowed.repeat_interleave(group, dim=0), 0.0)
    return out[None, None, :, :S]
