"""LeRobot 0.4.4 as a test-time reference: import it, and write checkpoints with its own classes.

Why test-only: LeRobot's pins conflict with ours (torch < 2.11 and more), so
``scripts/install_lerobot_reference.sh`` installs it without its dependency tree
into ``.venv/lerobot-reference`` (pinned in ``requirements-lerobot-reference.txt``),
which only these tests put on ``sys.path`` (appended: the test environment's own
packages win). The runtime never imports it.

torchvision workaround: PyPI's torchvision wheel is a CUDA build; with our CPU
torch its compiled ops do not load, and ``import torchvision`` fails while
registering meta kernels for them ("operator torchvision::nms does not exist").
ACT and Diffusion Policy use only pure-torch parts (resnet, FrozenBatchNorm2d,
Resize, CenterCrop), so we skip that registration module.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = ROOT / ".venv" / "lerobot-reference"


def _torchvision_without_compiled_ops() -> None:
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
        return
    except (RuntimeError, ImportError, OSError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import torchvision  # noqa: F401,F811


def use_reference_packages() -> bool:
    """Put the reference's packages (torchvision, diffusers, lerobot ...) behind ours on sys.path.

    Called by conftest at session start, before any test imports transformers: transformers
    decides once, at its first import, whether torchvision exists (and builds placeholders for
    what needs it, e.g. SmolVLM's video processor), so a reference that appeared later, after
    the hybrid or Llama parity tests had imported transformers, left SmolVLA's reference broken.
    """
    if not (REFERENCE_DIR / "lerobot").is_dir():
        return False
    if str(REFERENCE_DIR) not in sys.path:
        sys.path.append(str(REFERENCE_DIR))
    _torchvision_without_compiled_ops()
    return True


def lerobot():
    """The ``lerobot`` package (skips with the install command if the reference is not installed)."""
    # without the folder, lerobot may still be installed (the GPU machine: from wheels)
    if not use_reference_packages() and importlib.util.find_spec("lerobot") is None:
        pytest.skip(f"LeRobot reference not installed: run scripts/install_lerobot_reference.sh "
                    f"(expected in {REFERENCE_DIR})")
    _torchvision_without_compiled_ops()
    _skip_package_init("lerobot.policies.groot")
    return importlib.import_module("lerobot")


def _skip_package_init(package: str) -> None:
    """Make ``package`` importable without running its ``__init__``.

    Why: ``lerobot.policies`` imports ``groot.configuration_groot``, and the
    ``groot`` package's ``__init__`` imports its model, which fails to build its
    dataclasses against the transformers releases we pin. Its configuration and
    its action head (``action_head/``) import fine; the whole GR00T policy is the
    separate reference in ``groot_reference/`` (transformers 4.57).
    """
    if package in sys.modules:
        return
    parent = importlib.util.find_spec("lerobot")
    if parent is None or not parent.submodule_search_locations:
        return
    path = Path(parent.submodule_search_locations[0], *package.split(".")[1:])
    stub = types.ModuleType(package)
    stub.__path__ = [str(path)]
    sys.modules[package] = stub


def randomize_(module: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    """Perturb every float parameter and buffer (norm statistics included) with seeded noise.

    Why: LeRobot initialises norms to identity (weight 1, bias 0, mean 0, var 1);
    a parity test on those would not notice a swapped mean and bias.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in sorted([*module.named_parameters(), *module.named_buffers()], key=lambda kv: kv[0]):
            if not t.is_floating_point() or name.endswith("pos_enc") or name.endswith("pos_grid"):
                continue
            noise = torch.randn(t.shape, generator=gen)
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))
            elif t.dim() >= 2:
                t.add_(scale * noise * t.std().clamp_min(1e-3) if t.numel() > 1 else scale * noise)
            else:
                t.add_(scale * noise)


