"""Matrix-vector product ``y = W x`` for batch-1 decode, reading each weight row once, coalesced.

Why: at batch 1 every linear layer is a matrix-vector product whose cost is
reading the weights. cuBLAS picks GEMM tiles meant for many rows of ``x``;
here each program owns ``BLOCK_N`` output rows and streams their weights in
``BLOCK_K``-wide slices, so all loads are contiguous and a whole layer is one
launch with no split-K reduction.

``gemv_fused`` also takes the work around the product into the same launch (a
decode step pays a few microseconds for every kernel, and a Llama layer's norms,
residual adds and SwiGLU gate were five of its ten): the RMSNorm of ``x`` before
it (every program recomputes the row's sum of squares: ``x`` is a few KiB, the
weights megabytes), and after it either the residual add or SwiGLU's
``silu(gate) * up`` over the two halves of a ``[gate; up]`` weight. The rounding
points are the unfused ops' (``ops.norms``, ``ops.gating``, the product rounded
to the model dtype before the add or the gate).
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


def _one_row(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x [1, K]`` (or any view of ``K`` elements) as a contiguous ``[K]`` the kernels read with unit stride."""
    x = x.reshape(k)
    return x if x.stride(0) == 1 else x.contiguous()


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
    x = _one_row(x, k)
    block_n, block_k, warps, stages = config or gemv_config(n, k)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, out, n, k, weight.stride(0), BLOCK_N=block_n,
                                             BLOCK_K=block_k, EVEN_K=k % block_k == 0,
                                             num_warps=warps, num_stages=stages)
    return out


