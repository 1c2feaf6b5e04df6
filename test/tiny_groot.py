"""The tiny GR00T N1.5 of the engine-side tests: LeRobot's checkpoint (``groot_reference``) and its observations."""
from __future__ import annotations

from pathlib import Path

import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.runtime.arena import StateArena

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


def counter_noise_reference(root: Path, **case_fields) -> tuple:
    """LeRobot's tiny GR00T episode (17 steps, a replan every 8: 3 plans) given our counter stream's noise (seed 0,
    plan p: ``ops.counter_rng.normal(0, p)``) in place of its draws: (case, reference_inputs, reference_record).
    ``case_fields``: more ``groot_reference.Case`` fields (``use_bf16=True``: LeRobot's bf16 autocast)."""
    from groot_reference import Case, reference_inputs, reference_record, run_reference
    from safetensors.torch import save_file

    from flashrt_ros.ops.counter_rng import normal
    h, m, plans = 16, 8, 3                                   # TINY: horizon 16, max_action_dim 8; 17 steps / 8
    noise = torch.stack([normal(torch.tensor(0), torch.tensor(p), h * m).view(1, h, m) for p in range(plans)])
    save_file({"noise": noise}, str(root / "noise.safetensors"))
    case = Case(directory=str(root / "a"), attn="sdpa", n_action_steps=8, steps=17,
                noise_file=str(root / "noise.safetensors"), **case_fields)
    run_reference([case], root / "spec")
    return case, reference_inputs(case), reference_record(case)


def reference_observations(case, inputs: dict) -> list[dict[str, torch.Tensor]]:
    """The reference episode's inputs (``groot_reference.reference_inputs``) as one observation a step: the state
    and every camera's uint8 frame, under the policy's feature names."""
    return [{STATE: inputs["observation.state"][step],
             **{f"observation.images.cam{i}": inputs[f"observation.images.cam{i}"][step] for i in range(case.cameras)}}
            for step in range(case.steps)]


def arena_episode(policy: GrootPolicy, case, inputs: dict) -> tuple[list[torch.Tensor], list[int], StateArena]:
    """The reference's episode inputs stepped through an arena, a replan whenever the queue is empty: the
    actions, the steps that replanned, the arena."""
    arena = StateArena(policy.state_specs())
    policy.init_state(arena)
    actions, replans = [], []
    for step, observation in enumerate(reference_observations(case, inputs)):
        replan = int(arena[policy.LEFT]) == 0
        replans += [step] if replan else []
        with torch.no_grad():
            actions.append(policy.step_observation(observation, arena, replan))
    return actions, replans, arena
