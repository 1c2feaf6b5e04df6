"""Matrix products of a few rows (a VLA expert's chunk: 50-51 rows) with their row work fused in, one kernel each.

Why: the expert of π0 runs 10 flow steps x 18 layers over 51 rows. There a
layer's products are bound by reading their weights (34 MB a layer, ~10 us at
3.3 TB/s), but cuBLAS ran each as its own launch with split-K reductions, and
the RoPE, the gated GELU, the residual copies and the norms took one more launch
each: ~11 kernels and ~65 us a layer on an H100 (``docs/benchmarks/pi0_fast.md``).
Here every row tile holds all the rows (``M <= 64``), so a program streams a
slice of the weight matrix once and owns whole output columns, and the row work
happens on the accumulator before anything is written:

- ``NORM``: a folded RMSNorm (``ops.fused_rows``: its ``1 + w`` is already in the
  weights) needs the row's ``rsqrt(mean(x^2) + eps)``; the program reads every
  column of ``x`` anyway, so it sums the squares on the way;
- epilogue ``residual``: ``out = residual + acc`` (``out`` may be the residual
  itself: each program owns its columns);
- epilogue ``gelu_gate``: the program takes matching column slices of the gate
  and the up halves and writes ``gelu_tanh(gate) * up`` (``silu_gate``: Llama's
  ``silu(gate) * up``, SmolVLA's expert);
- epilogue ``qkv_rope``: the program takes matching slices of the two halves of
  one head, rotates them (RoPE) and writes queries, keys or values straight into
  their destination rows (zeros past ``valid``).

Weights may be float8 (E4M3) with one float32 scale per output column: the tile
is widened to the activation dtype in registers and the scale applied to the
accumulator (weight-only FP8: the bytes a product reads halve; the activations
and the tensor-core math stay 16-bit). Accumulation is float32, each output is
rounded once, and the reduction order is fixed (no atomics): a replan is
bit-reproducible.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton.scratch import kept

#: the rows a tile holds (all of them): the expert's chunk, 50 actions (+ π0's state token)
MAX_ROWS = 64
#: ``(BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT_K])``: ``SPLIT_K`` slices of ``K`` in as many programs per
#: column tile, for products with too few column tiles to fill the GPU (π0's ``o`` and ``down``: 64 tiles of 16
#: columns on 132 SMs); off (1) until a device run measures it (``benchmarks.kernel_expert``)
Config = tuple[int, ...]
#: defaults by epilogue, until a device run picks better ones (``benchmarks.kernel_expert``)
DEFAULT_CONFIGS: dict[str, Config] = {"residual": (16, 128, 4, 4), "store": (16, 128, 4, 4),
                                      "gelu_gate": (32, 128, 4, 4), "qkv_rope": (16, 128, 4, 4),
                                      "silu_gate": (32, 128, 4, 4)}
#: float32 tiles (the check path, not the fast one) are twice bf16's: at most this many pipeline stages, so a
#: 64-row tile and two 128 x 32 weight tiles fit an H100's 227 KiB of shared memory
FLOAT32_MAX_STAGES = 2
_EPILOGUES = {"store": 0, "residual": 1, "gelu_gate": 2, "qkv_rope": 3, "silu_gate": 4}


@triton.jit
def _gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))


@triton.jit
def _finish(acc, out_ptr, res_ptr, rows, cols, ok, stride_out, stride_res, EPILOGUE: tl.constexpr):
    """Epilogues ``store`` (0) and ``residual`` (1): ``[residual +] acc`` rounded once into ``out``."""
    if EPILOGUE == 1:
        acc += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rows_matmul_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, res_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
                        valid_ptr, part_ptr, arrived_ptr, M, N, K, K_SLICE, stride_x, stride_out, stride_res,
                        stride_cs, stride_q, stride_k, stride_v, eps,
                        EPILOGUE: tl.constexpr, NORM: tl.constexpr, W_SCALED: tl.constexpr, HAS_VALID: tl.constexpr,
                        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """Output columns ``[pid * BLOCK_N, ...)`` (``gelu_gate``: of the gated output; ``qkv_rope``: of a head's
    first half, with their partners ``HALF`` further) for all rows. Two accumulators where the epilogue pairs
    columns: ``w`` rows ``c`` and ``c + shift``. ``SPLIT_K > 1`` (``store`` / ``residual``, no norm): program
    ``(pid, s)`` sums ``K`` slice ``s`` into ``part_ptr[s]``; the last of a column tile's programs to arrive
    (``arrived_ptr[pid]`` counts them, and it sets it back to 0) adds the slices in slice order and finishes."""
    pid = tl.program_id(0)
    k_lo = tl.program_id(1) * K_SLICE
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    offs = tl.arange(0, BLOCK_N)
    if EPILOGUE == 3:
        per_head = HALF // BLOCK_N
        head = pid // per_head
        d = (pid % per_head) * BLOCK_N + offs           # column within the head's first half
        cols = head * 2 * HALF + d
        shift = HALF
    else:
        cols = pid * BLOCK_N + offs
        shift = N                                       # gelu_gate: the up half starts after the gate half
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    squares = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, K_SLICE, BLOCK_K):               # K_SLICE: whole BLOCK_Ks; past K masked
        kk = k_lo + k0 + ks
        k_ok = kk < K
        a = tl.load(x_ptr + rows[:, None] * stride_x + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            af = a.to(tl.float32)
            squares += tl.sum(af * af, 1)
        b = tl.load(w_ptr + cols[:, None] * K + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc, input_precision=DOT_PRECISION)
        if EPILOGUE >= 2:
            b2 = tl.load(w_ptr + (cols + shift)[:, None] * K + kk[None, :], mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc2 = tl.dot(a, tl.trans(b2.to(a.dtype)), acc2, input_precision=DOT_PRECISION)
    if W_SCALED:
        acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
        if EPILOGUE >= 2:
            acc2 = acc2 * tl.load(scale_ptr + cols + shift, mask=col_ok, other=0.0)[None, :]
    if NORM:
        r = tl.rsqrt(squares / K + eps)
        acc = acc * r[:, None]
        acc2 = acc2 * r[:, None]
    ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K > 1:
        part = part_ptr + rows[:, None] * N + cols[None, :]
        tl.store(part + tl.program_id(1) * BLOCK_M * N, acc, mask=ok)
        tl.debug_barrier()                              # every thread's slice stored before the count is raised
        if tl.atomic_add(arrived_ptr + pid, 1, sem="acq_rel") == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(SPLIT_K):                    # slice order, whichever program is last: bit-reproducible
                acc += tl.load(part + s * BLOCK_M * N, mask=ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(arrived_ptr + pid, 0)         # ready for the next launch (a graph's replay)
            _finish(acc, out_ptr, res_ptr, rows, cols, ok, stride_out, stride_res, EPILOGUE)
    elif EPILOGUE <= 1:
        _finish(acc, out_ptr, res_ptr, rows, cols, ok, stride_out, stride_res, EPILOGUE)
    elif EPILOGUE == 2:
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
                 (_gelu_tanh(acc) * acc2).to(out_ptr.dtype.element_ty), mask=ok)
    elif EPILOGUE == 4:
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
                 (acc / (1.0 + tl.exp(-acc)) * acc2).to(out_ptr.dtype.element_ty), mask=ok)
    else:
        keep = 1.0
        if HAS_VALID:
            keep = tl.where(rows < tl.load(valid_ptr), 1.0, 0.0)[:, None]
        if head < HEADS + KV_HEADS:                       # queries and keys: RoPE (rotate-half)
            c = tl.load(cos_ptr + rows[:, None] * stride_cs + d[None, :], mask=ok, other=0.0)
            s = tl.load(sin_ptr + rows[:, None] * stride_cs + d[None, :], mask=ok, other=0.0)
            first = acc * c - acc2 * s
            second = acc2 * c + acc * s
        else:
            first = acc
            second = acc2
        if head < HEADS:
            dst = q_ptr + rows[:, None] * stride_q + head * 2 * HALF + d[None, :]
            tl.store(dst, first.to(q_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, second.to(q_ptr.dtype.element_ty), mask=ok)
        elif head < HEADS + KV_HEADS:
            dst = k_ptr + rows[:, None] * stride_k + (head - HEADS) * 2 * HALF + d[None, :]
            tl.store(dst, (first * keep).to(k_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, (second * keep).to(k_ptr.dtype.element_ty), mask=ok)
        else:
            dst = v_ptr + rows[:, None] * stride_v + (head - HEADS - KV_HEADS) * 2 * HALF + d[None, :]
            tl.store(dst, (first * keep).to(v_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, (second * keep).to(v_ptr.dtype.element_ty), mask=ok)


def _check(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> None:
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"rows_matmul: at most {MAX_ROWS} rows, got {x.shape[0]}")
    if x.stride(-1) != 1 or not w.is_contiguous():
        raise ValueError("rows_matmul: x rows and the weight matrix must be contiguous")
    if (w.dtype == torch.float8_e4m3fn) != (scale is not None):
        raise ValueError("rows_matmul: float8 weights need their per-column scales (and only they)")


def _split_scratch(w: torch.Tensor, split_k: int, n: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 slices and the arrival counts of a split-K product, one pair per weight matrix (``scratch``).
    One weight matrix's products run on one stream at a time (an engine runs one step at once)."""
    return kept(w, ("split-K", split_k, n, tiles),
                lambda: (torch.empty((split_k, MAX_ROWS, n), dtype=torch.float32, device=w.device),
                         torch.zeros(tiles, dtype=torch.int32, device=w.device)), "a split-K rows_matmul")


