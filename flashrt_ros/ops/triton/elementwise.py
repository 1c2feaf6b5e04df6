"""Gated elementwise products of the MLP and the attention output: one launch each.

Why: ``silu(gate) * up`` and ``out * sigmoid(gate)`` are two or three kernels in
torch (the activation, the product, a copy of a strided half); at batch 1 each
costs more in launch than in work. The activation is rounded to the model dtype
before the product, as the torch references do.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _gated_product_kernel(gate_ptr, x_ptr, out_ptr, n_cols, gate_stride, x_stride,
                          SILU: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_ptr + row * gate_stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    act = tl.sigmoid(gate)
    if SILU:
        act = gate * act
    act = act.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (act * x).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(gate: torch.Tensor, x: torch.Tensor, silu: bool) -> torch.Tensor:
    rows, n_cols = x.shape
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    if rows and n_cols:
        _gated_product_kernel[(rows, triton.cdiv(n_cols, _BLOCK))](
            gate, x, out, n_cols, gate.stride(0), x.stride(0), SILU=silu, BLOCK=_BLOCK, num_warps=4)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` of shape ``[T, 2I]``; returns ``[T, I]``."""
    half = gate_up.shape[-1] // 2
    return _launch(gate_up[:, :half], gate_up[:, half:], silu=True)


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` for ``[T, N]`` tensors (rows may be strided views)."""
    return _launch(gate, x, silu=False)
