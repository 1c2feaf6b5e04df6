"""Convolution weights stored once in the memory layout the device's kernels read.

Why: cuDNN's batch-1 kernels on Hopper read channels-last (NHWC / NWC) weights;
an NCHW / NCW weight is re-laid-out on every call (``nchwToNhwcKernel``): a
Diffusion replan took 32 ms with contiguous weights and 12 ms laid out (H200,
``benchmarks.policy_profile``). On the CPU the opposite holds: oneDNN copies
a non-contiguous weight on every call, so there weights stay contiguous. The
layout changes strides only: parameter shapes, state-dict keys, values and the
fingerprint (hashed in logical order) are unchanged, and ``load_state_dict``
copies into the existing layout.

A policy calls ``lay_out_convs`` from its ``_apply`` override, so every
``.to(device)`` / ``.to(dtype)`` leaves the weights laid out for where they now are.
"""
from __future__ import annotations

import torch
from torch import nn


def lay_out_convs(module: nn.Module, *, conv1d: bool = False, conv2d: bool = False) -> None:
    """Conv1d weights as ``(out, k, in)`` in memory / Conv2d weights channels-last on CUDA; contiguous elsewhere."""
    for m in module.modules():
        if conv1d and type(m) is nn.Conv1d:
            w = m.weight.data
            m.weight.data = w.permute(0, 2, 1).contiguous().permute(0, 2, 1) if w.is_cuda else w.contiguous()
        elif conv2d and type(m) is nn.Conv2d:
            w = m.weight.data
            m.weight.data = w.contiguous(memory_format=torch.channels_last if w.is_cuda else torch.contiguous_format)
