"""Gated DeltaNet decode in a few launches: conv window, recurrent step with gated norm, prefill norm.

Why: at batch 1 a decode step is launch-bound, and the torch path of one
Gated DeltaNet layer is about forty tiny kernels (splits, l2 norms, softplus,
sigmoid, decay, two state contractions, the outer-product update, the copy
back into the arena, the gated RMSNorm). Here the conv-window update is one
launch and the whole recurrent step, norm included, is another: one program
per value head holds that head's ``[dk, dv]`` float32 state tile in registers,
updates it and writes it back in place into the arena buffer, so nothing is
allocated but the output. There are no host syncs, no data-dependent shapes
and no autotuning, so both calls can be captured in a CUDA graph.

Rounding follows the torch references (``ops.causal_conv``, ``ops.gated_delta``,
``ops.norms.gated_rms_norm`` and the layer in ``models.hybrid.gated_deltanet``):
the two paths differ only by float32 summation order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import next_power_of_2

_CONV_BLOCK_C = 256
_CONV_BLOCK_T = 16
_CONV_ONE_LAUNCH_T = 64         # up to this many tokens: one program sees every step (state updated in it)
_CONV_NARROW_C = 64             # channels per program then (a 64 x 64 tile does not spill)
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _conv_state_update(x_ptr, stride_xt, state_ptr, T, offs_c, mask_c,
                       W: tl.constexpr, BLOCK_W: tl.constexpr):
    """Overwrite ``state[c, :]`` with the last ``W`` columns of ``[state | x^T]`` for this program's channels.

    Everything is loaded before a block barrier and stored after it, so no
    thread of the program can overwrite an old value another thread still reads.
    """
    j = tl.arange(0, BLOCK_W)
    src = T + j                                    # column of [state | x^T]
    from_x = src >= W
    mask_j = j < W
    xv = tl.load(x_ptr + (src - W)[None, :].to(tl.int64) * stride_xt + offs_c[:, None],
                 mask=mask_c[:, None] & (mask_j & from_x)[None, :], other=0.0)
    sv = tl.load(state_ptr + offs_c[:, None] * W + src[None, :],
                 mask=mask_c[:, None] & (mask_j & (src < W))[None, :], other=0.0)
    # the reference concatenates in x's dtype, then copies back into the state's
    new = tl.where(from_x[None, :], xv, sv.to(x_ptr.dtype.element_ty)).to(state_ptr.dtype.element_ty)
    tl.debug_barrier()
    tl.store(state_ptr + offs_c[:, None] * W + j[None, :], new, mask=mask_c[:, None] & mask_j[None, :])


@triton.jit
def _causal_conv_kernel(x_ptr, stride_xt, state_ptr, w_ptr, stride_wc, stride_wk, bias_ptr, out_ptr, T, C,
                        S1, S2,
                        K: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                        HAS_BIAS: tl.constexpr, SILU: tl.constexpr, UPDATE_STATE: tl.constexpr,
                        SECTIONED: tl.constexpr):
    """Conv of a (channel block, time block) tile.

    ``SECTIONED``: channels ``[0, S1) | [S1, S2) | [S2, C)`` are written as three
    consecutive row-major ``[T, width]`` matrices instead of one ``[T, C]``, so
    each section is a contiguous tensor (fla's kernels copy strided inputs).
    """
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_c = offs_c < C
    mask_t = offs_t < T
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(K):
        src = offs_t + (k - (K - 1))               # input time; negative reads the state window
        in_x = (mask_t & (src >= 0))[:, None] & mask_c[None, :]
        in_state = (mask_t & (src < 0))[:, None] & mask_c[None, :]
        xv = tl.load(x_ptr + src[:, None].to(tl.int64) * stride_xt + offs_c[None, :], mask=in_x, other=0.0)
        sv = tl.load(state_ptr + offs_c[None, :] * (K - 1) + (src + (K - 1))[:, None], mask=in_state, other=0.0)
        val = tl.where(in_x, xv, sv.to(x_ptr.dtype.element_ty)).to(tl.float32)
        wk = tl.load(w_ptr + offs_c * stride_wc + k * stride_wk, mask=mask_c, other=0.0).to(tl.float32)
        acc += val * wk[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    rows = offs_t[:, None].to(tl.int64)
    cols = offs_c[None, :]
    if SECTIONED:
        dst = tl.where(cols < S1, rows * S1 + cols,
                       tl.where(cols < S2, S1 * T + rows * (S2 - S1) + (cols - S1),
                                S2 * T + rows * (C - S2) + (cols - S2)))
    else:
        dst = rows * C + cols
    tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_c[None, :])
    if UPDATE_STATE:                               # only when this program sees every time step
        _conv_state_update(x_ptr, stride_xt, state_ptr, T, offs_c, mask_c, K - 1, BLOCK_W)


@triton.jit
def _conv_state_kernel(x_ptr, stride_xt, state_ptr, T, C,
                       W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    _conv_state_update(x_ptr, stride_xt, state_ptr, T, offs_c, offs_c < C, W, BLOCK_W)


def causal_conv1d_update(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, silu: bool = True,
                         sections: tuple[int, int, int] | None = None,
                         ) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Triton ``causal_conv1d_with_state``: conv ``x [T, C]`` after ``state [C, K-1]``, state updated in place.

    ``x`` may be a column slice of a wider matrix (unit stride in the last dim);
    ``weight [C, K]``, optional ``bias [C]``. Returns ``[T, C]`` in ``x``'s dtype,
    or with ``sections=(w0, w1, w2)`` (summing to C) three contiguous
    ``[T, w_i]`` tensors, the column blocks of that result.
    Up to ``_CONV_ONE_LAUNCH_T`` tokens (decode and a short turn included) it
    is one launch; longer inputs update the state with a second, small launch.
    """
    t, c = x.shape
    kernel = weight.shape[-1]
    assert x.stride(1) == 1, "x needs unit stride in the channel dim"
    assert state.is_contiguous() and tuple(state.shape) == (c, kernel - 1), "state must be a contiguous [C, K-1]"
    assert sections is None or (len(sections) == 3 and sum(sections) == c), "sections must be 3 widths summing to C"
    out = torch.empty((t, c), dtype=x.dtype, device=x.device)
    s1, s2 = (sections[0], sections[0] + sections[1]) if sections is not None else (c, c)
    if _CONV_BLOCK_T < t <= _CONV_ONE_LAUNCH_T:
        block_t, block_c = next_power_of_2(t), _CONV_NARROW_C
    else:
        block_t, block_c = min(next_power_of_2(t), _CONV_BLOCK_T), _CONV_BLOCK_C
    block_w = next_power_of_2(kernel - 1)
    time_blocks = triton.cdiv(t, block_t)
    channel_blocks = triton.cdiv(c, block_c)
    _causal_conv_kernel[(channel_blocks, time_blocks)](
        x, x.stride(0), state, weight, weight.stride(0), weight.stride(1), weight if bias is None else bias, out,
        t, c, s1, s2, K=kernel, BLOCK_W=block_w, BLOCK_T=block_t, BLOCK_C=block_c,
        HAS_BIAS=bias is not None, SILU=silu, UPDATE_STATE=time_blocks == 1, SECTIONED=sections is not None,
        num_warps=4 if block_t == 1 else 8)     # 16 x 256 tiles spill at 4 warps (sm_90 compile)
    if time_blocks > 1:     # other programs read the old window: update it after they are done
        _conv_state_kernel[(channel_blocks,)](
            x, x.stride(0), state, t, c, W=kernel - 1, BLOCK_W=block_w, BLOCK_C=_CONV_BLOCK_C, num_warps=4)
    if sections is None:
        return out
    flat = out.view(-1)
    return (flat[:t * s1].view(t, s1), flat[t * s1:t * s2].view(t, s2 - s1), flat[t * s2:].view(t, c - s2))


@triton.jit
def _gdn_gates_kernel(a_ptr, b_ptr, stride_at, stride_bt, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, T, H,
                      BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """``g = -exp(A_log) softplus(a + dt_bias)`` (float32) and ``beta = sigmoid(b)`` for a tile of tokens."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_t < T)[:, None] & (offs_h < H)[None, :]
    rows = offs_t[:, None].to(tl.int64)
    a = tl.load(a_ptr + rows * stride_at + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_bt + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    a = a + tl.load(dt_bias_ptr + offs_h, mask=offs_h < H, other=0.0).to(tl.float32)[None, :]
    a_log = tl.load(a_log_ptr + offs_h, mask=offs_h < H, other=0.0).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))   # torch's threshold 20
    tl.store(g_ptr + rows * H + offs_h[None, :], -tl.exp(a_log)[None, :] * softplus, mask=mask)
    tl.store(beta_ptr + rows * H + offs_h[None, :], tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=mask)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``ops.gated_delta.gdn_gates`` for ``a, b [T, H]`` (row views of a projection are fine).

    One launch instead of about ten torch kernels; returns contiguous ``g``
    (float32) and ``beta`` (``b``'s dtype), as fla's chunk kernel wants them.
    """
    t, heads = a.shape
    assert b.shape == a.shape and a.stride(1) == 1 and b.stride(1) == 1, "a, b need unit stride per head"
    g = torch.empty((t, heads), dtype=torch.float32, device=a.device)
    beta = torch.empty((t, heads), dtype=b.dtype, device=b.device)
    if t:
        block_t = min(64, next_power_of_2(t))
        _gdn_gates_kernel[(triton.cdiv(t, block_t),)](
            a, b, a.stride(0), b.stride(0), A_log, dt_bias, g, beta, t, heads,
            BLOCK_T=block_t, BLOCK_H=next_power_of_2(heads), num_warps=4)
    return g, beta


@triton.jit
def _gated_rms(x, gate, weight, mask, n, eps, PROD_DTYPE: tl.constexpr):
    """``gated_rms_norm`` of one row, in float32 before the final cast (``x`` in the model dtype)."""
    xf = tl.where(mask, x.to(tl.float32), 0.0)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)).to(x.dtype)
    # weight * normed rounds to the promoted dtype (exact in float32 first: 8- or 11-bit mantissas)
    scaled = (weight.to(tl.float32) * normed.to(tl.float32)).to(PROD_DTYPE).to(tl.float32)
    g = gate.to(tl.float32)
    return scaled * (g * tl.sigmoid(g))


