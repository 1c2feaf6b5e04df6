"""Tiny ACT / Diffusion policies built from our own classes with seeded random weights (no LeRobot needed).

Used by the capsule, CUDA-graph and benchmark code, which test our state
handling rather than parity (parity: test_lerobot_act.py / test_lerobot_diffusion.py).
"""
from __future__ import annotations

import torch

from flashrt_ros.models.lerobot.act.configuration_act import ACTConfig
from flashrt_ros.models.lerobot.act.modeling_act import ACTPolicy
from flashrt_ros.models.lerobot.diffusion.configuration_diffusion import DiffusionConfig
from flashrt_ros.models.lerobot.diffusion.modeling_diffusion import DiffusionPolicy
from flashrt_ros.models.registry import randomize_

CAMERA = "observation.images.top"


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded weights (``registry.randomize_``) and LeRobot's keypoint grid in [-1, 1]."""
    randomize_(module, seed)
    with torch.no_grad():
        for name, t in module.named_buffers():
            if name.endswith("pos_grid"):
                n = t.shape[0]
                t.copy_(torch.linspace(-1, 1, 2 * n).view(n, 2))
    return module.eval().requires_grad_(False)


def tiny_act(*, ensemble: bool = False, hw: tuple[int, int] = (32, 40), seed: int = 0, **kw) -> ACTPolicy:
    cfg = ACTConfig(state_dim=4, env_state_dim=0, action_dim=3, cameras=(CAMERA,), image_shape=(3, *hw),
                    chunk_size=8, n_action_steps=1 if ensemble else 5, dim_model=32, n_heads=4,
                    dim_feedforward=64, n_encoder_layers=2, n_decoder_layers=1, latent_dim=8,
                    n_vae_encoder_layers=1, temporal_ensemble_coeff=0.01 if ensemble else None, **kw)
    with torch.random.fork_rng(devices=[]):       # default inits (kept for vectors) independent of the test order
        torch.manual_seed(seed)
        return randomize(ACTPolicy(cfg), seed)


def tiny_diffusion(*, scheduler: str = "DDIM", steps: int = 4, hw: tuple[int, int] = (32, 40), seed: int = 0,
                   **kw) -> DiffusionPolicy:
    args = dict(state_dim=4, env_state_dim=0, action_dim=3, cameras=(CAMERA,), image_shape=(3, *hw),
                n_obs_steps=2, horizon=8, n_action_steps=4, crop_shape=(28, 36), down_dims=(16, 32),
                kernel_size=3, n_groups=4, diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8,
                noise_scheduler_type=scheduler, num_train_timesteps=20, num_inference_steps=steps)
    args.update(kw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return randomize(DiffusionPolicy(DiffusionConfig(**args)), seed)


def episode_observations(policy, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append({k: torch.rand(spec.shape, generator=gen) if spec.kind == "image" else torch.randn(spec.shape, generator=gen)
                    for k, spec in policy.input_features().items()})
    return out
