"""GroupNorm -> Mish (-> FiLM or residual add): the Diffusion Policy UNet's block tail.

The torch reference below is what LeRobot computes (``nn.GroupNorm``, ``Mish``,
``scale * x + bias`` / ``x + bias``, ``+ residual``); CUDA tensors go to one
fused triton kernel (``ops.triton.group_norm``) when triton imports.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.ops.triton import use_triton


def group_norm_mish(x: torch.Tensor, norm: nn.GroupNorm, *, film: torch.Tensor | None = None,
                    film_scale: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``mish(norm(x))``, then FiLM (``film (B, 2C, 1)`` scale and bias, or ``(B, C, 1)`` bias), then ``+ residual``."""
    if use_triton(x):
        from flashrt_ros.ops.triton.group_norm import group_norm_mish as fused
        return fused(x, norm.weight, norm.bias, norm.num_groups, norm.eps, film=film, film_scale=film_scale,
                     residual=residual)
    y = F.mish(norm(x))
    if film is not None:
        c = x.shape[1]
        y = film[:, :c] * y + film[:, c:] if film_scale else y + film
    return y if residual is None else y + residual
