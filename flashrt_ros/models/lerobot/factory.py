"""Which of our policies a LeRobot checkpoint becomes, and how its weights load (LeRobot's ``policies/factory.py``).

``load_lerobot_policy(path)`` reads a checkpoint directory as LeRobot 0.4.x's
``save_pretrained`` writes it, builds our model for its ``"type"`` and loads
``model.safetensors`` strictly (a missing or unexpected weight is an error, not
a silently random layer). Node parameter / CLI: ``policy:=lerobot:<dir>``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from flashrt_ros.models.lerobot.checkpoint import CONFIG, LeRobotCheckpoint, read_checkpoint
from flashrt_ros.models.lerobot.precision import cast_keeping_float32
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.runtime.errors import InvalidArgument

SUPPORTED_TYPES = ("act", "diffusion", "smolvla", "pi0", "pi05", "groot")


LOW_PRECISION = (torch.bfloat16, torch.float16)


NUMERICS = ("exact", "fast", "fp8")


def load_lerobot_policy(path: str | Path, dtype: torch.dtype = torch.float32, numerics: str = "exact") -> PolicyModule:
    """The policy stored in a LeRobot checkpoint directory, weights loaded strictly.

    ``dtype``: float32, or bfloat16 / float16 for the networks' weights (see ``cast_networks``).
    ``numerics``: ``exact`` or ``fast`` for the policies that have both (SmolVLA, π0 / π0.5:
    ``use_numerics``), ``fp8`` for π0 / π0.5 (``fast`` on float8 weights; refused elsewhere);
    the others have one arithmetic and accept exact or fast.
    """
    if dtype not in (torch.float32, *LOW_PRECISION):
        raise InvalidArgument(f"dtype {dtype}: use torch.float32, torch.bfloat16 or torch.float16")
    if numerics not in NUMERICS:
        raise InvalidArgument(f"numerics {numerics!r}: use one of {NUMERICS}")
    ckpt = read_checkpoint(path)
    policy = build_policy(ckpt)
    load_weights(policy, ckpt)
    policy = cast_networks(policy, dtype).eval().requires_grad_(False)
    if numerics == "fp8" and not getattr(policy, "has_fp8", False):
        raise InvalidArgument(f"numerics fp8: {type(policy).__name__} has no float8 weights (π0 and π0.5 have); "
                              "use fast or exact")
    if hasattr(policy, "use_numerics"):
        policy.use_numerics(numerics)
    return policy


def default_numerics(device: torch.device | str) -> str:
    """``fast`` on CUDA, ``exact`` elsewhere (the node's ``numerics: auto``)."""
    return "fast" if torch.device(device).type == "cuda" else "exact"


def default_dtype(path: str | Path, device: torch.device) -> torch.dtype:
    """The dtype a checkpoint runs in when none is asked for: bfloat16 for π0 / π0.5 on CUDA (a 3.3 B model;
    LeRobot's own default there) and for GR00T on CUDA when its config keeps LeRobot's ``use_bf16`` (default
    true: bf16 autocast over float32 weights), float32 otherwise (the precision the parity tests check)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    try:
        config = json.loads((Path(path).expanduser() / CONFIG).read_text())
    except (OSError, ValueError):
        return torch.float32                       # load_lerobot_policy reports what is wrong
    kind = config.get("type")
    if kind == "groot":
        return torch.bfloat16 if config.get("use_bf16", True) else torch.float32
    return torch.bfloat16 if kind in ("pi0", "pi05") else torch.float32


def cast_networks(policy: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The networks' weights in ``dtype``; normalisation statistics and fixed weight tables stay fp32.

    Why: an action unnormalised in bf16 keeps ~3 significant digits (a PushT
    target near 500 px would move by 2 px); the arena state, the diffusion sample
    and the scheduler arithmetic are fp32 too, so only the networks run in ``dtype``. The kept tensors keep
    their exact values (``precision.cast_keeping_float32``: no round trip through ``dtype``).
    """
    if hasattr(policy, "cast"):                  # a policy with its own mixed precision (π0)
        policy.cast(dtype)
        return policy
    ensembling = [(policy, n) for n in ("ensemble_weights", "ensemble_weights_cumsum") if hasattr(policy, n)]  # ACT
    cast_keeping_float32(policy, dtype, [policy.norm], ensembling)
    return policy


def build_policy(ckpt: LeRobotCheckpoint) -> PolicyModule:
    """Our model for the checkpoint's ``type`` (weights not yet loaded)."""
    kind = ckpt.policy_type
    if kind == "act":
        from flashrt_ros.models.lerobot.act.configuration_act import ACTConfig
        from flashrt_ros.models.lerobot.act.modeling_act import ACTPolicy
        return ACTPolicy(ACTConfig.from_checkpoint(ckpt), ckpt)
    if kind == "diffusion":
        from flashrt_ros.models.lerobot.diffusion.configuration_diffusion import DiffusionConfig
        from flashrt_ros.models.lerobot.diffusion.modeling_diffusion import DiffusionPolicy
        return DiffusionPolicy(DiffusionConfig.from_checkpoint(ckpt), ckpt)
    if kind == "smolvla":
        from flashrt_ros.models.lerobot.smolvla.modeling_smolvla import build_smolvla
        return build_smolvla(ckpt)
    if kind in ("pi0", "pi05"):
        from flashrt_ros.models.lerobot.pi0.modeling_pi0 import build_pi0
        return build_pi0(ckpt)
    if kind == "groot":
        from flashrt_ros.models.lerobot.groot.modeling_groot import build_groot
        return build_groot(ckpt)
    raise InvalidArgument(f"LeRobot policy type {kind!r} in {ckpt.path}/config.json is not supported "
                          f"(supported: {', '.join(SUPPORTED_TYPES)})")


def load_weights(policy: torch.nn.Module, ckpt: LeRobotCheckpoint) -> None:
    """Strict load; the error lists what the checkpoint lacks and what it has that we do not expect."""
    expected = set(policy.state_dict())
    optional = set(getattr(policy, "OPTIONAL_WEIGHTS", ()))      # present in some checkpoints, never read
    weights = dict(ckpt.weights)
    for name, alias in getattr(policy, "TIED_WEIGHTS", {}).items():   # safetensors keeps one name of a tied pair
        if name not in weights and alias in weights:
            weights[name] = weights[alias]
    weights = {k: v for k, v in weights.items() if k not in optional}
    missing = sorted(expected - set(weights))
    unexpected = sorted(set(weights) - expected)
    if missing or unexpected:
        raise InvalidArgument(f"{ckpt.path}/model.safetensors does not match its config.json: "
                              f"missing {_few(missing)}, unexpected {_few(unexpected)}")
    ours = policy.state_dict()
    bad = [k for k, v in weights.items() if tuple(v.shape) != tuple(ours[k].shape)]
    if bad:
        raise InvalidArgument(f"{ckpt.path}/model.safetensors: shapes differ from config.json for "
                              + _few([f"{k} {tuple(weights[k].shape)} vs {tuple(ours[k].shape)}" for k in bad]))
    policy.load_state_dict(weights, strict=True)


def _few(names: list[str], n: int = 6) -> str:
    return "[]" if not names else ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")
