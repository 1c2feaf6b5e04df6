"""RMSNorm variants of Qwen3-Next and Llama, computed in float32 like the references.

Each public function is the torch reference; ``add_rms_norm`` and
``gated_rms_norm`` hand CUDA tensors to one fused triton kernel when triton
imports (``flashrt_ros.ops.triton``), with the same rounding points.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.triton import use_triton


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm scaled by ``1 + weight`` (Qwen3-Next stores the weight zero-centred).

    The product is taken in float32 and cast once at the end: casting before the
    scale (as Llama does) rounds differently and would break parity in bf16.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in float32, cast to the model dtype, then scale by ``weight``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + delta`` (``x`` when ``delta`` is None): a block's residual step.

    ``offset=True`` is Qwen3-Next's ``1 + weight`` norm, ``False`` Llama's.
    """
    if use_triton(x):
        from flashrt_ros.ops.triton.norms import add_rms_norm as fused
        return fused(x, delta, weight, eps, offset=offset)
    total = x if delta is None else x + delta
    return total, (offset_rms_norm if offset else rms_norm)(total, weight, eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x) * silu(gate)``: the norm before the gate, over the last dim."""
    if use_triton(x) and x.dim() == 3:
        from flashrt_ros.ops.triton.gated_deltanet import gated_rms_norm_rows
        return gated_rms_norm_rows(x, gate, weight, eps)
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(dtype)
    return (out * F.silu(gate.float())).to(dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the eps placement fla uses)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)
