"""Policy actions -> command values for ros2_control-style outputs.

A plain action becomes one list of floats (``Float64MultiArray`` for a forward
command controller, ``JointState.position``); a planned chunk becomes trajectory
points one control period apart, the action just taken first.
"""
from __future__ import annotations

from typing import Sequence

import torch

from flashrt_ros.runtime.errors import InvalidArgument


def command_values(action: torch.Tensor | Sequence[float], expected: int) -> list[float]:
    """The action (or a hold command) as Python floats, checked against the commanded joints."""
    values = [float(v) for v in (action.detach().reshape(-1).to(torch.float64).cpu().tolist()
                                 if isinstance(action, torch.Tensor) else action)]
    if expected and len(values) != expected:
        raise InvalidArgument(f"the policy's action has {len(values)} values but "
                              f"{expected} command joints are configured")
    return values


def trajectory_points(action: torch.Tensor | Sequence[float], planned: torch.Tensor | Sequence,
                      period_s: float) -> list[tuple[list[float], float]]:
    """``(positions, time_from_start_s)`` for the action (at one period) and each planned one after it."""
    first = command_values(action, 0)
    rest = (planned.reshape(-1, len(first)).to(torch.float64).cpu().tolist()
            if isinstance(planned, torch.Tensor) else [list(map(float, p)) for p in planned])
    return [(row, (i + 1) * period_s) for i, row in enumerate([first, *rest])]
