"""Matrix-vector product ``y = W x`` for batch-1 decode, reading each weight row once, coalesced.

Why: at batch 1 every linear layer is a matrix-vector product whose cost is
reading the weights. cuBLAS picks GEMM tiles meant for many rows of ``x``;
here each program owns ``BLOCK_N`` output rows and streams their weights in
``BLOCK_K``-wide slices, so all loads are contiguous and a whole layer is one
launch with no split-K reduction.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_wn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_wn
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr + k0 + cols)
            w = tl.load(w_rows + (k0 + cols)[None, :], mask=row_mask[:, None], other=0.0)
        else:
            col_mask = k0 + cols < K
            x = tl.load(x_ptr + k0 + cols, mask=col_mask, other=0.0)
            w = tl.load(w_rows + (k0 + cols)[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps, num_stages)``: enough programs to fill the GPU, wide loads.

    BLOCK_K is the widest of 512/256/128 that pads ``K`` by at most 1/8 (K = 576
    takes 128, not 512 with a mostly-masked second slice). Measured on an H200
    (benchmarks/kernel_gemv.py): 2.3-4.3 TB/s on the decode shapes.
    """
    block_k = triton.next_power_of_2(k)
    for width in (512, 256, 128):
        if k >= width and (-k % width) * 8 <= k:
            block_k = width
            break
    block_n = 8 if n >= 4096 else 4
    return block_n, block_k, 4, 3


def gemv(x: torch.Tensor, weight: torch.Tensor, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x [1, K] @ weight[N, K]^T`` -> ``[1, N]`` in x's dtype, accumulated in float32."""
    n, k = weight.shape
    assert x.shape[-1] == k and x.numel() == k and weight.stride(1) == 1
    x = x.reshape(k)
    if x.stride(0) != 1:
        x = x.contiguous()
    block_n, block_k, warps, stages = config or gemv_config(n, k)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, out, n, k, weight.stride(0), BLOCK_N=block_n,
                                             BLOCK_K=block_k, EVEN_K=k % block_k == 0,
                                             num_warps=warps, num_stages=stages)
    return out
