"""Triton kernels of ``flashrt_ros.ops.fused_rows``: one program per row (or row block), float32 inside.

Why: each replaces a chain of small torch kernels of a VLA decoder layer (the
RMSNorm, the RoPE of queries and keys, the KV writes, the gated GELU, the residual
adds) with one launch; inside a captured plan that is what a layer's time is
made of besides its matrix products. None allocates persistent state, syncs with
the host or reads a host value that changes between replays (a prefix length is
read from a device tensor), so all are safe inside CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import next_power_of_2


@triton.jit
def _row_rsqrt(x_ptr, row, x_stride, n, eps, BLOCK_W: tl.constexpr):
    cols = tl.arange(0, BLOCK_W)
    xf = tl.load(x_ptr + row * x_stride + cols, mask=cols < n, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)


@triton.jit
def _qkv_rope_kernel(qkv_ptr, x_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, valid_ptr,
                     qkv_stride, x_stride, cs_stride, q_stride, k_stride, v_stride, half, width, eps,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HAS_X: tl.constexpr, HAS_VALID: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    row = tl.program_id(0)
    scale = 1.0
    if HAS_X:
        scale = _row_rsqrt(x_ptr, row, x_stride, width, eps, BLOCK_W)
    keep = 1.0
    if HAS_VALID:
        keep = tl.where(row < tl.load(valid_ptr), 1.0, 0.0)
    d = tl.arange(0, BLOCK_H)
    m = d < half
    c = tl.load(cos_ptr + row * cs_stride + d, mask=m, other=0.0)
    s = tl.load(sin_ptr + row * cs_stride + d, mask=m, other=0.0)
    base = qkv_ptr + row * qkv_stride
    head_dim = 2 * half
    for h in tl.static_range(HEADS + 2 * KV_HEADS):
        a1 = tl.load(base + h * head_dim + d, mask=m, other=0.0).to(tl.float32) * scale
        a2 = tl.load(base + h * head_dim + half + d, mask=m, other=0.0).to(tl.float32) * scale
        if h < HEADS:
            dst = q_ptr + row * q_stride + h * head_dim
            tl.store(dst + d, (a1 * c - a2 * s).to(q_ptr.dtype.element_ty), mask=m)
            tl.store(dst + half + d, (a2 * c + a1 * s).to(q_ptr.dtype.element_ty), mask=m)
        elif h < HEADS + KV_HEADS:
            dst = k_ptr + row * k_stride + (h - HEADS) * head_dim
            tl.store(dst + d, ((a1 * c - a2 * s) * keep).to(k_ptr.dtype.element_ty), mask=m)
            tl.store(dst + half + d, ((a2 * c + a1 * s) * keep).to(k_ptr.dtype.element_ty), mask=m)
        else:
            dst = v_ptr + row * v_stride + (h - HEADS - KV_HEADS) * head_dim
            tl.store(dst + d, (a1 * keep).to(v_ptr.dtype.element_ty), mask=m)
            tl.store(dst + half + d, (a2 * keep).to(v_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def qkv_rope(qkv, cos, sin, heads, kv_heads, q_out, k_out, v_out, x, eps, valid) -> None:
    L = qkv.shape[0]
    D = q_out.shape[-1]
    for t in (q_out, k_out, v_out):
        if t.stride(-1) != 1 or t.stride(-2) != D:
            raise ValueError("qkv_rope: outputs need contiguous heads of head_dim elements")
    if L == 0:
        return
    qkv, cos, sin = _rows(qkv), _rows(cos), _rows(sin)
    xr = _rows(x) if x is not None else qkv
    half = D // 2
    _qkv_rope_kernel[(L,)](
        qkv, xr, cos, sin, q_out, k_out, v_out, valid if valid is not None else qkv,
        qkv.stride(0), xr.stride(0), cos.stride(0), q_out.stride(0), k_out.stride(0), v_out.stride(0),
        half, xr.shape[-1], eps, HEADS=heads, KV_HEADS=kv_heads, HAS_X=x is not None, HAS_VALID=valid is not None,
        BLOCK_H=next_power_of_2(half), BLOCK_W=next_power_of_2(xr.shape[-1]) if x is not None else 16,
        num_warps=4)


@triton.jit
def _gate_kernel(gu_ptr, x_ptr, out_ptr, n_cols, gu_stride, x_stride, width, eps,
                 HAS_X: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr, BLOCK_W: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_cols
    scale = 1.0
    if HAS_X:
        scale = _row_rsqrt(x_ptr, row, x_stride, width, eps, BLOCK_W)
    g = tl.load(gu_ptr + row * gu_stride + cols, mask=m, other=0.0).to(tl.float32) * scale
    u = tl.load(gu_ptr + row * gu_stride + n_cols + cols, mask=m, other=0.0).to(tl.float32) * scale
    if SILU:
        act = g / (1.0 + tl.exp(-g))
    else:
        # gelu with the tanh approximation: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
        act = 0.5 * g * (1.0 + t)
    tl.store(out_ptr + row * n_cols + cols, (act * u).to(out_ptr.dtype.element_ty), mask=m)


def gated_activation(gate_up: torch.Tensor, x: torch.Tensor | None, eps: float, silu: bool) -> torch.Tensor:
    """``act(gate) * up`` per row: SiLU (Llama) or tanh-GELU (Gemma)."""
    gate_up = _rows(gate_up)
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0:
        return out
    xr = _rows(x) if x is not None else gate_up
    block = min(4096, next_power_of_2(n))
    _gate_kernel[(rows, triton.cdiv(n, block))](
        gate_up, xr, out, n, gate_up.stride(0), xr.stride(0), xr.shape[-1], eps, HAS_X=x is not None, SILU=silu,
        BLOCK=block, BLOCK_W=next_power_of_2(xr.shape[-1]) if x is not None else 16, num_warps=8)
    return out


def gelu_gate(gate_up: torch.Tensor, x: torch.Tensor | None, eps: float) -> torch.Tensor:
    return gated_activation(gate_up, x, eps, silu=False)


@triton.jit
def _residual_norm_kernel(x_ptr, u_ptr, gate_ptr, scale_ptr, shift_ptr, s_ptr, h_ptr, n, x_stride, u_stride, eps,
                          HAS_U: tl.constexpr, HAS_GATE: tl.constexpr, HAS_SHIFT: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=m, other=0.0)
    if HAS_U:
        u = tl.load(u_ptr + row * u_stride + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_GATE:
            u = u * tl.load(gate_ptr + cols, mask=m, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) + u).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * n + cols, x, mask=m)
    xf = x.to(tl.float32)
    h = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    h = h * (1.0 + tl.load(scale_ptr + cols, mask=m, other=0.0).to(tl.float32))
    if HAS_SHIFT:
        h = h + tl.load(shift_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * n + cols, h.to(h_ptr.dtype.element_ty), mask=m)


def residual_norm(x, update, gate, scale, shift, eps):
    x = _rows(x)
    rows, n = x.shape
    h = torch.empty_like(x)
    s = x if update is None else torch.empty_like(x)
    if rows == 0:
        return s, h
    u = _rows(update) if update is not None else x
    _residual_norm_kernel[(rows,)](
        x, u, gate if gate is not None else scale, scale, shift if shift is not None else scale, s, h, n,
        x.stride(0), u.stride(0), eps, HAS_U=update is not None, HAS_GATE=gate is not None,
        HAS_SHIFT=shift is not None, BLOCK=next_power_of_2(n), num_warps=4 if n <= 1024 else 8)
    return s, h


@triton.jit
def _residual_layer_norm_kernel(x_ptr, u_ptr, bias_ptr, w_ptr, b_ptr, s_ptr, h_ptr, n, x_stride, u_stride, eps,
                                HAS_U: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=m, other=0.0)
    if HAS_U:
        u = tl.load(u_ptr + row * u_stride + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            u = u + tl.load(bias_ptr + cols, mask=m, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) + u).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * n + cols, x, mask=m)
    xf = tl.where(m, x.to(tl.float32), 0.0)
    mean = tl.sum(xf, axis=0) / n
    diff = tl.where(m, xf - mean, 0.0)
    h = diff * tl.rsqrt(tl.sum(diff * diff, axis=0) / n + eps)
    h = h * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32) + tl.load(b_ptr + cols, mask=m,
                                                                               other=0.0).to(tl.float32)
    tl.store(h_ptr + row * n + cols, h.to(h_ptr.dtype.element_ty), mask=m)


def residual_layer_norm(x, update, bias, weight, ln_bias, eps):
    shape = x.shape
    x = _rows(x.reshape(-1, shape[-1]))
    rows, n = x.shape
    h = torch.empty_like(x)
    s = x if update is None else torch.empty_like(x)
    if rows:
        u = _rows(update.reshape(-1, n)) if update is not None else x
        _residual_layer_norm_kernel[(rows,)](
            x, u, bias if bias is not None else weight, weight, ln_bias, s, h, n, x.stride(0), u.stride(0), eps,
            HAS_U=update is not None, HAS_BIAS=bias is not None, BLOCK=next_power_of_2(n),
            num_warps=4 if n <= 1024 else 8)
    return s.reshape(shape), h.reshape(shape)
