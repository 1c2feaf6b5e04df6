"""Attention of a VLA's rows over one key head: a valid prefix, then block-masked action rows, one kernel.

Why: SDPA needs an explicit mask here (the prefix's padding rows, π0's state
token that must not see the actions), which rules out its flash kernel; its
memory-efficient kernel, at head dim 256 on an H100, took ~40 us a call and
8.2 of a π0 replan's 21 ms (``benchmarks.pi_profile``, 2026-12-06), though a
call is a few MFLOP over < 1 MB of keys. Here the mask is arithmetic on the key
index: keys below the prefix length (read from the device, so one graph fits
every instruction length), then the suffix rows, where a query sees a suffix key
when the key is one of the first ``STATE_ROWS`` or the query is past them. All
query heads share the one key head, so they are folded into the rows (row
``l * H + h``) and every key block is read once per row tile. Online softmax in
base 2, float32 accumulation (``ops.triton.attention._softmax_step``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton.attention import _softmax_step
from flashrt_ros.ops.triton.scratch import kept

_LOG2E = math.log2(math.e)


@triton.jit
def _prefix_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, valid_ptr,
                             arrived_ptr, n_rows, qk_scale, stride_kt, stride_vt,
                             SUFFIX_START: tl.constexpr, SUFFIX_LEN: tl.constexpr, HEADS: tl.constexpr,
                             STATE_ROWS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                             MERGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One (row tile, key slice ``[s * SPLIT, (s + 1) * SPLIT)``) of the prefix + suffix key index. One slice
    (``NUM_SPLITS == 1``): the normalised output; several: the unnormalised accumulator, row max (base 2) and row
    sum for ``_prefix_combine_kernel``, a slice wholly in the prefix's padding writing ``max = -inf`` only.
    ``MERGE``: no second kernel; the last of a row tile's programs to arrive (``arrived_ptr`` counts them and it
    sets the count back to 0) merges the slices itself, in slice order."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < n_rows
    part = rows * NUM_SPLITS + split
    lo = split * SPLIT
    valid = tl.load(valid_ptr).to(tl.int32)
    padding = (lo >= valid) & (lo + SPLIT <= SUFFIX_START)         # a slice no query sees a key of
    if NUM_SPLITS > 1:
        if padding:
            tl.store(part_max_ptr + part, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok)
        else:
            _slice(q_ptr, k_ptr, v_ptr, o_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, valid, rows, row_ok, part,
                   lo, qk_scale, stride_kt, stride_vt, SUFFIX_START, SUFFIX_LEN, HEADS, STATE_ROWS, D, BLOCK_M,
                   BLOCK_N, SPLIT, NUM_SPLITS, DOT_PRECISION)
    else:
        _slice(q_ptr, k_ptr, v_ptr, o_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, valid, rows, row_ok, part, lo,
               qk_scale, stride_kt, stride_vt, SUFFIX_START, SUFFIX_LEN, HEADS, STATE_ROWS, D, BLOCK_M, BLOCK_N,
               SPLIT, NUM_SPLITS, DOT_PRECISION)
    if MERGE:
        tl.debug_barrier()                          # every thread's partials stored before the count is raised
        if tl.atomic_add(arrived_ptr + tl.program_id(0), 1, sem="acq_rel") == NUM_SPLITS - 1:
            _merge(part_acc_ptr, part_max_ptr, part_sum_ptr, o_ptr, rows, row_ok, D, BLOCK_M, NUM_SPLITS,
                   SPLITS_PAD, ".cg")
            tl.atomic_xchg(arrived_ptr + tl.program_id(0), 0)        # ready for the next launch (a replay)


@triton.jit
def _slice(q_ptr, k_ptr, v_ptr, o_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, valid, rows, row_ok, part, lo,
           qk_scale, stride_kt, stride_vt, SUFFIX_START: tl.constexpr, SUFFIX_LEN: tl.constexpr,
           HEADS: tl.constexpr, STATE_ROWS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax of a row tile over the keys ``[lo, lo + SPLIT)``: the output (one slice) or the partials."""
    query = rows // HEADS
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + rows[:, None] * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # static bounds (fixed per policy: the padding past ``valid`` is a block or so, and triton's interpreter takes
    # no loop bound read from memory)
    for n in range(0, SPLIT, BLOCK_N):
        key = lo + n + keys
        i = key - SUFFIX_START                        # the suffix row, where >= 0
        in_prefix = key < SUFFIX_START
        live = tl.where(in_prefix, key < valid, i < SUFFIX_LEN)
        k = tl.load(k_ptr + key[:, None] * stride_kt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_ptr + key[:, None] * stride_vt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        # a prefix key: seen where valid; a suffix key: π0's state rows see only themselves
        seen = live[None, :] & (in_prefix[None, :] | (i[None, :] < STATE_ROWS) | (query[:, None] >= STATE_ROWS))
        qk = tl.where(seen, qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)
    if NUM_SPLITS == 1:
        tl.store(o_ptr + rows[:, None] * D + cols[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
    else:
        tl.store(part_acc_ptr + part[:, None] * D + cols[None, :], acc, mask=row_ok[:, None])
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)


@triton.jit
def _merge(part_acc_ptr, part_max_ptr, part_sum_ptr, o_ptr, rows, row_ok, D: tl.constexpr, BLOCK_R: tl.constexpr,
           NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, CACHE: tl.constexpr):
    """``rows``' slices' partial softmaxes merged by log-sum-exp rescaling, in slice order (the same sum on every
    call: a replan is bit-reproducible). ``CACHE``: ``.cg`` where other programs of this launch wrote them."""
    slices = tl.arange(0, SPLITS_PAD)
    ok = row_ok[:, None] & (slices[None, :] < NUM_SPLITS)
    top = tl.max(tl.load(part_max_ptr + rows[:, None] * NUM_SPLITS + slices[None, :], mask=ok,
                         other=float("-inf"), cache_modifier=CACHE), 1)
    cols = tl.arange(0, D)
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    total = tl.zeros([BLOCK_R], tl.float32)
    for s in range(NUM_SPLITS):
        part_max = tl.load(part_max_ptr + rows * NUM_SPLITS + s, mask=row_ok, other=float("-inf"),
                           cache_modifier=CACHE)
        live = row_ok & (part_max > float("-inf"))
        weight = tl.where(live, tl.exp2(part_max - top), 0.0)
        total += weight * tl.load(part_sum_ptr + rows * NUM_SPLITS + s, mask=live, other=0.0, cache_modifier=CACHE)
        part = tl.load(part_acc_ptr + (rows[:, None] * NUM_SPLITS + s) * D + cols[None, :], mask=live[:, None],
                       other=0.0, cache_modifier=CACHE)
        acc += part * weight[:, None]
    tl.store(o_ptr + rows[:, None] * D + cols[None, :], (acc / total[:, None]).to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _prefix_combine_kernel(part_acc_ptr, part_max_ptr, part_sum_ptr, o_ptr, n_rows, D: tl.constexpr,
                           BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """``BLOCK_R`` rows of a split launch merged (``_merge``) by a second kernel."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    _merge(part_acc_ptr, part_max_ptr, part_sum_ptr, o_ptr, rows, rows < n_rows, D, BLOCK_R, NUM_SPLITS, SPLITS_PAD,
           "")


#: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the one-pass kernel: row tiles that each read every key
OnePass = tuple[int, int, int, int]
#: ``(BLOCK_M, BLOCK_N, SPLIT, num_warps, num_stages[, MERGE])`` of the split-key kernel: programs per (row tile,
#: slice); ``MERGE`` 1: the last program of a row tile merges the slices (no second kernel: 180 fewer launches a π0
#: replan), off until a device run measures it (``benchmarks.kernel_expert``)
Split = tuple[int, ...]
#: above this many query rows (a prefix: cameras x 256 x 8 heads) row tiles alone fill the GPU; below (the
#: expert's chunk x 8 heads = 408) the keys are split over programs too, and a second kernel merges the slices
SPLIT_BELOW_ROWS = 2048


def attention_config(rows: int, n_keys: int, dtype: torch.dtype = torch.bfloat16) -> OnePass | Split:
    """The launch shape for ``rows`` query rows over ``n_keys`` key rows (prefix + suffix). One-pass for a
    prefix: 64-row tiles (70 programs for 2 cameras) measured at 4.68 ms for a π0 replan's 197 calls on an H100
    (2026-12-06) with the expert's calls still one-pass; the expert's few rows take the split-key form.
    float32 (the check path) holds four-byte tiles: the bf16 shapes asked an H100 for 336 KiB of shared memory
    (2026-12-07), so it takes 32-key tiles in one stage."""
    if dtype == torch.float32:
        return (32, 32, 4, 1) if rows > SPLIT_BELOW_ROWS else (16, 32, 128, 4, 1)
    if rows > SPLIT_BELOW_ROWS:
        return (64, 64, 4, 3)          # H100, 2026-12-07: 16.0 us a π0 prefix call ((64, 64, 8, 2): 23.4)
    return (16, 64, 128, 4, 2)         # H100, 2026-12-07: 10.8 us an expert call (one-pass: 18.0, SDPA: 42.4)


def prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                     suffix_start: int, suffix_len: int, state_rows: int,
                     config: OnePass | Split | None = None) -> torch.Tensor:
    L, H, D = q.shape
    if not q.is_contiguous():
        q = q.contiguous()
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or keys.shape[1] != 1:
        raise ValueError("prefix_attention: one key head with contiguous head dims")
    if D != triton.next_power_of_2(D) or D < 16:
        raise ValueError(f"prefix_attention: head dim {D} must be a power of two >= 16")
    out = torch.empty((L, H * D), dtype=q.dtype, device=q.device)
    rows = L * H
    if rows == 0:
        return out
    n_keys = suffix_start + suffix_len
    config = config or attention_config(rows, n_keys, q.dtype)
    scale = D ** -0.5 * _LOG2E
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    fixed = dict(SUFFIX_START=suffix_start, SUFFIX_LEN=suffix_len, HEADS=H, STATE_ROWS=state_rows, D=D,
                 DOT_PRECISION=precision)
    if len(config) == 4:                         # one pass: one slice of every key
        block_m, block_n, num_warps, num_stages = config
        split, merge = triton.cdiv(n_keys, block_n) * block_n, False
    else:
        block_m, block_n, split, num_warps, num_stages, *merge_flag = config
        merge = bool(merge_flag and merge_flag[0])
    n_splits = triton.cdiv(n_keys, split)
    tiles = triton.cdiv(rows, block_m)
    if n_splits == 1:                            # the output written at once, no partials to merge
        _prefix_attention_kernel[(tiles, 1)](
            q, keys, values, out, out, out, out, valid, valid, rows, scale, keys.stride(0), values.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=triton.cdiv(n_keys, block_n) * block_n, NUM_SPLITS=1,
            SPLITS_PAD=1, MERGE=False, num_warps=num_warps, num_stages=num_stages, **fixed)
        return out
    part_acc = torch.empty((rows, n_splits, D), dtype=torch.float32, device=q.device)
    part_max = torch.empty((rows, n_splits), dtype=torch.float32, device=q.device)
    part_sum = torch.empty((rows, n_splits), dtype=torch.float32, device=q.device)
    splits_pad = triton.next_power_of_2(n_splits)
    arrived = _arrival_counts(keys, tiles) if merge else valid
    _prefix_attention_kernel[(tiles, n_splits)](
        q, keys, values, out, part_acc, part_max, part_sum, valid, arrived, rows, scale, keys.stride(0),
        values.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split, NUM_SPLITS=n_splits, SPLITS_PAD=splits_pad,
        MERGE=merge, num_warps=num_warps, num_stages=num_stages, **fixed)
    if not merge:
        block_r = 16
        _prefix_combine_kernel[(triton.cdiv(rows, block_r),)](
            part_acc, part_max, part_sum, out, rows, D=D, BLOCK_R=block_r, NUM_SPLITS=n_splits,
            SPLITS_PAD=splits_pad, num_warps=4)
    return out


def _arrival_counts(keys: torch.Tensor, tiles: int) -> torch.Tensor:
    """A merged split launch's arrival counts, one per row tile and key buffer (a layer's KV rows: ``scratch``).
    One layer's attention runs on one stream at a time."""
    return kept(keys, ("merged attention", tiles), lambda: torch.zeros(tiles, dtype=torch.int32, device=keys.device),
                "a merged split prefix_attention")
