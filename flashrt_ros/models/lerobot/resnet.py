"""ResNet-18/34 image backbone with frozen batch norm, as LeRobot's ACT and Diffusion Policy use it.

Why our own: the runtime must not import torchvision. Module and parameter
names follow torchvision's ``resnet18`` (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0`` ...) so a LeRobot ``model.safetensors`` loads
strictly; batch norm is frozen (inference statistics only, like torchvision's
``FrozenBatchNorm2d``: ``x * w / sqrt(var + eps) + (b - mean * w / sqrt(var + eps))``).
Only the layers up to ``layer4`` exist: LeRobot drops the pooling and the
classifier (ACT) or replaces them (Diffusion Policy).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: blocks per stage of the BasicBlock ResNets LeRobot configs name
RESNET_DEPTHS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine parameters (state-dict names of ``nn.BatchNorm2d``)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)   # written by a trainable BatchNorm2d
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        bias = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)


class EvalBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that always normalises with its running statistics (inference only)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


def norm_layer(kind: str, channels: int) -> nn.Module:
    """``frozen`` (ACT), ``batch`` (Diffusion Policy without group norm) or ``group`` (C/16 groups)."""
    if kind == "frozen":
        return FrozenBatchNorm2d(channels)
    if kind == "batch":
        return EvalBatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(channels // 16, channels)
    raise ValueError(f"unknown norm layer {kind!r}")


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual (projected when the shape changes)."""

    def __init__(self, inplanes: int, planes: int, stride: int, norm: str = "frozen") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = norm_layer(norm, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = norm_layer(norm, planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            norm_layer(norm, planes))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


def resnet_modules(name: str = "resnet18", norm: str = "frozen") -> list[tuple[str, nn.Module]]:
    """torchvision's children of a ResNet up to ``layer4``: conv1, bn1, relu, maxpool, layer1..4."""
    if name not in RESNET_DEPTHS:
        raise ValueError(f"vision backbone {name!r} is not supported (supported: {sorted(RESNET_DEPTHS)})")
    mods: list[tuple[str, nn.Module]] = [("conv1", nn.Conv2d(3, 64, 7, 2, 3, bias=False)),
                                         ("bn1", norm_layer(norm, 64)), ("relu", nn.ReLU()),
                                         ("maxpool", nn.MaxPool2d(3, 2, 1))]
    inplanes = 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), RESNET_DEPTHS[name]), start=1):
        layers = []
        for b in range(blocks):
            layers.append(BasicBlock(inplanes, planes, (1 if i == 1 else 2) if b == 0 else 1, norm))
            inplanes = planes
        mods.append((f"layer{i}", nn.Sequential(*layers)))
    return mods


class ResNetTrunk(nn.Sequential):
    """``conv1 .. layer4`` of a BasicBlock ResNet: images ``(B, 3, H, W)`` -> features ``(B, 512, H/32, W/32)``.

    ``named=True`` keeps torchvision's attribute names (ACT's ``IntermediateLayerGetter``);
    ``named=False`` numbers them 0..7 (Diffusion Policy's ``nn.Sequential(*children[:-2])``).
    """

    out_channels = 512

    def __init__(self, name: str = "resnet18", norm: str = "frozen", *, named: bool = True) -> None:
        mods = resnet_modules(name, norm)
        if named:
            super().__init__(OrderedDict(mods))
        else:
            super().__init__(*(m for _, m in mods))
