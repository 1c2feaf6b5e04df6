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

_LOG2E = math.log2(math.e)


@triton.jit
def _prefix_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, valid_ptr, n_rows, qk_scale, stride_kt, stride_vt,
                             SUFFIX_START: tl.constexpr, SUFFIX_LEN: tl.constexpr, HEADS: tl.constexpr,
                             STATE_ROWS: tl.constexpr,
                             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             DOT_PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    query = rows // HEADS
    cols = tl.arange(0, D)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + rows[:, None] * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    valid = tl.load(valid_ptr).to(tl.int32)
    # the prefix: every query sees its valid keys (static bounds, fixed per policy: the padding past ``valid``
    # is a block or so, and triton's interpreter takes no loop bound read from memory)
    for n in range(0, SUFFIX_START, BLOCK_N):
        key = n + keys
        live = (key < valid) & (key < SUFFIX_START)
        k = tl.load(k_ptr + key[:, None] * stride_kt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_ptr + key[:, None] * stride_vt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        qk = tl.where(live[None, :], qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)
    for n in range(0, SUFFIX_LEN, BLOCK_N):                  # the suffix: the state rows' block rule
        i = n + keys
        live = i < SUFFIX_LEN
        at = SUFFIX_START + i
        k = tl.load(k_ptr + at[:, None] * stride_kt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_ptr + at[:, None] * stride_vt + cols[None, :], mask=live[:, None], other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        seen = live[None, :] & ((i[None, :] < STATE_ROWS) | (query[:, None] >= STATE_ROWS))
        qk = tl.where(seen, qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * D + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                     suffix_start: int, suffix_len: int, state_rows: int) -> torch.Tensor:
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
    block_m = 64 if rows > 2048 else 16
    _prefix_attention_kernel[(triton.cdiv(rows, block_m),)](
        q, keys, values, out, valid, rows, D ** -0.5 * _LOG2E, keys.stride(0), values.stride(0),
        SUFFIX_START=suffix_start, SUFFIX_LEN=suffix_len, HEADS=H, STATE_ROWS=state_rows, D=D, BLOCK_M=block_m, BLOCK_N=64,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=8 if block_m == 64 else 4, num_stages=2)
    return out
