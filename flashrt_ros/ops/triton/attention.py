"""Causal attention over the live rows of a static KV cache, as two triton kernels.

Why not the torch reference (``flashrt_ros.ops.static_kv_attention``): it masks
and reads the whole ``[max_context, KV, D]`` buffer on every call, so a step
costs as much at position 10 as at position 16k, and the explicit mask rules out
the flash SDPA kernels. Here the cost follows the *live* length ``start + T``:
programs loop only over key blocks below it and skip the rest, while the
launch shapes depend on the buffer size alone.

Why ``start`` is a device tensor read inside the kernels: a CUDA graph captured
once must serve every position, so nothing may depend on a host-side copy of
the position (no ``.item()``, no grid sized by it). The wrapper allocates only
scratch (from the graph's pool when captured) and never syncs.

Grouped-query attention is native: query head ``h`` reads kv head
``h // (H // KV)``; the decode kernel stacks the heads of one group into a
single query tile so each kv row is read once per group, not once per head.

Three forms, picked by the chunk length alone (so a graph fits every position):
- long prefill chunks (T > ``_SHORT_MAX_QUERIES``): a FlashAttention-2 style
  forward, one program per (query tile, head), an online softmax in base 2, the
  causal mask applied only on the blocks that cross the diagonal;
- short prefill chunks (a follow-up turn of 2..256 tokens after thousands of
  cached ones): split-key, like decode. The flash form would run only
  ``cdiv(T, 128) x H`` programs (8 for 64 tokens of the hybrid) over the whole
  history, reading the KV at ~1 % of HBM bandwidth; here the grid is
  (row tile, kv head, key slice), rows stacking a group's heads so each kv row
  is read once per group, and a combine kernel merges the slices;
- decode (T == 1): the same split-key kernels, the group's heads forming one tile.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import Switch, next_power_of_2
from flashrt_ros.ops.triton.scratch import kept

#: the split-key forms (decode, short chunks) merged by their own last program instead of a combine kernel: one
#: launch fewer a layer; the same bits (``_combine_row``); off until a device run measures it
#: (``benchmarks.kernel_decode_fusion``)
merged_split_attention = Switch(enabled=False)

_LOG2E = math.log2(math.e)
_DECODE_TARGET_SPLITS = 64      # split slices per kv head at full cache (H200: 132 SMs)
_COMBINE_CHUNK = 16             # partials merged per iteration of the combine loop
_SHORT_MAX_QUERIES = 256        # prefill chunks up to this length take the split-key kernel
_SHORT_MIN_SPLIT = 128          # keys per slice at least (partials cost bytes too)
# (stacked query rows per program at most, programs at a full cache) by head dim: measured on an H200
# in a CUDA graph (benchmarks/kernel_attention.py --short, 64-token turn at 2k and 16k): dim 256
# (128, 132) 16 / 37 us per layer (905 GB/s of live KV at 16k; SDPA flash 22 / 48 us); dim 64
# (64, 528) 9 / 19 us (SDPA 12 / 24 us).
_SHORT_BLOCK_M = {True: 128, False: 64}            # keyed by head_dim >= 128
_SHORT_TARGET_PROGRAMS = {True: 132, False: 528}


def _prefill_config(head_dim: int, n_queries: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` for a prefill; BLOCK_M shrinks for short prompts.

    Picked on an H200 with benchmarks/kernel_attention.py (2048-token chunk at
    start 14336): dim 256 (128, 64, 8, 2) at 433 TFLOP/s, dim 64 (64, 64, 4, 3)
    at 238 TFLOP/s; both beat SDPA's flash kernel on the same keys there. Dim 128
    takes the dim-256 config (not measured).
    """
    if head_dim >= 128:
        block_m, block_n, num_warps, num_stages = 128, 64, 8, 2
    else:
        block_m, block_n, num_warps, num_stages = 64, 64, 4, 3
    return min(block_m, max(16, next_power_of_2(n_queries))), block_n, num_warps, num_stages


