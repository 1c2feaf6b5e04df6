"""Norm modules of the hybrid decoder (thin holders of weights; the math is in flashrt_ros.ops)."""
from __future__ import annotations

import torch
from torch import nn

from flashrt_ros.ops import gated_rms_norm, offset_rms_norm
from flashrt_ros.ops.norms import add_rms_norm


class OffsetRMSNorm(nn.Module):
    """Qwen3-Next RMSNorm: scale ``1 + weight``, weight initialised to zero."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + delta, norm(x + delta))`` (``delta`` None: ``(x, norm(x))``), fused on CUDA."""
        return add_rms_norm(x, delta, self.weight, self.eps, offset=True)


class GatedRMSNorm(nn.Module):
    """``weight * rmsnorm(x) * silu(gate)`` on the Gated DeltaNet output (plain weight, init one)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)
