"""Query/key RMSNorm, rotary embedding and the KV-cache write of one attention layer, in one launch.

Why: in torch this is per-head norms, cos/sin from the positions, a rotate-half
built from slices and a concatenation, two multiplies and an add, then two
``index_copy_`` into the cache: some thirty kernels per layer and token. Here
one program per (token, head) does it for a query, key or value head, reading
the token's absolute position from the ``positions`` device tensor (graph-safe:
one capture serves every position) and writing keys and values straight into
the static cache rows. Rounding follows the references
(``ops.norms.offset_rms_norm``, ``ops.rope``): cos/sin and each product are
rounded to the model dtype as torch's bf16 arithmetic does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import next_power_of_2


@triton.jit
def _norm_rope_row(src, cols, partner, mask, rot_mask, first_half, pos, inv_freq_ptr, weight_ptr, eps,
                   head_dim, half, HAS_NORM: tl.constexpr, out_dtype: tl.constexpr):
    x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(src + partner, mask=rot_mask, other=0.0).to(tl.float32)
    if HAS_NORM:      # Qwen3-Next q/k norm: x * rstd * (1 + w), rounded to the model dtype
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / head_dim + eps)
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        wp = tl.load(weight_ptr + partner, mask=rot_mask, other=0.0).to(tl.float32)
        x = (x * rstd * (1.0 + w)).to(out_dtype).to(tl.float32)
        xp = (xp * rstd * (1.0 + wp)).to(out_dtype).to(tl.float32)
    freq = tl.load(inv_freq_ptr + (cols % half), mask=rot_mask, other=0.0)
    angle = pos.to(tl.float32) * freq
    cos = tl.cos(angle).to(out_dtype).to(tl.float32)
    sin = tl.sin(angle).to(out_dtype).to(tl.float32)
    rotated = tl.where(first_half, -xp, xp)
    roped = ((x * cos).to(out_dtype).to(tl.float32) + (rotated * sin).to(out_dtype).to(tl.float32))
    return tl.where(rot_mask, roped.to(out_dtype), x.to(out_dtype))


@triton.jit
def _rope_kv_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, positions_ptr, inv_freq_ptr,
                    q_norm_ptr, k_norm_ptr, eps, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                    v_stride_t, v_stride_h, cache_stride, n_heads, n_kv_heads, head_dim, rotary_dim,
                    HAS_NORM: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    j = tl.program_id(1)
    pos = tl.load(positions_ptr + t)
    cols = tl.arange(0, BLOCK)
    mask = cols < head_dim
    half = rotary_dim // 2
    rot_mask = cols < rotary_dim
    first_half = cols < half
    partner = tl.where(first_half, cols + half, cols - half)
    partner = tl.where(rot_mask, partner, cols)
    dtype = q_out_ptr.dtype.element_ty
    if j < n_heads:
        y = _norm_rope_row(q_ptr + t * q_stride_t + j * q_stride_h, cols, partner, mask, rot_mask, first_half,
                           pos, inv_freq_ptr, q_norm_ptr, eps, head_dim, half, HAS_NORM, dtype)
        tl.store(q_out_ptr + (t * n_heads + j) * head_dim + cols, y, mask=mask)
    elif j < n_heads + n_kv_heads:
        h = j - n_heads
        y = _norm_rope_row(k_ptr + t * k_stride_t + h * k_stride_h, cols, partner, mask, rot_mask, first_half,
                           pos, inv_freq_ptr, k_norm_ptr, eps, head_dim, half, HAS_NORM, dtype)
        tl.store(k_cache_ptr + pos * cache_stride + h * head_dim + cols, y.to(k_cache_ptr.dtype.element_ty),
                 mask=mask)
    else:
        h = j - n_heads - n_kv_heads
        v = tl.load(v_ptr + t * v_stride_t + h * v_stride_h + cols, mask=mask, other=0.0)
        tl.store(v_cache_ptr + pos * cache_stride + h * head_dim + cols, v.to(v_cache_ptr.dtype.element_ty),
                 mask=mask)


def rope_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, rotary_dim: int,
                      q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
                      eps: float = 0.0) -> torch.Tensor:
    """Rotate (and, with norm weights, first RMSNorm) ``q [T, H, D]`` and ``k [T, KV, D]``; write k, v.

    Keys and values go to ``k_cache[positions]`` / ``v_cache[positions]``
    (``[S, KV, D]`` views whose rows may be strided, as in the shared
    position-major cache); returns the rotated queries ``[T, H, D]``
    (contiguous). ``q``, ``k``, ``v`` may be strided views of one projection
    output (unit stride in the last dim). The first ``rotary_dim`` dims rotate
    (rotate-half layout); the rest pass through. Norm weights use Qwen3-Next's
    ``1 + w`` scale.
    """
    t, n_heads, head_dim = q.shape
    n_kv = k.shape[1]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} needs unit stride in its last dim")
    if not (k_cache.stride(2) == v_cache.stride(2) == 1 and k_cache.stride(1) == v_cache.stride(1) == head_dim
            and k_cache.stride(0) == v_cache.stride(0)):
        raise ValueError("each cache row must hold its heads contiguously, k and v with one row stride")
    has_norm = q_norm_weight is not None
    q_out = torch.empty((t, n_heads, head_dim), dtype=q.dtype, device=q.device)
    if t:
        _rope_kv_kernel[(t, n_heads + 2 * n_kv)](
            q, k, v, q_out, k_cache, v_cache, positions, inv_freq,
            q_norm_weight if has_norm else inv_freq, k_norm_weight if has_norm else inv_freq, eps,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0),
            n_heads, n_kv, head_dim, rotary_dim, HAS_NORM=has_norm, BLOCK=next_power_of_2(head_dim),
            num_warps=2 if head_dim <= 128 else 4)
    return q_out
