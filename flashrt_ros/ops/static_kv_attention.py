"""Attention over a static, preallocated KV cache: the one place both decoders share.

Why a static buffer: the KV cache is an arena buffer of fixed shape
``[max_context, kv_heads, head_dim]``, so writes (at the token positions) and
reads have fixed shapes and a step stays capturable as a CUDA graph for every
position; a capsule restore writes into the same tensor.

Three paths compute the same function:
- CUDA with triton: one kernel normalises/rotates q and k and writes k, v into
  the cache rows, then flash-style kernels attend over the *live* rows only,
  reading the start position from the device (``ops.triton.attention``);
- CUDA without triton: SDPA over the whole buffer under a ``key <= query``
  position mask (graph-safe; costs grow with the buffer, not the position);
- CPU: the same SDPA over the live rows only (the position is a host value
  there, so slicing costs nothing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.norms import offset_rms_norm
from flashrt_ros.ops.rope import apply_partial_rope, rope_cos_sin
from flashrt_ros.ops.triton import use_triton


def write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """Write ``k, v [T, KV, D]`` at ``positions [T]``, attend ``q [T, H, D]``; returns [T, H*D]."""
    t, n_heads, head_dim = q.shape
    k_cache.index_copy_(0, positions, k.to(k_cache.dtype))
    v_cache.index_copy_(0, positions, v.to(v_cache.dtype))
    keys, values = k_cache, v_cache
    if not k_cache.is_cuda:                       # host positions: attend over the live rows only
        end = int(positions[-1]) + 1
        keys, values = k_cache[:end], v_cache[:end]
    key_pos = torch.arange(keys.shape[0], device=positions.device)
    mask = key_pos[None, :] <= positions[:, None]                      # [T, keys]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),                                # [1, H, T, D]
        keys.transpose(0, 1).unsqueeze(0).to(q.dtype),                 # [1, KV, S, D]
        values.transpose(0, 1).unsqueeze(0).to(q.dtype),
        attn_mask=mask, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1).reshape(t, n_heads * head_dim)


def rope_write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                          rotary_dim: int, *, q_norm: torch.Tensor | None = None,
                          k_norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """A whole attention core: [q/k RMSNorm], RoPE, KV write at ``positions``, causal attention.

    ``q [T, H, D]``, ``k, v [T, KV, D]`` (views of the projection output are
    fine); ``positions`` are consecutive absolute positions; the first
    ``rotary_dim`` dims rotate. ``q_norm``/``k_norm``: Qwen3-Next's per-head
    ``1 + w`` RMSNorm weights (None for Llama). Returns ``[T, H*D]``.
    """
    t, n_heads, head_dim = q.shape
    if use_triton(q):
        from flashrt_ros.ops.triton.attention import static_kv_attention
        from flashrt_ros.ops.triton.rope_kv import rope_and_write_kv
        q = rope_and_write_kv(q, k, v, k_cache, v_cache, positions, inv_freq, rotary_dim, q_norm, k_norm, eps)
        return static_kv_attention(q, k_cache, v_cache, positions[:1]).reshape(t, n_heads * head_dim)
    cos, sin = rope_cos_sin(positions, inv_freq, q.dtype)
    if q_norm is not None and k_norm is not None:
        q, k = offset_rms_norm(q, q_norm, eps), offset_rms_norm(k, k_norm, eps)
    q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
    return write_and_attend(q, k, v, k_cache, v_cache, positions)


def project_rope_write_and_attend(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                                  k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                                  inv_freq: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Llama's attention core from the residual stream: the RMSNorm'd fused ``[q; k; v]`` product of ``x [T, K]``,
    RoPE over the whole head, the KV write at ``positions`` and causal attention; returns ``[T, H*D]``.

    Why one function: a decode step's token on CUDA takes the product, RoPE and the KV write as one launch
    (``ops.triton.gemv.gemv_qkv_rope``, the same bits as the separate kernels); otherwise the separate ops
    (``ops.linear.fused_linear`` then ``rope_write_and_attend``)."""
    from flashrt_ros.ops.linear import fused_decode, fused_linear, one_row_on_triton
    head_dim = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    if fused_decode.enabled and one_row_on_triton(x, weight):
        from flashrt_ros.ops.triton.attention import static_kv_attention
        from flashrt_ros.ops.triton.gemv import gemv_qkv_rope
        q = gemv_qkv_rope(x, weight, k_cache, v_cache, positions, inv_freq, n_heads, n_kv_heads, norm="llama",
                          norm_weight=norm_weight, eps=eps)
        return static_kv_attention(q, k_cache, v_cache, positions[:1]).reshape(1, n_heads * head_dim)
    t = x.shape[0]
    q, k, v = fused_linear(x, weight, norm="llama", norm_weight=norm_weight, eps=eps).split(
        [n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    return rope_write_and_attend(q.view(t, n_heads, head_dim), k.view(t, n_kv_heads, head_dim),
                                 v.view(t, n_kv_heads, head_dim), k_cache, v_cache, positions, inv_freq, head_dim)
