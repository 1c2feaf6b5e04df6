"""Partial rotary position embedding (rotate-half layout) driven by a position tensor.

Why from a tensor: cos/sin are recomputed from ``positions`` on every call, so a
captured graph replays correctly for any position without a host-side table index.
"""
from __future__ import annotations

import torch


def rope_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """Inverse frequencies for the first ``rotary_dim`` dims of a head (float32)."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (theta ** exponent)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, rotary_dim]`` for absolute ``positions [T]`` (computed in float32)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x [T, heads, head_dim]``; pass the rest through."""
    rot_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    half = rot_dim // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    x_rot = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((x_rot, x_pass), dim=-1)