def _launch(grid: int, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, epilogue: str, n: int,
            norm_eps: float | None, config: Config | None, out=None, res=None, rope=None) -> None:
    block_n, block_k, num_warps, num_stages, *split = config or DEFAULT_CONFIGS[epilogue]
    split_k = split[0] if split else 1
    if x.dtype == torch.float32:        # four-byte tiles: bf16's four stages overflow shared memory (H100, 2026-12-07)
        num_stages = min(num_stages, FLOAT32_MAX_STAGES)
    K = x.shape[1]
    k_slice = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    split_k = triton.cdiv(K, k_slice)                   # no empty slice
    if split_k > 1 and (epilogue not in ("store", "residual") or norm_eps is not None):
        raise ValueError(f"rows_matmul: split-K is for the store and residual epilogues without a norm, not "
                         f"{epilogue}{' with a norm' if norm_eps is not None else ''}")
    dummy = x
    part, arrived = _split_scratch(w, split_k, n, grid) if split_k > 1 else (dummy, dummy)
    cos, sin, q, k, v, valid, heads, kv_heads, half = rope or (dummy,) * 5 + (None, 0, 0, 1)
    _rows_matmul_kernel[(grid, split_k)](
        x, w, scale if scale is not None else dummy, out if out is not None else dummy,
        res if res is not None else dummy, cos, sin, q, k, v, valid if valid is not None else dummy, part, arrived,
        x.shape[0], n, K, k_slice, x.stride(0), out.stride(0) if out is not None else 0,
        res.stride(0) if res is not None else 0, cos.stride(0), q.stride(0), k.stride(0), v.stride(0),
        float(norm_eps or 0.0),
        EPILOGUE=_EPILOGUES[epilogue], NORM=norm_eps is not None, W_SCALED=scale is not None,
        HAS_VALID=valid is not None, HEADS=heads, KV_HEADS=kv_heads, HALF=half,
        BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, num_warps=num_warps,
        num_stages=num_stages,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32")      # float32: exact products (no TF32)


def rows_matmul(x: torch.Tensor, w: torch.Tensor, *, residual: torch.Tensor | None = None,
                out: torch.Tensor | None = None, scale: torch.Tensor | None = None, norm_eps: float | None = None,
                config: Config | None = None) -> torch.Tensor:
    """``[residual +] rms(x) x @ (w * scale).T`` for ``x (M, K)``, ``w (N, K)``; see the module doc."""
    _check(x, w, scale)
    n = w.shape[0]
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    epilogue = "store" if residual is None else "residual"
    block_n = (config or DEFAULT_CONFIGS[epilogue])[0]
    _launch(triton.cdiv(n, block_n), x, w, scale, epilogue, n, norm_eps, config, out=out, res=residual)
    return out


def rows_gelu_gate(x: torch.Tensor, w: torch.Tensor, *, scale: torch.Tensor | None = None,
                   norm_eps: float | None = None, config: Config | None = None, silu: bool = False) -> torch.Tensor:
    """``gelu_tanh(g) * u`` (``silu``: ``silu(g) * u``) with ``[g | u] = rms(x) x @ (w * scale).T``;
    ``w (2F, K)`` -> ``(M, F)``."""
    _check(x, w, scale)
    f = w.shape[0] // 2
    out = torch.empty((x.shape[0], f), dtype=x.dtype, device=x.device)
    epilogue = "silu_gate" if silu else "gelu_gate"
    block_n = (config or DEFAULT_CONFIGS[epilogue])[0]
    _launch(triton.cdiv(f, block_n), x, w, scale, epilogue, f, norm_eps, config, out=out)
    return out


def rows_qkv_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int,
                  kv_heads: int, q_out: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor, *,
                  scale: torch.Tensor | None = None, norm_eps: float | None = None, valid: torch.Tensor | None = None,
                  config: Config | None = None) -> None:
    """``ops.fused_rows.qkv_rope`` of ``rms(x) x @ (w * scale).T`` without writing the product: RoPE'd queries
    into ``q_out (M, heads, D)``, keys and values into ``k_out`` / ``v_out (M, kv_heads, D)`` (row views)."""
    _check(x, w, scale)
    D = q_out.shape[-1]
    half = D // 2
    block_n = min((config or DEFAULT_CONFIGS["qkv_rope"])[0], half)
    if half % block_n:
        raise ValueError(f"rows_qkv_rope: half a head ({half}) must be a multiple of BLOCK_N ({block_n})")
    for t in (q_out, k_out, v_out):
        if t.stride(-1) != 1 or t.stride(-2) != D:
            raise ValueError("rows_qkv_rope: destination rows must hold their heads contiguously")
    cfg = (block_n,) + tuple((config or DEFAULT_CONFIGS["qkv_rope"])[1:])
    _launch((heads + 2 * kv_heads) * (half // block_n), x, w, scale, "qkv_rope", w.shape[0], norm_eps, cfg,
            rope=(cos, sin, q_out, k_out, v_out, valid, heads, kv_heads, half))
