"""Reading a LeRobot 0.4.x checkpoint directory (as ``save_pretrained`` writes it), without LeRobot.

A checkpoint is ``config.json`` (``"type"``: act, diffusion, ...), ``model.safetensors``
and the processor pipelines saved beside it: ``policy_preprocessor.json`` /
``policy_postprocessor.json`` whose ``normalizer_processor`` /
``unnormalizer_processor`` steps name a ``.safetensors`` file of statistics
(flat keys ``<feature>.<stat>``, e.g. ``observation.state.mean``).

Why a reader of its own: the runtime must not import LeRobot (its pins conflict
with ours). Every file is JSON or safetensors: nothing is unpickled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from flashrt_ros.models.policy_features import ENV_STATE, STATE, FeatureSpec
from flashrt_ros.runtime.errors import InvalidArgument

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"


@dataclass
class Normalization:
    """What the pre/post-processor pipelines apply: per-feature-type modes and per-feature statistics."""

    norm_map: dict[str, str]                       # FeatureType ("STATE", "VISUAL", "ENV", "ACTION") -> mode
    features: dict[str, str]                       # feature name -> FeatureType
    stats: dict[str, dict[str, torch.Tensor]]      # feature name -> {"mean": ..., "std": ...}
    eps: float = 1e-8


@dataclass
class LeRobotCheckpoint:
    """The parsed files of one checkpoint directory."""

    path: Path
    config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    normalize: Normalization
    unnormalize: Normalization
    input_features: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    output_features: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def policy_type(self) -> str:
        return str(self.config.get("type", ""))


#: the pipeline steps that hold a policy type's statistics, where they are not LeRobot's normalizer steps
#: (GR00T's min-max statistics sit in its pack and unpack steps)
NORMALIZER_STEPS = {"groot": ("groot_pack_inputs_v3", "groot_action_unpack_unnormalize_v1")}


def read_checkpoint(path: str | Path) -> LeRobotCheckpoint:
    """Parse a checkpoint directory; ``InvalidArgument`` names the missing or malformed part."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InvalidArgument(f"LeRobot checkpoint {str(root)!r} is not a directory")
    for name in (CONFIG, WEIGHTS, PREPROCESSOR, POSTPROCESSOR):
        if not (root / name).is_file():
            extra = (" (LeRobot < 0.4 kept normalisation inside the model; re-save it with LeRobot 0.4.x)"
                     if name in (PREPROCESSOR, POSTPROCESSOR) else "")
            raise InvalidArgument(f"LeRobot checkpoint {str(root)!r} has no {name}{extra}")
    config = _read_json(root / CONFIG)
    if "type" not in config:
        raise InvalidArgument(f"{root / CONFIG}: no \"type\" field (act, diffusion, ...)")
    try:
        weights = load_file(str(root / WEIGHTS))
    except Exception as exc:  # safetensors raises its own error types
        raise InvalidArgument(f"{root / WEIGHTS}: not a readable safetensors file ({exc})") from None
    pre, post = NORMALIZER_STEPS.get(str(config["type"]), ("normalizer_processor", "unnormalizer_processor"))
    return LeRobotCheckpoint(
        path=root, config=config, weights=weights,
        normalize=_read_normalization(root, PREPROCESSOR, pre),
        unnormalize=_read_normalization(root, POSTPROCESSOR, post),
        input_features=_features(config, "input_features", root),
        output_features=_features(config, "output_features", root))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{path}: expected a JSON object")
    return value


