"""The fused GroupNorm + Mish (+ FiLM / + residual) kernel equals its torch reference (``ops.group_norm``).

On a CPU machine it runs in triton's interpreter (conftest sets TRITON_INTERPRET=1);
on a GPU machine the compiled kernel runs on CUDA tensors.
"""
from __future__ import annotations

import pytest
import torch

from triton_interpret import BF16_TOL, kernel_device, needs_triton

pytestmark = needs_triton
DEV = kernel_device()


def _reference(x, norm, film, film_scale, residual):
    from flashrt_ros.ops import triton as ops_triton
    from flashrt_ros.ops.group_norm import group_norm_mish
    with ops_triton.fast_kernels(False):
        return group_norm_mish(x.float(), norm.float(), film=None if film is None else film.float(),
                               film_scale=film_scale, residual=None if residual is None else residual.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tail", ["none", "film_scale", "film_bias", "residual"])
@pytest.mark.parametrize("shape", [(1, 64, 16), (2, 48, 8)])
def test_group_norm_mish_equals_reference(dtype, tail, shape):
    from flashrt_ros.ops.triton.group_norm import group_norm_mish
    gen = torch.Generator().manual_seed(0)
    B, C, T = shape
    norm = torch.nn.GroupNorm(8, C)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(C, generator=gen))
        norm.bias.copy_(0.3 * torch.randn(C, generator=gen))
    x = (3 * torch.randn(B, C, T, generator=gen) + 1).to(dtype)
    film = (torch.randn(B, 2 * C if tail == "film_scale" else C, 1, generator=gen).to(dtype)
            if tail.startswith("film") else None)
    residual = torch.randn(B, C, T, generator=gen).to(dtype) if tail == "residual" else None
    expected = _reference(x, norm, film, tail == "film_scale", residual)
    norm = norm.to(device=DEV, dtype=dtype)
    out = group_norm_mish(x.to(DEV), norm.weight, norm.bias, 8, norm.eps,
                          film=None if film is None else film.to(DEV), film_scale=tail == "film_scale",
                          residual=None if residual is None else residual.to(DEV))
    assert out.dtype == dtype and out.shape == x.shape
    err = ((out.float().cpu() - expected).norm() / expected.norm()).item()
    assert err <= (1e-5 if dtype == torch.float32 else BF16_TOL), err