def _decode_config(head_dim: int, max_context: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, SPLIT, NUM_SPLITS, num_warps, num_stages)`` for a decode step.

    Depends on the cache size only, never on the position, so one captured
    graph fits every position: SPLIT is a power of two (a multiple of BLOCK_N)
    giving about ``_DECODE_TARGET_SPLITS`` slices when the cache is full. (Four
    key blocks per slice at least made a 2k-cache decode no faster on an H200:
    the split kernel slowed by what the combine kernel gained.)
    """
    block_n = 32 if head_dim >= 256 else 64
    per_split = max(max_context // _DECODE_TARGET_SPLITS, 1)
    split = max(block_n, 1 << (per_split.bit_length() - 1))
    return block_n, split, triton.cdiv(max_context, split), 4, 2


def _short_config(head_dim: int, n_queries: int, group: int, n_kv: int,
                  max_context: int) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, SPLIT, NUM_SPLITS, num_warps, num_stages)`` of the split-key prefill.

    Rows are ``T * group`` (a kv head's query heads stacked). The key slice
    SPLIT is a power of two (>= ``_SHORT_MIN_SPLIT``, a multiple of BLOCK_N)
    chosen from the cache size and the row tiles so that a full cache gives
    about ``_SHORT_TARGET_PROGRAMS`` programs; it never depends on the position.
    Stacking a whole GQA group's rows in one tile (128 rows for dim 256) reads
    each kv row once per slice instead of once per tile.
    """
    rows = n_queries * group
    wide = head_dim >= 128
    block_m = min(_SHORT_BLOCK_M[wide], max(16, next_power_of_2(rows)))
    block_n = 64
    tiles = triton.cdiv(rows, block_m) * n_kv
    wanted = max(1, _SHORT_TARGET_PROGRAMS[wide] // tiles)
    split = max(_SHORT_MIN_SPLIT, next_power_of_2(triton.cdiv(max_context, wanted)))
    num_warps, num_stages = (8, 2) if head_dim >= 128 else (4, 3)
    return block_m, block_n, split, triton.cdiv(max_context, split), num_warps, num_stages


@triton.jit
def _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION: tl.constexpr):
    """Fold one key block (base-2 logits ``qk``, values ``v``) into the running softmax.

    A row that has seen only masked keys so far keeps ``m = -inf`` and zero
    weight (the ``m_use`` guard avoids ``-inf - -inf``).
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(qk - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attention_prefill_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, n_queries, qk_scale,
        stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        DOT_PRECISION: tl.constexpr):
    """One (query tile, head): rows ``m0 .. m0+BLOCK_M`` sit at positions ``start + row``."""
    m0 = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    start = tl.load(start_ptr).to(tl.int32)
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + cols[None, :] * stride_qd,
                mask=rows[:, None] < n_queries, other=0.0)
    k_base = k_ptr + (head // GROUP) * stride_kh + cols[None, :]
    v_base = v_ptr + (head // GROUP) * stride_vh + cols[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # Whole blocks at or below the tile's first position: every row sees them, no mask.
    full_end = (start + m0 + 1) // BLOCK_N * BLOCK_N
    for n in range(0, full_end, BLOCK_N):
        k = tl.load(k_base + (n + keys)[:, None] * stride_kt).to(q.dtype)
        v = tl.load(v_base + (n + keys)[:, None] * stride_vt).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)

    # Blocks crossing the diagonal, up to the tile's last live position: causal mask.
    end = start + tl.minimum(m0 + BLOCK_M, n_queries)
    for n in range(full_end, end, BLOCK_N):
        key_pos = n + keys
        live = key_pos[:, None] < end
        k = tl.load(k_base + key_pos[:, None] * stride_kt, mask=live, other=0.0).to(q.dtype)
        v = tl.load(v_base + key_pos[:, None] * stride_vt, mask=live, other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        qk = tl.where(key_pos[None, :] <= start + rows[:, None], qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)

    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + cols[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < n_queries)


@triton.jit
def _attention_split_kernel(
        q_ptr, k_ptr, v_ptr, start_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, arrived_ptr, o_ptr, n_queries,
        qk_scale, stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
        CHUNK: tl.constexpr, MERGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One (row tile, kv head, key slice) of a short prefill chunk or a decode step.

    Row ``r`` is query ``t = r // GROUP`` of head ``kv * GROUP + r % GROUP`` at
    position ``start + t``; the slice covers keys ``[s*SPLIT, (s+1)*SPLIT)`` up to
    the tile's last position. Writes the unnormalised accumulator, row max
    (base 2) and row sum per (query, head, slice); a slice wholly past the tile
    exits at once, and the combine kernel reads only slices a row can see.
    ``MERGE``: no combine kernel; the last of the tile's live slices to arrive
    (``arrived_ptr`` counts them per (tile, kv head) and it sets the count back
    to 0) merges its rows with the combine kernel's own code (``_combine_row``).
    """
    m0 = tl.program_id(0) * BLOCK_M
    kv = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(start_ptr).to(tl.int32)
    t_last = tl.minimum((m0 + BLOCK_M - 1) // GROUP, n_queries - 1)
    end = start + t_last + 1                       # keys the tile's last row can see
    lo = split * SPLIT
    if lo >= end:
        return
    hi = tl.minimum(lo + SPLIT, end)
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < n_queries * GROUP
    t = rows // GROUP
    head = kv * GROUP + rows % GROUP
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + cols[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    pos = start + t
    k_base = k_ptr + kv * stride_kh + cols[None, :]
    v_base = v_ptr + kv * stride_vh + cols[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n in range(lo, hi, BLOCK_N):
        key_pos = n + keys
        live = key_pos < hi
        k = tl.load(k_base + key_pos[:, None] * stride_kt, mask=live[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_base + key_pos[:, None] * stride_vt, mask=live[:, None], other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        qk = tl.where(key_pos[None, :] <= pos[:, None], qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)

    part = (t * H + head) * NUM_SPLITS + split
    tl.store(part_acc_ptr + part[:, None] * D + cols[None, :], acc, mask=row_ok[:, None])
    tl.store(part_max_ptr + part, m_i, mask=row_ok)
    tl.store(part_sum_ptr + part, l_i, mask=row_ok)
    if MERGE:
        tl.debug_barrier()                          # every thread's partials stored before the count is raised
        slot = tl.program_id(0) * tl.num_programs(1) + kv
        n_live = (end + SPLIT - 1) // SPLIT         # the tile's slices that did not exit
        if tl.atomic_add(arrived_ptr + slot, 1, sem="acq_rel") == n_live - 1:
            for i in tl.static_range(BLOCK_M):
                r = m0 + i
                if r < n_queries * GROUP:
                    _combine_row(part_acc_ptr, part_max_ptr, part_sum_ptr, start, o_ptr, stride_ot, stride_oh,
                                 r // GROUP, kv * GROUP + r % GROUP, H, D, SPLIT, NUM_SPLITS, SPLITS_PAD, CHUNK,
                                 ".cg")
            tl.atomic_xchg(arrived_ptr + slot, 0)   # ready for the next launch (a replay)


@triton.jit
def _attention_combine_kernel(
        part_acc_ptr, part_max_ptr, part_sum_ptr, start_ptr, o_ptr, stride_ot, stride_oh,
        H: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr,
        SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """One (query, head): merge the partial softmaxes of the slices it sees (``_combine_row``)."""
    row = tl.program_id(0)                   # t * H + head
    _combine_row(part_acc_ptr, part_max_ptr, part_sum_ptr, tl.load(start_ptr).to(tl.int32), o_ptr, stride_ot,
                 stride_oh, row // H, row % H, H, D, SPLIT, NUM_SPLITS, SPLITS_PAD, CHUNK, "")


@triton.jit
def _combine_row(part_acc_ptr, part_max_ptr, part_sum_ptr, start, o_ptr, stride_ot, stride_oh, t, head,
                 H: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr,
                 SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr, CACHE: tl.constexpr):
    """Query ``t``'s head ``head``: the partial softmaxes of the slices it sees merged by log-sum-exp rescaling,
    in slice order (the combine kernel and a merging split program run this same code: the same bits).
    ``CACHE``: ``.cg`` where other programs of this launch wrote the partials."""
    n_live = (start + t + SPLIT) // SPLIT    # cdiv(start + t + 1, SPLIT)
    base = (t * H + head) * NUM_SPLITS
    slices = tl.arange(0, SPLITS_PAD)
    part_max = tl.load(part_max_ptr + base + slices, mask=slices < n_live, other=float("-inf"),
                       cache_modifier=CACHE)
    part_sum = tl.load(part_sum_ptr + base + slices, mask=slices < n_live, other=0.0, cache_modifier=CACHE)
    top = tl.max(part_max, 0)
    total = tl.sum(part_sum * tl.exp2(part_max - top), 0)

    cols = tl.arange(0, D)
    chunk = tl.arange(0, CHUNK)
    acc = tl.zeros([D], tl.float32)
    for c in range(0, n_live, CHUNK):
        live = c + chunk < n_live
        weight = tl.exp2(tl.load(part_max_ptr + base + c + chunk, mask=live, other=float("-inf"),
                                 cache_modifier=CACHE) - top)
        part = tl.load(part_acc_ptr + (base + c + chunk)[:, None] * D + cols[None, :],
                       mask=live[:, None], other=0.0, cache_modifier=CACHE)
        acc += tl.sum(part * weight[:, None], 0)
    tl.store(o_ptr + t * stride_ot + head * stride_oh + cols, (acc / total).to(o_ptr.dtype.element_ty))


def static_kv_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        start: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """Causal GQA attention of ``q [T, H, D]`` (positions ``start .. start+T-1``) over cache rows ``0 .. start+T-1``.

    ``k_cache``/``v_cache`` are ``[S, KV, D]`` and already hold the new rows;
    rows past ``start+T-1`` are never read. ``start`` is a one-element integer
    tensor on q's device, read only by the kernels. Returns ``[T, H, D]``
    contiguous in ``q.dtype``, accumulated in float32.
    """
    n_queries, n_heads, head_dim = q.shape
    max_context, n_kv, _ = k_cache.shape
    assert v_cache.shape == k_cache.shape and n_heads % n_kv == 0 and start.numel() == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert head_dim >= 16 and head_dim == next_power_of_2(head_dim)
    group = n_heads // n_kv
    qk_scale = (head_dim ** -0.5 if scale is None else scale) * _LOG2E
    # fp32 inputs: exact products (tf32 would lose ~1e-3); 16-bit inputs ignore the setting.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    out = torch.empty((n_queries, n_heads, head_dim), dtype=q.dtype, device=q.device)

    if n_queries > max(_SHORT_MAX_QUERIES, 1):
        block_m, block_n, num_warps, num_stages = _prefill_config(head_dim, n_queries)
        _attention_prefill_kernel[(triton.cdiv(n_queries, block_m), n_heads)](
            q, k_cache, v_cache, out, start, n_queries, qk_scale,
            q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
            GROUP=group, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=precision,
            num_warps=num_warps, num_stages=num_stages)
        return out

    if n_queries > 1:
        block_m, block_n, split, n_splits, num_warps, num_stages = _short_config(
            head_dim, n_queries, group, n_kv, max_context)
    else:                                  # decode: the group's heads are the rows of one tile
        block_n, split, n_splits, num_warps, num_stages = _decode_config(head_dim, max_context)
        block_m = max(16, next_power_of_2(group))
    part_acc = torch.empty((n_queries * n_heads, n_splits, head_dim), dtype=torch.float32, device=q.device)
    part_max = torch.empty((n_queries * n_heads, n_splits), dtype=torch.float32, device=q.device)
    part_sum = torch.empty((n_queries * n_heads, n_splits), dtype=torch.float32, device=q.device)
    tiles = triton.cdiv(n_queries * group, block_m)
    splits_pad = next_power_of_2(n_splits)
    chunk = min(_COMBINE_CHUNK, splits_pad)
    merge = merged_split_attention.enabled
    arrived = (kept(k_cache, ("split_attention", tiles, n_kv),
                    lambda: torch.zeros(tiles * n_kv, dtype=torch.int32, device=q.device), "merged split attention")
               if merge else part_max)
    _attention_split_kernel[(tiles, n_kv, n_splits)](
        q, k_cache, v_cache, start, part_acc, part_max, part_sum, arrived, out, n_queries, qk_scale,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        H=n_heads, GROUP=group, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split,
        NUM_SPLITS=n_splits, SPLITS_PAD=splits_pad, CHUNK=chunk, MERGE=merge, DOT_PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages)
    if not merge:
        _attention_combine_kernel[(n_queries * n_heads,)](
            part_acc, part_max, part_sum, start, out, out.stride(0), out.stride(1),
            H=n_heads, D=head_dim, SPLIT=split, NUM_SPLITS=n_splits, SPLITS_PAD=splits_pad,
            CHUNK=chunk, num_warps=4)
    return out