def _features(config: dict[str, Any], key: str, root: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    raw = config.get(key)
    if not isinstance(raw, dict) or not raw:
        raise InvalidArgument(f"{root / CONFIG}: no {key}")
    out = {}
    for name, ft in raw.items():
        try:
            out[name] = (str(ft["type"]), tuple(int(d) for d in ft["shape"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidArgument(f"{root / CONFIG}: {key}[{name!r}] needs a type and a shape") from None
    return out


def _read_normalization(root: Path, filename: str, registry_name: str) -> Normalization:
    pipeline = _read_json(root / filename)
    steps = [s for s in pipeline.get("steps", []) if s.get("registry_name") == registry_name]
    if not steps:
        raise InvalidArgument(f"{root / filename}: no {registry_name!r} step")
    step = steps[0]
    cfg = step.get("config", {})
    stats: dict[str, dict[str, torch.Tensor]] = {}
    state_file = step.get("state_file")
    if state_file:
        if not (root / state_file).is_file():
            raise InvalidArgument(f"{root / filename} names {state_file}, which is missing")
        for flat_key, tensor in load_file(str(root / state_file)).items():
            feature, stat = flat_key.rsplit(".", 1)
            stats.setdefault(feature, {})[stat] = tensor.to(torch.float32)
    features = {name: str(ft.get("type")) for name, ft in cfg.get("features", {}).items()}
    return Normalization(norm_map={str(k): str(v) for k, v in cfg.get("norm_map", {}).items()},
                         features=features, stats=stats, eps=float(cfg.get("eps", 1e-8)))


ACTION = "action"
#: The inputs LeRobot's VLAs (SmolVLA, π0 / π0.5) pad missing cameras with: masked out of their prefix.
EMPTY_CAMERA = "observation.images.empty_camera_"


@dataclass(frozen=True)
class PolicyIO:
    """The inputs and output a checkpoint's ``config.json`` declares (0 = absent)."""

    state_dim: int
    env_state_dim: int
    action_dim: int
    cameras: tuple[str, ...]
    image_shape: tuple[int, int, int] | None

    @classmethod
    def from_checkpoint(cls, ckpt: LeRobotCheckpoint, policy: str) -> PolicyIO:
        return cls.from_features(ckpt.input_features, ckpt.output_features, ckpt.path, policy)

    @classmethod
    def from_vla_checkpoint(cls, ckpt: LeRobotCheckpoint, policy: str,
                            kinds: tuple[str, ...] | None = None) -> PolicyIO:
        """A VLA's inputs: its empty cameras left out (masked out of the prefix, they change no action), and only
        the feature types in ``kinds`` when given; ``InvalidArgument`` when no camera is left."""
        inputs = {k: v for k, v in ckpt.input_features.items()
                  if not k.startswith(EMPTY_CAMERA) and (kinds is None or v[0] in kinds)}
        io = cls.from_features(inputs, ckpt.output_features, ckpt.path, policy)
        if not io.cameras:
            raise InvalidArgument(f"{ckpt.path}/config.json: {policy} needs at least one camera")
        return io

    @classmethod
    def from_features(cls, inputs: dict[str, tuple[str, tuple[int, ...]]],
                      outputs: dict[str, tuple[str, tuple[int, ...]]], path: Path, policy: str) -> PolicyIO:
        """From ``config.json``'s ``input_features`` / ``output_features`` as ``_features`` reads them."""
        if ACTION not in outputs:
            raise InvalidArgument(f"{path}/config.json: output_features has no 'action'")
        cameras = tuple(n for n, (t, _) in inputs.items() if t == "VISUAL")
        shapes = {inputs[n][1] for n in cameras}
        if len(shapes) > 1:
            raise InvalidArgument(f"{policy} needs every camera at one image shape, got {sorted(shapes)}")
        env = [n for n, (t, _) in inputs.items() if t == "ENV"]
        if env and env != [ENV_STATE]:
            raise InvalidArgument(f"{policy} reads its environment state from {ENV_STATE!r}, not {env}")
        state = inputs.get(STATE)
        return cls(state_dim=state[1][0] if state and state[0] == "STATE" else 0,
                   env_state_dim=inputs[ENV_STATE][1][0] if env else 0,
                   action_dim=outputs[ACTION][1][0], cameras=cameras,
                   image_shape=next(iter(shapes)) if shapes else None)


def declared_input_features(path: str | Path) -> dict[str, FeatureSpec]:
    """The features a checkpoint's policy reads each step, from its ``config.json`` alone (no weights
    read): what the node's policy declares once loaded, since every LeRobot type builds its inputs
    with ``feature_specs(PolicyIO)`` (a test checks the two agree). For ``flashrt fake-sensors``."""
    root = Path(path).expanduser()
    if not (root / CONFIG).is_file():
        raise InvalidArgument(f"LeRobot checkpoint {str(root)!r} has no {CONFIG}")
    config = _read_json(root / CONFIG)
    io = PolicyIO.from_features(_features(config, "input_features", root),
                                _features(config, "output_features", root), root,
                                str(config.get("type", "the policy")))
    return feature_specs(io)


def feature_specs(io) -> dict[str, FeatureSpec]:
    """The engine-facing inputs of a policy config carrying ``PolicyIO``'s fields."""
    out = {}
    if io.state_dim:
        out[STATE] = FeatureSpec((io.state_dim,), "state")
    if io.env_state_dim:
        out[ENV_STATE] = FeatureSpec((io.env_state_dim,), "state")
    for cam in io.cameras:
        out[cam] = FeatureSpec(tuple(io.image_shape), "image")
    return out


def jsonable(value):
    """A config dict with tuples as lists (what ``json.dumps`` and the fingerprint see)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return value
