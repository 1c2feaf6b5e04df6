"""RMSNorm variants of Qwen3-Next, computed in float32 like the reference."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm scaled by ``1 + weight`` (Qwen3-Next stores the weight zero-centred).

    The product is taken in float32 and cast once at the end: casting before the
    scale (as Llama does) rounds differently and would break parity in bf16.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x) * silu(gate)``: the norm before the gate, over the last dim."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(dtype)
    return (out * F.silu(gate.float())).to(dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the eps placement fla uses)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)
