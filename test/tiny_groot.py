"""The tiny GR00T N1.5 of the engine-side tests: LeRobot's checkpoint (``groot_reference``) and its observations."""
from __future__ import annotations

from pathlib import Path

import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.models.policy_features import STATE

N = 5                                       # n_action_steps: the last 5 rows of the 16-row chunk are queued


def tiny_checkpoint(root: Path) -> Path:
    """LeRobot's tiny GR00T (seeded weights, ``N`` actions a replan, SDPA attention) written under ``root``."""
    from groot_reference import Case, run_reference
    case = Case(directory=str(root / "a"), attn="sdpa", n_action_steps=N, steps=1)
    run_reference([case], root / "spec")
    return case.path


def observation(i: int, policy: GrootPolicy) -> dict[str, torch.Tensor]:
    """Observation ``i``: a seeded state and a float frame in [0, 1] for every camera (resized to the tile)."""
    cfg = policy.cfg
    g = torch.Generator().manual_seed(100 + i)
    obs = {STATE: torch.randn(cfg.state_dim, generator=g)}
    for cam in cfg.cameras:
        obs[cam] = torch.rand(cfg.image_shape, generator=g)
    return obs


def run(engine: PolicyEngine, start: int, n: int) -> torch.Tensor:
    """The actions of observations ``start`` .. ``start + n - 1``, one step each, on the engine's device (the
    actions come back on the CPU)."""
    device = engine.arena.block.device
    return torch.stack([engine.step({k: v.to(device) for k, v in observation(start + i, engine.policy).items()})
                        .cpu() for i in range(n)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the largest |b|: the tiny GR00T tests' measure."""
    return float((a - b).abs().max() / b.abs().max())