def image_stats(mode: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    if mode == "MEAN_STD":
        return {"mean": 0.4 + 0.1 * torch.rand(3, 1, 1, generator=gen), "std": 0.2 + 0.1 * torch.rand(3, 1, 1, generator=gen)}
    return {"min": 0.05 * torch.rand(3, 1, 1, generator=gen), "max": 0.9 + 0.1 * torch.rand(3, 1, 1, generator=gen)}


def vector_stats(mode: str, n: int, gen: torch.Generator, *, constant_dim: bool = False) -> dict[str, torch.Tensor]:
    if mode == "MEAN_STD":
        stats = {"mean": torch.randn(n, generator=gen), "std": 0.5 + torch.rand(n, generator=gen)}
    else:
        lo = -1 - torch.rand(n, generator=gen)
        stats = {"min": lo, "max": lo + 1 + 2 * torch.rand(n, generator=gen)}
        if constant_dim:                 # a joint that never moved: max == min (LeRobot substitutes eps)
            stats["max"][0] = stats["min"][0]
    return stats


def save_checkpoint(policy, config, stats, directory: Path, make_processors) -> Path:
    """``save_pretrained`` of the policy and of its pre/post-processors, as a user's checkpoint has them."""
    policy.save_pretrained(directory)
    pre, post = make_processors(config, dataset_stats=stats)
    pre.save_pretrained(directory)
    post.save_pretrained(directory)
    return directory


def processors(config, directory: Path):
    """The pre/post-processor pipelines loaded back from ``directory`` (what a LeRobot user runs)."""
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
    pre = PolicyProcessorPipeline.from_pretrained(directory, config_filename="policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        directory, config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    return pre, post


def observations(features: dict[str, tuple[int, ...]], n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``n`` smoothly varying observations (images in [0, 1]) so consecutive steps differ."""
    gen = torch.Generator().manual_seed(seed)
    base = {k: torch.rand(shape, generator=gen) for k, shape in features.items()}
    drift = {k: torch.randn(shape, generator=gen) for k, shape in features.items()}
    out = []
    for i in range(n):
        obs = {}
        for k, shape in features.items():
            x = base[k] + 0.05 * i * drift[k]
            obs[k] = x.remainder(1.0) if len(shape) == 3 else x
        out.append(obs)
    return out


def max_relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |a - b| / max(max |b|, 1e-6)`` over the whole trajectory."""
    ours, ref = ours.detach(), ref.detach()
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def case_features(case: dict) -> dict[str, tuple[int, ...]]:
    """The observation features of a test case: state, optional environment state, ``cameras`` images."""
    feats = {"observation.state": (case["state"],)}
    if case["env"]:
        feats["observation.environment_state"] = (case["env"],)
    for i in range(case["cameras"]):
        feats[f"observation.images.cam{i}"] = (3, *case["hw"])
    return feats


def make_checkpoint(directory: Path, case: dict, config_cls, policy_cls, make_processors, tiny: dict, *,
                    seed: int = 0, constant_dim: bool = False):
    """A checkpoint written by LeRobot's own classes for a test case; returns (directory, policy, config).

    Images are mean-std normalised; state, environment state and action use the case's mode.
    """
    lerobot()
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    feats = case_features(case)
    kinds = {"observation.state": FeatureType.STATE, "observation.environment_state": FeatureType.ENV}
    inputs = {k: PolicyFeature(type=kinds.get(k, FeatureType.VISUAL), shape=s) for k, s in feats.items()}
    mode = NormalizationMode(case["norm"])
    config = config_cls(input_features=inputs,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(case["action"],))},
                        normalization_mapping={"VISUAL": NormalizationMode.MEAN_STD, "STATE": mode, "ENV": mode,
                                               "ACTION": mode},
                        **{**tiny, **case["cfg"]})
    torch.manual_seed(seed)
    policy = policy_cls(config)
    randomize_(policy, seed)
    policy.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    stats = {k: image_stats("MEAN_STD", gen) if len(s) == 3 else
             vector_stats(case["norm"], s[0], gen, constant_dim=constant_dim) for k, s in feats.items()}
    stats["action"] = vector_stats(case["norm"], case["action"], gen, constant_dim=constant_dim)
    save_checkpoint(policy, config, stats, directory, make_processors)
    return directory, policy, config
