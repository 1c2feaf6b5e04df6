"""Diffusion Policy checkpoints written by LeRobot 0.4.4 run in our engine with LeRobot's actions.

Same noise on both sides: our policy draws its noise from the arena's
counter-based RNG; the test hands the very same tensors to LeRobot (the
initial sample through ``select_action(noise=...)``, the DDPM variance noise by
patching diffusers' ``randn_tensor``), then compares 24 consecutive steps (five or six plans: every step
runs the whole denoising loop, so this is where the test's time goes).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lerobot_reference import (case_features, lerobot, make_checkpoint, max_relative_error, observations,
                               processors)
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_factory import make_policy

STEPS = 24
TOLERANCE = 1e-4
TINY = dict(horizon=8, n_action_steps=4, down_dims=(16, 32), kernel_size=3, n_groups=4,
            diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8, num_train_timesteps=50,
            pretrained_backbone_weights=None, device="cpu")

CASES = {
    # DDPM, epsilon, two non-square cameras through one shared encoder, odd center crop (offset 4.5 -> 4),
    # group norm, min-max state/action
    "ddpm_epsilon_two_cameras_crop": dict(
        cameras=2, hw=(36, 44), state=4, env=0, action=3, norm="MIN_MAX",
        cfg=dict(n_obs_steps=2, noise_scheduler_type="DDPM", prediction_type="epsilon", num_inference_steps=6,
                 crop_shape=(27, 35), use_group_norm=True)),
    # DDIM, sample prediction, one encoder per camera, resize then crop, batch norm, 3 observation steps,
    # environment state, mean-std, linear betas, no clipping
    "ddim_sample_separate_encoders_resize": dict(
        cameras=2, hw=(40, 48), state=3, env=2, action=2, norm="MEAN_STD",
        cfg=dict(n_obs_steps=3, noise_scheduler_type="DDIM", prediction_type="sample", num_inference_steps=5,
                 resize_shape=(30, 38), crop_ratio=0.9, use_group_norm=False,
                 use_separate_rgb_encoder_per_camera=True, beta_schedule="linear", clip_sample=False,
                 n_action_steps=5)),
    # DDIM, epsilon, no camera (environment state), one observation step, FiLM bias only
    "ddim_epsilon_state_only": dict(
        cameras=0, hw=None, state=5, env=4, action=3, norm="MIN_MAX",
        cfg=dict(n_obs_steps=1, noise_scheduler_type="DDIM", prediction_type="epsilon", num_inference_steps=6,
                 use_film_scale_modulation=False, crop_shape=None)),
    # DDPM, sample prediction, one square camera without crop
    "ddpm_sample_one_camera": dict(
        cameras=1, hw=(32, 32), state=2, env=0, action=2, norm="MEAN_STD",
        cfg=dict(n_obs_steps=2, noise_scheduler_type="DDPM", prediction_type="sample", num_inference_steps=6,
                 crop_shape=None)),
}


def make_diffusion_checkpoint(directory: Path, case: dict, seed: int = 0):
    lerobot()
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors
    return make_checkpoint(directory, case, DiffusionConfig, DiffusionPolicy, make_diffusion_pre_post_processors,
                           TINY, seed=seed)


def lerobot_actions(policy, config, directory: Path, obs: list[dict], ours, seed: int, monkeypatch) -> torch.Tensor:
    """LeRobot's actions with our noise: plan p gets ours.noise(seed, p, 0) and DDPM draws 1, 2, ..."""
    import diffusers.schedulers.scheduling_ddpm as ddpm

    pre, post = processors(config, directory)
    draws: list[torch.Tensor] = []
    monkeypatch.setattr(ddpm, "randn_tensor", lambda shape, **kw: draws.pop(0).view(shape))
    policy.reset()
    plan, out = 0, []
    seed_t = torch.tensor(seed)
    with torch.no_grad():
        for o in obs:
            noise = None
            if len(policy._queues["action"]) == 0:
                noise = ours.noise(seed_t, torch.tensor(plan), 0).unsqueeze(0)
                draws[:] = [ours.noise(seed_t, torch.tensor(plan), 1 + j) for j in range(len(ours.steps))]
                plan += 1
            out.append(post(policy.select_action(pre({k: v.clone() for k, v in o.items()}), noise=noise))[0])
    return torch.stack(out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_diffusion_matches_lerobot_select_action_with_the_same_noise(name, tmp_path, monkeypatch):
    case = CASES[name]
    directory, ref_policy, config = make_diffusion_checkpoint(tmp_path / "ckpt", case)
    ours = make_policy(f"lerobot:{directory}")
    engine = PolicyEngine(ours, directory=str(tmp_path / "capsules"))
    engine.capsules.reset(seed=3)
    obs = observations(case_features(case), STEPS, seed=7)
    actions = torch.stack([engine.step(o) for o in obs])
    expected = lerobot_actions(ref_policy, config, directory, obs, ours, 3, monkeypatch)
    err = max_relative_error(actions, expected)
    print(f"{name}: max relative error {err:.2e} over {STEPS} steps")
    assert err <= TOLERANCE, f"{name}: max relative error {err:.3e}"
    assert (expected[1:] - expected[:-1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_diffusion_matches_lerobot_with_its_noise_supplied_from_outside(name, tmp_path):
    """No monkey-patching: LeRobot draws its noise from torch's global RNG, seeded before each
    plan; the same draws reach our engine through the observation (``noise_from_input``)."""
    case = CASES[name]
    directory, ref_policy, config = make_diffusion_checkpoint(tmp_path / "ckpt", case)
    ours = make_policy(f"lerobot:{directory}").noise_from_input()
    engine = PolicyEngine(ours, directory=str(tmp_path / "capsules"))
    obs = observations(case_features(case), STEPS, seed=7)
    pre, post = processors(config, directory)
    K, horizon, act = ours.noise_shape()
    ref_policy.reset()
    plan, expected, actions = 0, [], []
    with torch.no_grad():
        for o in obs:
            noise = torch.zeros(K, horizon, act)
            if len(ref_policy._queues["action"]) == 0:          # both replan on this step
                torch.manual_seed(100 + plan)                    # LeRobot's draws, in its order:
                noise[0] = torch.randn(1, horizon, act)[0]       # the initial sample, then one per
                for j, step in enumerate(ours.steps):            # DDPM step that adds noise
                    if step.sigma > 0:
                        noise[1 + j] = torch.randn(1, horizon, act)[0]
                torch.manual_seed(100 + plan)
                plan += 1
            expected.append(post(ref_policy.select_action(pre({k: v.clone() for k, v in o.items()})))[0])
            actions.append(engine.step({**o, ours.NOISE: noise.flatten()}))
    err = max_relative_error(torch.stack(actions), torch.stack(expected))
    print(f"{name}: max relative error {err:.2e} over {STEPS} steps")
    assert err <= TOLERANCE, f"{name}: max relative error {err:.3e}"
    engine.close()


def test_center_crop_offsets_round_like_torchvision():
    lerobot()
    import torchvision.transforms.functional as TF

    from flashrt_ros.models.lerobot.diffusion.diffusion_net import center_crop
    x = torch.rand(1, 3, 37, 44)
    for size in [(27, 35), (28, 35), (36, 43), (37, 44), (10, 11)]:
        assert torch.equal(center_crop(x, size), TF.center_crop(x, list(size))), size
