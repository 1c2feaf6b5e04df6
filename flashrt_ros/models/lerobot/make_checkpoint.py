"""A LeRobot ACT checkpoint with cameras, written by our own classes: to try the robot quick start without a
trained policy and without LeRobot installed.

Why: the README's quick start needs a camera checkpoint (``$CKPT``); a new user may have
none yet, and LeRobot (which could write one) does not install beside our pins. This
writes what ``save_pretrained`` and LeRobot's processors write for an ACT policy
(``config.json``, ``model.safetensors``, the pre/post-processor files with their
normalisation statistics) with seeded random weights of the configured architecture
(a ResNet-18 backbone per the config, small transformer dimensions), checked by loading
it back strictly. Its actions are noise around zero: it exercises the wiring (topics,
rates, capsules), not a task.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from flashrt_ros.models.lerobot.checkpoint import CONFIG, POSTPROCESSOR, PREPROCESSOR, WEIGHTS, read_checkpoint
from flashrt_ros.runtime.errors import InvalidArgument

_NORM_MAP = {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ENV": "MEAN_STD", "ACTION": "MEAN_STD"}
_PRE_STATE = "policy_preprocessor_step_3_normalizer_processor.safetensors"
_POST_STATE = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
#: the ACT fields that shape the network (LeRobot 0.4.4's names), small but of the real architecture
_ACT = dict(n_obs_steps=1, chunk_size=20, n_action_steps=10, vision_backbone="resnet18",
            pretrained_backbone_weights=None, replace_final_stride_with_dilation=False, pre_norm=False,
            dim_model=64, n_heads=4, dim_feedforward=256, feedforward_activation="relu", n_encoder_layers=2,
            n_decoder_layers=1, use_vae=False, latent_dim=32, n_vae_encoder_layers=4, temporal_ensemble_coeff=None,
            dropout=0.0, kl_weight=10.0)


def _features(joints: int, cameras: Sequence[str], image_hw: tuple[int, int]) -> tuple[dict, dict]:
    inputs = {"observation.state": {"type": "STATE", "shape": [joints]}}
    for camera in cameras:
        inputs[camera] = {"type": "VISUAL", "shape": [3, image_hw[0], image_hw[1]]}
    return inputs, {"action": {"type": "ACTION", "shape": [joints]}}


def _stats(features: dict) -> dict[str, torch.Tensor]:
    """Identity statistics for the state and action (mean 0, std 1), ImageNet's for the cameras."""
    out: dict[str, torch.Tensor] = {}
    for name, ft in features.items():
        if ft["type"] == "VISUAL":
            out[f"{name}.mean"] = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
            out[f"{name}.std"] = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
        else:
            n = ft["shape"][0]
            out[f"{name}.mean"], out[f"{name}.std"] = torch.zeros(n), torch.ones(n)
            out[f"{name}.min"], out[f"{name}.max"] = -torch.ones(n), torch.ones(n)
    return out


def _processor(name: str, step: dict, before: list[dict], after: list[dict]) -> dict:
    return {"name": name, "steps": [*before, step, *after]}


def make_act_checkpoint(directory: Path, joints: int, cameras: Sequence[str], image_hw: tuple[int, int] = (96, 128),
                        seed: int = 0) -> Path:
    """Write the checkpoint into ``directory`` (created; must be empty or absent) and load it back."""
    directory = Path(directory).expanduser()
    if joints < 1:
        raise InvalidArgument(f"--joints must be >= 1 (got {joints})")
    if not cameras or len(set(cameras)) != len(cameras):
        raise InvalidArgument(f"give one or more distinct camera features (got {list(cameras)})")
    bad = [c for c in cameras if not c.startswith("observation.images.") or c == "observation.images."]
    if bad:
        raise InvalidArgument(f"camera features are named observation.images.<name> (got {bad})")
    if min(image_hw) < 32:
        raise InvalidArgument(f"images must be at least 32x32 for the ResNet-18 backbone (got {image_hw})")
    if directory.exists() and any(directory.iterdir()):
        raise InvalidArgument(f"{directory} exists and is not empty: give a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    inputs, outputs = _features(joints, cameras, image_hw)
    config = {"type": "act", "input_features": inputs, "output_features": outputs, "device": "cpu",
              "use_amp": False, "normalization_mapping": _NORM_MAP, **_ACT}
    (directory / CONFIG).write_text(json.dumps(config, indent=4))
    normalizer = {"registry_name": "normalizer_processor",
                  "config": {"eps": 1e-8, "features": {**inputs, **outputs}, "norm_map": _NORM_MAP},
                  "state_file": _PRE_STATE}
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    pre = _processor("policy_preprocessor", normalizer,
                     [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                      {"registry_name": "to_batch_processor", "config": {}}, device], [])
    post = _processor("policy_postprocessor", {**normalizer, "registry_name": "unnormalizer_processor",
                                               "config": {**normalizer["config"], "features": outputs},
                                               "state_file": _POST_STATE}, [], [device])
    (directory / PREPROCESSOR).write_text(json.dumps(pre, indent=2))
    (directory / POSTPROCESSOR).write_text(json.dumps(post, indent=2))
    stats = _stats({**inputs, **outputs})
    save_file(stats, str(directory / _PRE_STATE))
    save_file({k: v for k, v in stats.items() if k.startswith("action.")}, str(directory / _POST_STATE))
    save_file({}, str(directory / WEIGHTS))                        # read_checkpoint needs the file to build
    from flashrt_ros.models.lerobot.act.configuration_act import ACTConfig
    from flashrt_ros.models.lerobot.act.modeling_act import ACTPolicy
    ckpt = read_checkpoint(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = ACTPolicy(ACTConfig.from_checkpoint(ckpt), ckpt)
    weights = {k: v.detach().contiguous() for k, v in policy.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS))
    from flashrt_ros.models.lerobot.factory import load_lerobot_policy
    load_lerobot_policy(directory)                                 # strict: the files are what we read
    return directory
