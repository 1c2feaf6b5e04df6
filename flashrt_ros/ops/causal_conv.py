"""Short causal depthwise convolution whose left context is an explicit state window.

Why a state window: the conv of the next chunk needs the last ``kernel-1`` inputs
of the previous one. Keeping exactly those inputs in a preallocated buffer (and
updating it with ``copy_``) makes chunked prefill and one-token decode the same
computation as one long prefill, and puts the conv state inside the capsule.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.triton import use_triton


def causal_conv1d_with_state(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """Convolve ``x [T, C]`` causally with ``weight [C, K]``, continuing from ``state [C, K-1]``.

    ``state`` holds the ``K-1`` inputs before ``x`` (zeros at a cold start, which
    equals the zero left-padding of a plain causal conv) and is overwritten in
    place with the last ``K-1`` inputs seen. Returns ``[T, C]`` in ``x``'s dtype.
    On CUDA with triton this is one kernel (decode) or two (prefill).
    """
    if use_triton(x):
        from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update
        return causal_conv1d_update(x, state, weight, bias, silu)
    window = state.shape[-1]
    full = torch.cat((state.to(x.dtype), x.transpose(0, 1)), dim=-1)      # [C, K-1+T]
    state.copy_(full[:, full.shape[-1] - window:])
    # A K-tap depthwise conv as windows x taps: for K = 4 this is far cheaper on CPU
    # than a depthwise F.conv1d (oneDNN took ~10 ms per decode step), and it is
    # plain fixed-shape tensor ops on any device. float32, like a conv's accumulator.
    windows = full.float().unfold(-1, weight.shape[-1], 1)               # [C, T, K]
    out = (windows * weight.float()[:, None, :]).sum(-1)                  # [C, T]
    if bias is not None:
        out = out + bias.float()[:, None]
    if silu:
        out = F.silu(out)
    return out.transpose(0, 1).to(x.dtype)


def causal_conv1d_sections(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                           sections: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
    """``causal_conv1d_with_state`` (SiLU, no bias) split into column blocks ``sections``.

    On CUDA with triton the three blocks come out of the one conv kernel as
    contiguous tensors (a prefill's q, k, v go to fla's chunk kernel, which
    would copy strided views); elsewhere they are views of the ``[T, C]`` result.
    """
    if use_triton(x):
        from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update
        return causal_conv1d_update(x, state, weight, None, True, sections=sections)
    return causal_conv1d_with_state(x, state, weight).split(list(sections), dim=-1)
