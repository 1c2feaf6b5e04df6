"""LeRobot's normaliser and unnormaliser as fixed buffers, applied inside the captured step.

Why inside the step: normalisation is part of what the checkpoint computes, and
keeping it on the device keeps the whole step one graph. The arithmetic is
LeRobot 0.4.x's ``_apply_transform`` written the same way (same operation
order, so fp32 results agree to rounding):

- MEAN_STD: ``(x - mean) / (std + eps)``; inverse ``x * std + mean``
- MIN_MAX (and QUANTILES / QUANTILE10 with q01/q99, q10/q90):
  ``2 * (x - lo) / d - 1``; inverse ``(x + 1) / 2 * d + lo``, where
  ``d = hi - lo`` and ``d == 0`` is replaced by ``eps``
- IDENTITY, or no statistics for the feature: unchanged.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from flashrt_ros.models.lerobot.checkpoint import ACTION, LeRobotCheckpoint, Normalization
from flashrt_ros.runtime.errors import InvalidArgument

_RANGE_STATS = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}


class FeatureNormalizer(nn.Module):
    """(Un)normalises one feature; statistics are non-persistent buffers (not model weights)."""

    def __init__(self, name: str, feature_type: str, norm: Normalization, *, inverse: bool) -> None:
        super().__init__()
        self.inverse = inverse
        self.mode = norm.norm_map.get(feature_type, "IDENTITY")
        stats = norm.stats.get(name, {})
        if self.mode == "IDENTITY" or not stats:
            self.mode = "IDENTITY"
            return
        if self.mode == "MEAN_STD":
            need = ("mean", "std")
        elif self.mode in _RANGE_STATS:
            need = _RANGE_STATS[self.mode]
        else:
            raise InvalidArgument(f"normalisation mode {self.mode!r} of {name!r} is not supported")
        missing = [s for s in need if s not in stats]
        if missing:
            raise InvalidArgument(f"{self.mode} normalisation of {name!r} needs statistics {missing}")
        a, b = (stats[s] for s in need)
        if self.mode == "MEAN_STD":
            self.register_buffer("center", a, persistent=False)          # mean
            self.register_buffer("spread", b, persistent=False)          # std
            self.register_buffer("denom", b + norm.eps, persistent=False)
        else:
            d = b - a
            self.register_buffer("center", a, persistent=False)          # lower bound
            self.register_buffer("denom", torch.where(d == 0, torch.tensor(norm.eps, dtype=d.dtype), d),
                                 persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return x * self.spread + self.center if self.inverse else (x - self.center) / self.denom
        return (x + 1) / 2 * self.denom + self.center if self.inverse else 2 * (x - self.center) / self.denom - 1


def normalizers(features: dict[str, tuple[str, tuple[int, ...]]], norm: Normalization, *,
                inverse: bool) -> nn.ModuleDict:
    """One ``FeatureNormalizer`` per feature, keyed by the feature name with dots replaced by ``/``."""
    return nn.ModuleDict({name.replace(".", "/"): FeatureNormalizer(name, ftype, norm, inverse=inverse)
                          for name, (ftype, _shape) in features.items()})


class PolicyNormalization(nn.Module):
    """A checkpoint's input normaliser and action unnormaliser (identity without a checkpoint)."""

    def __init__(self, ckpt: LeRobotCheckpoint | None) -> None:
        super().__init__()
        if ckpt is None:
            self.inputs, self.outputs = nn.ModuleDict(), nn.ModuleDict()
            return
        self.inputs = normalizers(ckpt.input_features, ckpt.normalize, inverse=False)
        self.outputs = normalizers({ACTION: ckpt.output_features[ACTION]}, ckpt.unnormalize, inverse=True)

    def input(self, name: str, x: Tensor) -> Tensor:
        key = name.replace(".", "/")
        return self.inputs[key](x) if key in self.inputs else x

    def action(self, x: Tensor) -> Tensor:
        return self.outputs[ACTION](x) if ACTION in self.outputs else x
