"""Mixed precision without a round trip: the networks cast to a low precision, chosen tensors kept float32 with
their exact values.

Why: ``module.to(bfloat16)`` followed by ``kept.float()`` rounds the kept tensors to bf16 on the way and widens
the rounded values back: float32 in name only. LeRobot never casts what it keeps in float32 (its norms, patch
embeddings and action projections in π0; its normalisation statistics, which live in its processors), so such a
round trip computes with other weights than LeRobot's bf16 (measured at the published π0 size on the race's
checkpoint, CPU, 2026-12-07: by itself it moved the first chunk 4.4e-3 RMS from LeRobot's bf16 weights; bf16
arithmetic moves it 1.7e-2).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def cast_keeping_float32(root: nn.Module, dtype: torch.dtype, modules: Iterable[nn.Module] = (),
                         tensors: Iterable[tuple[nn.Module, str]] = ()) -> None:
    """``root.to(dtype)``, except the floating parameters and buffers of ``modules`` (with their submodules) and
    the named ``tensors`` (module, attribute), which end float32 and equal to their values before the call."""
    kept: list[tuple[nn.Module, str, torch.Tensor]] = []
    for module in modules:
        for sub in module.modules():
            for name, t in list(sub._parameters.items()) + list(sub._buffers.items()):
                if t is not None and t.is_floating_point():
                    kept.append((sub, name, t.detach().to(torch.float32, copy=True)))
    for module, name in tensors:
        kept.append((module, name, getattr(module, name).detach().to(torch.float32, copy=True)))
    root.to(dtype=dtype)
    with torch.no_grad():
        for module, name, value in kept:
            if module._parameters.get(name) is not None:
                module._parameters[name].data = value
            elif name in module._buffers:
                module._buffers[name] = value
            else:
                setattr(module, name, value)
