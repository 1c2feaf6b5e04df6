"""Float8 (E4M3) weights with one float32 scale per output row, and the linear layer that uses them.

Why: a VLA on a robot is bound by reading its weights (π0's 3 B parameters are 6 GB in
bf16; a Jetson Thor reads ~273 GB/s) and by its memory. E4M3 with a per-output-channel
scale halves both and keeps the relative error of each weight near 2^-4 of its row's
largest; the scale is applied to the product, never to the weights in memory.

Two products, picked by rows: a chunk's few rows (an expert, at most
``rows_matmul.MAX_ROWS``) go through ``ops.triton.rows_matmul``, which widens the fp8 tile in
registers (weight-only: the activations stay 16-bit); a prefix's hundreds of rows through
Hopper's scaled matmul (``torch._scaled_mm``) with the activations quantised per row here
(``quantize_rows``): both operands FP8, float32 accumulation, bf16 out. Elsewhere (CPU, a GPU
without FP8 tensor cores) the weights are widened and the product is the 16-bit one: the
same function, for tests and parity, not for speed.
"""
from __future__ import annotations

import functools

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w8, scale)``: ``w ~= w8 * scale[:, None]``, one float32 scale per output row (its largest |w| / 448)."""
    scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / E4M3_MAX
    return (w.float() / scale[:, None]).to(E4M3), scale


def widen(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weights an fp8 product computes with, in ``dtype`` (the reference, and the path without FP8 units)."""
    return (w8.float() * scale.float()[:, None]).to(dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x8, scale [M, 1])`` per row of ``x [M, K]`` (the activations of a scaled product)."""
    scale = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale).to(E4M3), scale


@functools.cache
def scaled_mm_available(device_index: int) -> bool:
    """FP8 tensor cores (compute capability >= 8.9) and ``torch._scaled_mm``."""
    if not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x8 @ (w8 * scale).T`` in ``x``'s dtype, ``x8`` the rows of ``x`` quantised to E4M3 (``quantize_rows``): the
    scaled matmul on a GPU with FP8 units (dimensions that are multiples of 16); elsewhere the same function
    with widened operands (so a CPU check sees the error the GPU makes)."""
    n, k = w8.shape
    x8, x_scale = quantize_rows(x)
    if x.is_cuda and scaled_mm_available(x.device.index or 0) and n % 16 == 0 and k % 16 == 0:
        return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=scale.float()[None, :], out_dtype=x.dtype)
    return (x8.float() * x_scale).to(x.dtype) @ widen(w8, scale, x.dtype).t()


def weight_only_linear(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (w8 * scale).T`` with ``x`` kept in its dtype: what the fused few-row kernels compute
    (``ops.triton.rows_matmul``), here with widened weights (their reference)."""
    return x @ widen(w8, scale, x.dtype).t()
