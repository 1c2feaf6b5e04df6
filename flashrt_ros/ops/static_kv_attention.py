"""Attention over a static, preallocated KV cache: the one place both decoders share.

Why a static buffer with a position mask: the KV cache is an arena buffer of
fixed shape [max_context, kv_heads, head_dim], so writes (index_copy_ at the
token positions) and reads have fixed shapes and the step stays capturable as a
CUDA graph for every position; a capsule restore writes into the same tensor.
Rows past the current position are masked out, so their contents never matter.
(The mask rules out flash SDPA kernels: the price of one graph for all positions.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """Write ``k, v [T, KV, D]`` at ``positions [T]``, attend ``q [T, H, D]``; returns [T, H*D]."""
    t, n_heads, head_dim = q.shape
    k_cache.index_copy_(0, positions, k.to(k_cache.dtype))
    v_cache.index_copy_(0, positions, v.to(v_cache.dtype))
    key_pos = torch.arange(k_cache.shape[0], device=positions.device)
    mask = key_pos[None, :] <= positions[:, None]                      # [T, max_context]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),                                # [1, H, T, D]
        k_cache.transpose(0, 1).unsqueeze(0).to(q.dtype),              # [1, KV, S, D]
        v_cache.transpose(0, 1).unsqueeze(0).to(q.dtype),
        attn_mask=mask, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1).reshape(t, n_heads * head_dim)
