"""Residual add fused with the RMSNorm that follows it: one launch instead of about ten.

Why: every decoder block does ``x = x + delta`` and then normalises ``x``; in
torch that is an add, a cast, a square, a mean, an rsqrt, two multiplies and
casts back, each its own kernel. Here one program per row does all of it and
writes both the new residual stream and the normalised row. The rounding
points are those of the torch references (``ops.norms.offset_rms_norm`` for
Qwen3-Next's ``1 + weight`` norm, ``models.llama.RMSNorm`` for Llama's), so the
two paths differ only by float32 summation order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import next_power_of_2


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, n_cols, x_stride, delta_stride,
                         eps, HAS_DELTA: tl.constexpr, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * delta_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if OFFSET:      # Qwen3-Next: scale by (1 + w) in float32, one cast at the end
        y = normed * (1.0 + weight)
    else:           # Llama: cast the normalised row first, then multiply in the model dtype
        y = normed.to(out_ptr.dtype.element_ty).to(tl.float32) * weight
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rmsnorm(s))`` with ``s = x + delta`` (or ``x`` when ``delta`` is None), over the last dim.

    ``x``/``delta`` ``[..., D]`` with unit stride in the last dim; returns two
    new contiguous tensors of ``x``'s shape and dtype (``s`` is ``x`` itself when
    there is no delta).
    """
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    if delta is None:
        total, d2 = x, x2
    else:
        d2 = delta.reshape(-1, n_cols)
        if d2.stride(-1) != 1:
            d2 = d2.contiguous()
        total = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    if rows:
        block = next_power_of_2(n_cols)
        _add_rms_norm_kernel[(rows,)](
            x2, d2, weight, total, out, n_cols, x2.stride(0), d2.stride(0), eps,
            HAS_DELTA=delta is not None, OFFSET=offset, BLOCK=block, num_warps=4 if block <= 1024 else 8)
    return total.reshape(x.shape), out.reshape(x.shape)
