"""ACT checkpoints written by LeRobot 0.4.4 run in our engine with LeRobot's actions (fp32, CPU).

Each case builds an ACT policy with LeRobot's own classes (seeded random
weights, every norm statistic perturbed), saves it with ``save_pretrained`` and
its pre/post-processors, loads the directory with ``policy:=lerobot:<dir>`` and
compares 60 consecutive steps (several chunk boundaries) with LeRobot's
``preprocessor -> select_action -> postprocessor``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lerobot_reference import (case_features, lerobot, make_checkpoint, max_relative_error, observations,
                               processors, randomize_)
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.runtime.errors import InvalidArgument

STEPS = 60
TOLERANCE = 1e-5
TINY = dict(dim_model=32, n_heads=4, dim_feedforward=64, n_encoder_layers=2, n_decoder_layers=1,
            latent_dim=8, n_vae_encoder_layers=1, chunk_size=10, dropout=0.0, pretrained_backbone_weights=None,
            device="cpu")

CASES = {
    # two non-square cameras, post-norm, VAE weights present, part of each chunk executed, mean-std
    "two_cameras_postnorm_vae_meanstd": dict(
        cameras=2, hw=(40, 56), state=6, env=0, action=5, norm="MEAN_STD",
        cfg=dict(pre_norm=False, use_vae=True, n_action_steps=7)),
    # pre-norm, no VAE, environment state, min-max state/action with a constant joint, two decoder layers
    "prenorm_novae_minmax_env": dict(
        cameras=1, hw=(48, 36), state=4, env=3, action=4, norm="MIN_MAX",
        cfg=dict(pre_norm=True, use_vae=False, n_action_steps=10, n_decoder_layers=2,
                 feedforward_activation="gelu")),
    # temporal ensembling (a chunk every step, averaged with exp(-0.05 i) weights)
    "temporal_ensemble": dict(
        cameras=1, hw=(32, 32), state=3, env=0, action=3, norm="MEAN_STD",
        cfg=dict(pre_norm=False, use_vae=True, n_action_steps=1, temporal_ensemble_coeff=0.05)),
    # no camera: environment state + robot state only, ensembling with a negative coefficient
    "state_only_ensemble_minmax": dict(
        cameras=0, hw=None, state=5, env=4, action=2, norm="MIN_MAX",
        cfg=dict(pre_norm=True, use_vae=False, n_action_steps=1, temporal_ensemble_coeff=-0.02)),
}


def make_act_checkpoint(directory: Path, case: dict, seed: int = 0):
    """An ACT checkpoint directory written by LeRobot; returns (directory, lerobot policy, config)."""
    lerobot()
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors
    return make_checkpoint(directory, case, ACTConfig, ACTPolicy, make_act_pre_post_processors, TINY, seed=seed,
                           constant_dim=True)


def lerobot_actions(policy, config, directory: Path, obs: list[dict]) -> torch.Tensor:
    pre, post = processors(config, directory)
    policy.reset()
    out = []
    with torch.no_grad():
        for o in obs:
            out.append(post(policy.select_action(pre({k: v.clone() for k, v in o.items()})))[0])
    return torch.stack(out)


def engine_actions(engine: PolicyEngine, obs: list[dict]) -> torch.Tensor:
    return torch.stack([engine.step(o) for o in obs])


@pytest.mark.parametrize("name", sorted(CASES))
def test_act_matches_lerobot_select_action_for_60_steps(name, tmp_path):
    case = CASES[name]
    directory, ref_policy, config = make_act_checkpoint(tmp_path / "ckpt", case)
    obs = observations(case_features(case), STEPS, seed=5)
    expected = lerobot_actions(ref_policy, config, directory, obs)
    engine = PolicyEngine(make_policy(f"lerobot:{directory}"), directory=str(tmp_path / "capsules"))
    ours = engine_actions(engine, obs)
    err = max_relative_error(ours, expected)
    print(f"{name}: max relative error {err:.2e} over {STEPS} steps")
    assert err <= TOLERANCE, f"{name}: max relative error {err:.3e}"
    # not trivially constant: the chunk boundaries change the action
    assert (expected[1:] - expected[:-1]).abs().max() > 1e-3


def test_resnet18_trunk_matches_torchvision_resnet18_without_pretrained_weights():
    lerobot()
    import torchvision
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.ops.misc import FrozenBatchNorm2d

    from flashrt_ros.models.lerobot.resnet import ResNetTrunk

    torch.manual_seed(0)
    reference = IntermediateLayerGetter(torchvision.models.resnet18(weights=None, norm_layer=FrozenBatchNorm2d),
                                        return_layers={"layer4": "out"}).eval()
    randomize_(reference, 3)
    ours = ResNetTrunk("resnet18")
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.rand(2, 3, 64, 80, generator=torch.Generator().manual_seed(1))
    expected = reference(x)["out"]
    assert max_relative_error(ours(x), expected) <= TOLERANCE


def test_unknown_policy_type_is_refused_by_name(tmp_path):
    directory, _, _ = make_act_checkpoint(tmp_path / "ckpt", CASES["temporal_ensemble"])
    cfg = json.loads((directory / "config.json").read_text())
    cfg["type"] = "vqbet"
    (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidArgument, match="vqbet.*not supported"):
        make_policy(f"lerobot:{directory}")


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "policy_preprocessor.json",
                                     "policy_postprocessor.json"])
def test_checkpoint_without_a_file_is_refused_naming_it(tmp_path, missing):
    directory, _, _ = make_act_checkpoint(tmp_path / "ckpt", CASES["temporal_ensemble"])
    (directory / missing).unlink()
    with pytest.raises(InvalidArgument, match=missing.replace(".", r"\.")):
        make_policy(f"lerobot:{directory}")


def test_weights_that_do_not_match_the_config_are_refused_naming_them(tmp_path):
    from safetensors.torch import load_file, save_file
    directory, _, _ = make_act_checkpoint(tmp_path / "ckpt", CASES["temporal_ensemble"])
    weights = load_file(str(directory / "model.safetensors"))
    del weights["model.action_head.weight"]
    weights["model.extra.weight"] = torch.zeros(1)
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(InvalidArgument, match=r"missing model\.action_head\.weight.*unexpected model\.extra\.weight"):
        make_policy(f"lerobot:{directory}")


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="not a directory"):
        make_policy(f"lerobot:{tmp_path / 'nowhere'}")