def paired_config(rows: int, k: int) -> tuple[int, int, int, int]:
    """``gemv_config`` for a kernel whose programs each take ``BLOCK_N`` row pairs (SwiGLU's gate and up rows,
    RoPE's two halves of a head) of a ``rows``-row weight: half the row slots, so a program reads as many rows and
    the grid is as large as the plain product's over the same weight (two accumulators in registers, not twice
    the bytes in flight: for the hybrid's gate-up product ptxas gives (8, 512) 126 registers, (4, 512) 78, the
    plain product 78; ``benchmarks.kernel_resources``)."""
    block_n, block_k, warps, stages = gemv_config(rows, k)
    return max(1, block_n // 2), block_k, warps, stages


#: ``gemv_fused`` norms before the product and epilogues after it
NORMS = {None: 0, "llama": 1, "offset": 2}
EPILOGUES = {"store": 0, "residual": 1, "silu_gate": 2}


@triton.jit
def _normed_slice(x_ptr, norm_ptr, k0, cols, col_mask, rstd, NORM: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """``x[k0 + cols]`` as the product reads it: normalised (``rstd``) and scaled as ``ops.norms`` rounds it."""
    x = tl.load(x_ptr + k0 + cols, mask=col_mask, other=0.0).to(tl.float32)
    if NORM == 1:       # Llama: the normalised row cast to the model dtype, scaled in the model dtype
        w = tl.load(norm_ptr + k0 + cols, mask=col_mask, other=0.0).to(tl.float32)
        x = ((x * rstd).to(OUT_DTYPE).to(tl.float32) * w).to(OUT_DTYPE).to(tl.float32)
    elif NORM == 2:     # Qwen3-Next: scaled by (1 + w) in float32, one cast
        w = tl.load(norm_ptr + k0 + cols, mask=col_mask, other=0.0).to(tl.float32)
        x = (x * rstd * (1.0 + w)).to(OUT_DTYPE).to(tl.float32)
    return x


@triton.jit
def _row_rstd(x_ptr, K, eps, NORM: tl.constexpr, K_POW2: tl.constexpr):
    """The RMSNorm's ``rsqrt(mean(x^2) + eps)`` of the whole row, summed in one block as ``ops.triton.norms`` sums
    it (1.0 without a norm): every program computes it again, ``x`` being a few KiB against megabytes of weights."""
    rstd = 1.0
    if NORM != 0:
        every = tl.arange(0, K_POW2)
        xs = tl.load(x_ptr + every, mask=every < K, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xs * xs, axis=0) / K + eps)
    return rstd


@triton.jit
def _rows_dot(x_ptr, norm_ptr, first_rows, second_rows, row_ok, K, rstd, NORM: tl.constexpr, PAIRED: tl.constexpr,
              OUT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``BLOCK_N`` weight rows (``first_rows``: their pointers) times ``norm(x)``, and with ``PAIRED`` as many more
    (``second_rows``), accumulated in float32 slice by slice and each rounded to ``OUT_DTYPE`` as the plain GEMV
    stores it (the second result is 0 unpaired)."""
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        col_mask = k0 + cols < K
        x = _normed_slice(x_ptr, norm_ptr, k0, cols, col_mask, rstd, NORM, OUT_DTYPE)
        mask = row_ok[:, None] & col_mask[None, :]
        acc += tl.load(first_rows + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32) * x[None, :]
        if PAIRED:
            acc2 += tl.load(second_rows + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32) * x[None, :]
    return tl.sum(acc, axis=1).to(OUT_DTYPE).to(tl.float32), tl.sum(acc2, axis=1).to(OUT_DTYPE).to(tl.float32)


@triton.jit
def _gemv_fused_kernel(x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, N, K, stride_wn, eps,
                       NORM: tl.constexpr, EPILOGUE: tl.constexpr, K_POW2: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    out_dtype = out_ptr.dtype.element_ty
    rstd = _row_rstd(x_ptr, K, eps, NORM, K_POW2)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    y, up = _rows_dot(x_ptr, norm_ptr, w_ptr + rows[:, None].to(tl.int64) * stride_wn,
                      w_ptr + (rows + N)[:, None].to(tl.int64) * stride_wn, row_mask, K, rstd, NORM, EPILOGUE == 2,
                      out_dtype, BLOCK_N, BLOCK_K)
    if EPILOGUE == 1:   # the residual stream plus the product rounded to the model dtype
        y = y + tl.load(res_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    elif EPILOGUE == 2:  # silu(gate) rounded, times up (ops.triton.elementwise)
        y = (y * tl.sigmoid(y)).to(out_dtype).to(tl.float32) * up
    tl.store(out_ptr + rows, y.to(out_dtype), mask=row_mask)


def gemv_fused(x: torch.Tensor, weight: torch.Tensor, *, norm: str | None = None,
               norm_weight: torch.Tensor | None = None, eps: float = 0.0, epilogue: str = "store",
               residual: torch.Tensor | None = None,
               config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``epilogue(W @ norm(x))`` for one row ``x [1, K]`` -> ``[1, N]`` in x's dtype, accumulated in float32.

    ``norm``: None, ``"llama"`` (``ops.norms.rms_norm``) or ``"offset"`` (``ops.norms.offset_rms_norm``) with
    ``norm_weight`` and ``eps``; ``epilogue``: ``"store"``, ``"residual"`` (``residual [1, N]`` + the product) or
    ``"silu_gate"`` (``weight`` is ``[gate; up]``, ``[2N, K]``: ``silu(gate) * up``, ``ops.gating.silu_mul``)."""
    rows, k = weight.shape
    if norm not in NORMS or epilogue not in EPILOGUES:
        raise ValueError(f"norm one of {list(NORMS)}, epilogue one of {list(EPILOGUES)}")
    assert x.shape[-1] == k and x.numel() == k and weight.stride(1) == 1
    n = rows // 2 if epilogue == "silu_gate" else rows
    x = _one_row(x, k)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if epilogue == "residual":
        assert residual is not None and residual.numel() == n
        res = residual.reshape(n)
        res = res if res.stride(0) == 1 else res.contiguous()
    else:
        res = out
    block_n, block_k, warps, stages = config or (paired_config if epilogue == "silu_gate" else gemv_config)(rows, k)
    _gemv_fused_kernel[(triton.cdiv(n, block_n),)](
        x, weight, x if norm_weight is None else norm_weight, res, out, n, k, weight.stride(0), float(eps),
        NORM=NORMS[norm], EPILOGUE=EPILOGUES[epilogue], K_POW2=triton.next_power_of_2(k),
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


@triton.jit
def _gemv_qkv_rope_kernel(x_ptr, w_ptr, norm_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, positions_ptr, inv_freq_ptr,
                          K, stride_wn, cache_stride, eps, n_heads, n_kv_heads,
                          NORM: tl.constexpr, K_POW2: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``BLOCK_N`` row pairs ``(i, i + D/2)`` of the heads of a fused ``[q; k; v]`` weight: both products, then
    queries and keys rotated (``rope_kv._norm_rope_row``'s rounding) and written, keys and values into the cache row
    at ``positions[0]``."""
    out_dtype = q_out_ptr.dtype.element_ty
    half: tl.constexpr = HEAD_DIM // 2
    rstd = _row_rstd(x_ptr, K, eps, NORM, K_POW2)
    pairs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_pairs = (n_heads + 2 * n_kv_heads) * half
    ok = pairs < n_pairs
    head = pairs // half
    i = pairs % half
    first = head * HEAD_DIM + i
    y1, y2 = _rows_dot(x_ptr, norm_ptr, w_ptr + first[:, None].to(tl.int64) * stride_wn,
                       w_ptr + (first + half)[:, None].to(tl.int64) * stride_wn, ok, K, rstd, NORM, True, out_dtype,
                       BLOCK_N, BLOCK_K)
    pos = tl.load(positions_ptr)
    angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + i, mask=ok, other=0.0)
    cos = tl.cos(angle).to(out_dtype).to(tl.float32)
    sin = tl.sin(angle).to(out_dtype).to(tl.float32)
    rotate = head < n_heads + n_kv_heads                        # queries and keys; values pass through
    r1 = tl.where(rotate, (y1 * cos).to(out_dtype).to(tl.float32) + (-y2 * sin).to(out_dtype).to(tl.float32), y1)
    r2 = tl.where(rotate, (y2 * cos).to(out_dtype).to(tl.float32) + (y1 * sin).to(out_dtype).to(tl.float32), y2)
    is_q = ok & (head < n_heads)
    tl.store(q_out_ptr + first, r1.to(out_dtype), mask=is_q)
    tl.store(q_out_ptr + first + half, r2.to(out_dtype), mask=is_q)
    kv_head = tl.where(head < n_heads + n_kv_heads, head - n_heads, head - n_heads - n_kv_heads)
    row = pos.to(tl.int64) * cache_stride + kv_head * HEAD_DIM + i
    is_k = ok & (head >= n_heads) & rotate
    is_v = ok & (head >= n_heads + n_kv_heads)
    tl.store(k_cache_ptr + row, r1.to(k_cache_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_cache_ptr + row + half, r2.to(k_cache_ptr.dtype.element_ty), mask=is_k)
    tl.store(v_cache_ptr + row, r1.to(v_cache_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_cache_ptr + row + half, r2.to(v_cache_ptr.dtype.element_ty), mask=is_v)


def gemv_qkv_rope(x: torch.Tensor, weight: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  positions: torch.Tensor, inv_freq: torch.Tensor, n_heads: int, n_kv_heads: int, *,
                  norm: str | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                  config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """One token's ``[q; k; v]`` projection of ``norm(x [1, K])`` with RoPE over the whole head (rotate-half, no q/k
    norm: Llama's) and the KV write, in one launch: returns the rotated queries ``[1, n_heads, D]``; keys and values go
    to ``k_cache`` / ``v_cache`` ``[S, KV, D]`` at row ``positions[0]``. The same bits as ``gemv_fused`` then
    ``rope_kv.rope_and_write_kv`` (a launch and a round trip of the projection fewer)."""
    rows, k = weight.shape
    head_dim = rows // (n_heads + 2 * n_kv_heads)
    if norm not in NORMS or head_dim * (n_heads + 2 * n_kv_heads) != rows or head_dim % 2:
        raise ValueError(f"norm one of {list(NORMS)}; weight rows {rows} for {n_heads} + 2 x {n_kv_heads} heads")
    assert x.numel() == k and weight.stride(1) == 1 and inv_freq.numel() == head_dim // 2
    assert k_cache.stride(2) == v_cache.stride(2) == 1 and k_cache.stride(1) == v_cache.stride(1) == head_dim
    assert k_cache.stride(0) == v_cache.stride(0)
    x = _one_row(x, k)
    q = torch.empty((1, n_heads, head_dim), dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = config or paired_config(rows, k)
    pairs = rows // 2
    _gemv_qkv_rope_kernel[(triton.cdiv(pairs, block_n),)](
        x, weight, x if norm_weight is None else norm_weight, q, k_cache, v_cache, positions, inv_freq, k,
        weight.stride(0), k_cache.stride(0), float(eps), n_heads, n_kv_heads, NORM=NORMS[norm],
        K_POW2=triton.next_power_of_2(k), HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        num_stages=stages)
    return q
