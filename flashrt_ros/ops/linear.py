"""``nn.Linear`` whose batch-1 products on CUDA run as our triton GEMV.

Why a subclass: state dicts, loaders and ``.to()`` keep working unchanged
(same parameter names), while a decode step's matrix-vector products (one
row of input) skip cuBLAS, whose GEMM tiles waste most of their work and, for
short reductions, add a split-K reduction kernel (benchmarks/kernel_gemv.py).
Everything else (prefill, CPU, bias) is ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.ops.triton import Switch, use_triton

#: ``fused_linear``'s one-launch decode path (a benchmark compares it with the unfused ops in one process)
fused_decode = Switch()


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def one_row_on_triton(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` is a decode step's one row on CUDA with triton, in ``weight``'s dtype: the GEMV kernels' case."""
    return x.dim() == 2 and x.shape[0] == 1 and use_triton(x) and weight.dtype == x.dtype


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, but one row on CUDA without a bias is our GEMV."""
    if bias is None and one_row_on_triton(x, weight):
        from flashrt_ros.ops.triton.gemv import gemv
        return gemv(x, weight)
    return F.linear(x, weight, bias)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, *, norm: str | None = None,
                 norm_weight: torch.Tensor | None = None, eps: float = 0.0, epilogue: str = "store",
                 residual: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``epilogue(norm(x) W^T)`` for rows ``x [T, K]``: a decode step's norm, product and residual add or
    SwiGLU gate. ``norm``: None, ``"llama"`` (``ops.norms.rms_norm``) or ``"offset"`` (``offset_rms_norm``);
    ``epilogue``: ``"store"``, ``"residual"`` (``residual + product``) or ``"silu_gate"`` (``weight`` is
    ``[gate; up]``: ``ops.gating.silu_mul``); ``bias``: added to the product (separate ops).

    Why here: one row on CUDA is one launch (``ops.triton.gemv.gemv_fused``); otherwise the same rounding
    points as separate ops (the norm as ``ops.norms.add_rms_norm``'s, fused on CUDA; the product through
    cuBLAS), so a model written with it computes on the CPU what it computed with those ops."""
    from flashrt_ros.ops.gating import silu_mul
    from flashrt_ros.ops.norms import add_rms_norm
    if fused_decode.enabled and bias is None and one_row_on_triton(x, weight):
        from flashrt_ros.ops.triton.gemv import gemv_fused
        return gemv_fused(x, weight, norm=norm, norm_weight=norm_weight, eps=eps, epilogue=epilogue,
                          residual=residual)
    h = x if norm is None else add_rms_norm(x, None, norm_weight, eps, offset=norm == "offset")[1]
    y = linear(h, weight, bias)
    if epilogue == "residual":
        return residual + y
    return silu_mul(y) if epilogue == "silu_gate" else y
