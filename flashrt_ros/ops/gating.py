"""Gated elementwise products: SwiGLU's ``silu(gate) * up`` and an output gate ``x * sigmoid(gate)``.

The torch expressions are the reference; CUDA tensors take one fused triton
kernel each (``flashrt_ros.ops.triton.elementwise``) when triton imports.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.triton import use_triton


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` ``[T, 2I]``; returns ``[T, I]``."""
    if use_triton(gate_up) and gate_up.dim() == 2:
        from flashrt_ros.ops.triton.elementwise import silu_mul as fused
        return fused(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` (same shapes; ``gate`` may be a strided view)."""
    if use_triton(x) and x.dim() == 2:
        from flashrt_ros.ops.triton.elementwise import sigmoid_mul as fused
        return fused(x, gate)
    return x * torch.sigmoid(gate)