@triton.jit
def _gated_rms_rows_kernel(x_ptr, stride_xt, stride_xh, gate_ptr, stride_gt, stride_gh, w_ptr, out_ptr,
                           H, N, eps, BLOCK: tl.constexpr, PROD_DTYPE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + cols, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + t * stride_gt + h * stride_gh + cols, mask=mask, other=0.0)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = _gated_rms(x, gate, weight, mask, N, eps, PROD_DTYPE)
    tl.store(out_ptr + (t * H + h) * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def gated_rms_norm_rows(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton ``gated_rms_norm`` over ``x, gate [T, H, dv]`` (any strides, unit last stride).

    Returns a contiguous ``[T, H, dv]`` in ``x``'s dtype; one program per ``(t, h)`` row.
    """
    t, heads, n = x.shape
    assert gate.shape == x.shape and x.stride(2) == 1 and gate.stride(2) == 1, "rows need unit last stride"
    out = torch.empty((t, heads, n), dtype=x.dtype, device=x.device)
    if t:
        block = next_power_of_2(n)
        _gated_rms_rows_kernel[(t, heads)](
            x, x.stride(0), x.stride(1), gate, gate.stride(0), gate.stride(1), weight, out, heads, n, eps,
            BLOCK=block, PROD_DTYPE=_TL_DTYPES[torch.promote_types(weight.dtype, x.dtype)],
            num_warps=1 if block <= 256 else 4)
    return out


@triton.jit
def _delta_rule_token(s, q, k, v, b, a, a_log, q_scale):
    """One token of the gated delta rule on a ``[BLOCK_K, BLOCK_V]`` float32 state tile.

    ``a`` already includes ``dt_bias`` (float32); ``b`` is in the model dtype.
    Returns ``(new tile, output columns)``; shared by the decode and verify kernels
    so both compute a token identically.
    """
    # gates: g = -exp(A_log) * softplus(a + dt_bias) (torch's threshold 20); beta rounded like b.sigmoid()
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    decay = tl.exp(-tl.exp(a_log) * softplus)
    beta = tl.sigmoid(b.to(tl.float32)).to(b.dtype).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)

    # S' = decay S + k delta^T with delta = beta (v - decay S^T k), and o = S'^T q
    # = decay S^T q + delta (k.q): both contractions read the old tile once.
    delta = (v - decay * tl.sum(s * k[:, None], axis=0)) * beta
    o = decay * tl.sum(s * q[:, None], axis=0) + delta * tl.sum(k * q, axis=0)
    return s * decay + k[:, None] * delta[None, :], o


@triton.jit
def _decode_step_kernel(qkv_ptr, b_ptr, a_ptr, a_log_ptr, dt_bias_ptr, state_ptr, out_ptr, q_scale,
                        GROUPS: tl.constexpr, KEY_DIM: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One (value head, slice of BLOCK_V value columns): gates, delta step, output before the norm."""
    h = tl.program_id(0)
    kh = h // GROUPS                               # each key head serves GROUPS consecutive value heads
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_s = mask_k[:, None] & mask_v[None, :]
    q = tl.load(qkv_ptr + kh * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(qkv_ptr + KEY_DIM + kh * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    v = tl.load(qkv_ptr + 2 * KEY_DIM + h * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    s_ptrs = state_ptr + h * (DK * DV) + offs_k[:, None] * DV + offs_v[None, :]
    s = tl.load(s_ptrs, mask=mask_s, other=0.0)
    b = tl.load(b_ptr + h)
    a = tl.load(a_ptr + h).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32)
    a_log = tl.load(a_log_ptr + h).to(tl.float32)
    s, o = _delta_rule_token(s, q, k, v, b, a, a_log, q_scale)
    tl.store(s_ptrs, s, mask=mask_s)
    tl.store(out_ptr + h * DV + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)


@triton.jit
def _verify_steps_kernel(qkv_ptr, stride_qt, b_ptr, stride_bt, a_ptr, stride_at, a_log_ptr, dt_bias_ptr,
                         state_ptr, states_ptr, out_ptr, T, H, q_scale,
                         GROUPS: tl.constexpr, KEY_DIM: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """The decode program over ``T`` tokens in a row, the state tile kept in registers between them.

    The arena state is only read; the tile after token ``t`` goes to ``states[t]``.
    """
    h = tl.program_id(0)
    kh = h // GROUPS
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_s = mask_k[:, None] & mask_v[None, :]
    tile = offs_k[:, None] * DV + offs_v[None, :]
    s = tl.load(state_ptr + h * (DK * DV) + tile, mask=mask_s, other=0.0)
    a_log = tl.load(a_log_ptr + h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    for t in range(T):
        row = qkv_ptr + t * stride_qt
        q = tl.load(row + kh * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(row + KEY_DIM + kh * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(row + 2 * KEY_DIM + h * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + t * stride_bt + h)
        a = tl.load(a_ptr + t * stride_at + h).to(tl.float32) + dt_bias
        s, o = _delta_rule_token(s, q, k, v, b, a, a_log, q_scale)
        tl.store(states_ptr + (t * H + h).to(tl.int64) * (DK * DV) + tile, s, mask=mask_s)
        tl.store(out_ptr + (t * H + h) * DV + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)


def _decode_config(block_k: int, head_v_dim: int) -> tuple[int, int]:
    """``(BLOCK_V, warps)``: value columns per program, so a head is spread over several programs.

    A ``[dk, 32]`` float32 state slice per 4-warp program stays in registers (a
    whole 128 x 128 tile per program spilled when compiled for sm_90), and
    16 heads become 64 programs instead of 16.
    """
    return min(32, next_power_of_2(head_v_dim)), 4 if block_k <= 128 else 8


def _flat(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1)
    return x if x.stride(0) == 1 else x.contiguous()


def gated_delta_decode_step(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                            A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                            norm_weight: torch.Tensor, eps: float, num_k_heads: int, head_k_dim: int,
                            head_v_dim: int) -> torch.Tensor:
    """One decode token of a Gated DeltaNet layer, from conv output to gated-norm output, in two launches.

    ``qkv [conv_dim]`` is ``[q | k | v]`` after the conv, ``z [Hv*dv]``, ``b, a [Hv]``
    (slices of the in-projection row), ``A_log, dt_bias [Hv]``, ``norm_weight [dv]``;
    ``state [Hv, dk, dv]`` float32 is updated in place. Returns ``[Hv, dv]`` in ``qkv``'s dtype.
    The delta step is spread over (head, value-column slice) programs; the gated
    norm, which needs whole rows, is the second launch.
    """
    num_v_heads = state.shape[0]
    key_dim = num_k_heads * head_k_dim
    assert state.dtype == torch.float32 and state.is_contiguous(), "state must be contiguous float32"
    assert tuple(state.shape) == (num_v_heads, head_k_dim, head_v_dim) and num_v_heads % num_k_heads == 0
    qkv = _flat(qkv)
    assert qkv.numel() == 2 * key_dim + num_v_heads * head_v_dim, "qkv must be [q | k | v] of one token"
    out = torch.empty((1, num_v_heads, head_v_dim), dtype=qkv.dtype, device=qkv.device)
    block_k = next_power_of_2(head_k_dim)
    block_v, warps = _decode_config(block_k, head_v_dim)
    _decode_step_kernel[(num_v_heads, triton.cdiv(head_v_dim, block_v))](
        qkv, _flat(b), _flat(a), A_log, dt_bias, state, out, head_k_dim ** -0.5,
        GROUPS=num_v_heads // num_k_heads, KEY_DIM=key_dim, DK=head_k_dim, DV=head_v_dim,
        BLOCK_K=block_k, BLOCK_V=block_v, num_warps=warps)
    gate = _flat(z).view(1, num_v_heads, head_v_dim)
    return gated_rms_norm_rows(out, gate, norm_weight, eps).view(num_v_heads, head_v_dim)


def gated_delta_verify_steps(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                             A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                             states_out: torch.Tensor, norm_weight: torch.Tensor, eps: float, num_k_heads: int,
                             head_k_dim: int, head_v_dim: int) -> torch.Tensor:
    """Triton ``ops.gated_delta.gated_delta_verify``: ``T`` decode steps in one launch, plus the norm.

    ``qkv [T, conv_dim]``, ``z [T, Hv*dv]``, ``a, b [T, Hv]`` may be row views
    (unit last stride); ``state [Hv, dk, dv]`` float32 is only read;
    ``states_out [>= T, Hv, dk, dv]`` float32 contiguous receives the state after
    each token. Returns ``[T, Hv, dv]`` in ``qkv``'s dtype.
    """
    t = qkv.shape[0]
    num_v_heads = state.shape[0]
    key_dim = num_k_heads * head_k_dim
    assert state.dtype == torch.float32 and state.is_contiguous(), "state must be contiguous float32"
    assert states_out.dtype == torch.float32 and states_out.is_contiguous() and states_out.shape[0] >= t
    assert tuple(states_out.shape[1:]) == tuple(state.shape), "states_out must be [T, *state.shape]"
    assert qkv.shape[1] == 2 * key_dim + num_v_heads * head_v_dim and qkv.stride(1) == 1
    assert a.stride(1) == 1 and b.stride(1) == 1 and z.stride(1) == 1, "rows need unit last stride"
    out = torch.empty((t, num_v_heads, head_v_dim), dtype=qkv.dtype, device=qkv.device)
    block_k = next_power_of_2(head_k_dim)
    block_v, warps = _decode_config(block_k, head_v_dim)
    _verify_steps_kernel[(num_v_heads, triton.cdiv(head_v_dim, block_v))](
        qkv, qkv.stride(0), b, b.stride(0), a, a.stride(0), A_log, dt_bias, state, states_out, out, t,
        num_v_heads, head_k_dim ** -0.5, GROUPS=num_v_heads // num_k_heads, KEY_DIM=key_dim, DK=head_k_dim,
        DV=head_v_dim, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=warps)
    gate = z.reshape(t, num_v_heads, head_v_dim)
    return gated_rms_norm_rows(out, gate, norm_weight, eps)
