"""The flow-matching time embedding SmolVLA and π0 / π0.5 condition their action expert on.

Why shared and precomputed: both embed each Euler step's flow time with LeRobot's
``create_sinusoidal_pos_embedding`` (in float64), and the steps are fixed by
``num_steps``, so the table is made once at construction and a step only reads
its row (no host scalar in a captured graph). The times themselves, and the
Euler loop over them, are ``models.rtc`` (``flow_times``, ``integrate_flow``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from flashrt_ros.models.rtc import flow_times


def flow_time_embeddings(num_steps: int, dim: int, min_period: float, max_period: float) -> Tensor:
    """``(num_steps, dim)``: the Euler times 1, 1 - 1/K, ... as LeRobot forms them (float32), embedded in float64."""
    times = torch.tensor(flow_times(num_steps), dtype=torch.float32)
    return sinusoidal_time(times.to(torch.float64), dim, min_period, max_period)


def sinusoidal_time(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """LeRobot's ``create_sinusoidal_pos_embedding`` in float64: ``t (B,)`` -> ``(B, dim)``."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    x = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return torch.cat([torch.sin(x), torch.cos(x)], dim=1)
