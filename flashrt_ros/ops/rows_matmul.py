"""A linear layer over a few rows with its row work fused in: a folded norm, a residual, a gated GELU, RoPE.

Why: a VLA expert's flow step multiplies 50-51 rows by each weight matrix, where
the product is bound by reading the weights and every extra launch (the RoPE, the
gate, a residual copy, split-K reductions) costs as much again; the triton path
(``ops.triton.rows_matmul``, CUDA tensors of at most ``MAX_ROWS`` rows) is one
kernel per product. The torch expressions here are the reference and the path for
everything else (CPU, a prefix's hundreds of rows: cuBLAS plus the row kernels of
``ops.fused_rows``).

``scale``: the weights are float8 (E4M3) with one float32 scale per output row
(``ops.fp8``): few rows take the fused kernel (weight-only FP8), more rows the scaled
matmul of ``ops.fp8.fp8_linear`` (activations quantised per row too); a CPU computes the
same functions with widened operands.
"""
from __future__ import annotations

import torch

from flashrt_ros.ops.fp8 import fp8_linear, weight_only_linear
from flashrt_ros.ops.fused_rows import gelu_gate, qkv_rope, silu_gate
from flashrt_ros.ops.triton import Switch, use_triton

#: at most this many rows take the fused kernel (the tile holds them all)
MAX_ROWS = 64
#: the fused few-row kernels alone (a benchmark compares them with cuBLAS + the row kernels in one process)
few_row_kernels = Switch()


def _fused(x: torch.Tensor) -> bool:
    return few_row_kernels.enabled and use_triton(x) and x.shape[0] <= MAX_ROWS


def _product(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T``; with float8 weights what the GPU computes for these rows (``ops.fp8``): few rows weight-only
    (the fused kernel's function), more rows the scaled product with the activations quantised too."""
    if scale is None:
        return x @ w.t()
    return weight_only_linear(x, w, scale) if x.shape[0] <= MAX_ROWS else fp8_linear(x, w, scale)


def matmul_rows(x: torch.Tensor, w: torch.Tensor, *, residual: torch.Tensor | None = None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[residual +] x @ w.T`` (``w (N, K)``), accumulated in float32 and rounded once."""
    if _fused(x):
        from flashrt_ros.ops.triton.rows_matmul import rows_matmul
        return rows_matmul(x, w, residual=residual, scale=scale)
    if scale is None:
        return x @ w.t() if residual is None else torch.addmm(residual, x, w.t())
    product = _product(x, w, scale)
    return product if residual is None else residual + product


def gelu_gate_rows(x: torch.Tensor, w: torch.Tensor, *, scale: torch.Tensor | None = None,
                   norm_eps: float | None = None, silu: bool = False) -> torch.Tensor:
    """``ops.fused_rows.gelu_gate`` (``silu``: ``silu_gate``, Llama's MLP) of ``x @ w.T`` (``w = [gate | up]
    (2F, K)``); ``norm_eps``: ``x`` are the raw rows of a folded RMSNorm."""
    if _fused(x):
        from flashrt_ros.ops.triton.rows_matmul import rows_gelu_gate
        return rows_gelu_gate(x, w, scale=scale, norm_eps=norm_eps, silu=silu)
    product = _product(x, w, scale)
    gate = silu_gate if silu else gelu_gate
    return gate(product) if norm_eps is None else gate(product, x=x, eps=norm_eps)


def qkv_rope_rows(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                  q_out: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor, *, scale: torch.Tensor | None = None,
                  norm_eps: float | None = None, valid: torch.Tensor | None = None) -> None:
    """``ops.fused_rows.qkv_rope`` of ``x @ w.T`` (``w`` the fused q / k / v weights); ``norm_eps`` as above."""
    if _fused(x) and q_out.shape[-1] % 32 == 0:        # a program takes 16 columns of each half of a head
        from flashrt_ros.ops.triton.rows_matmul import rows_qkv_rope
        rows_qkv_rope(x, w, cos, sin, heads, kv_heads, q_out, k_out, v_out, scale=scale, norm_eps=norm_eps,
                      valid=valid)
        return
    product = _product(x, w, scale)
    if norm_eps is None:
        qkv_rope(product, cos, sin, heads, kv_heads, q_out, k_out, v_out, valid=valid)
    else:
        qkv_rope(product, cos, sin, heads, kv_heads, q_out, k_out, v_out, x=x, eps=norm_eps, valid=valid)
