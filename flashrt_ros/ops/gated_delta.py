"""The gated delta rule: chunked (prefill) and recurrent (decode) forms.

Per value head, with state ``S [dk, dv]``, decay ``a_t = exp(g_t)`` and rate ``beta_t``::

    S_t = a_t S_{t-1} + k_t (beta_t (v_t - a_t S_{t-1}^T k_t))^T,    o_t = S_t^T q_t / sqrt(dk)

The chunked form turns each chunk of ``C`` tokens into a unit-lower-triangular
solve plus a few matmuls (the WY / UT idea of DeltaNet): with ``G`` the in-chunk
cumulative log-decay, ``A[t, s] = beta_t exp(G_t - G_s) k_t.k_s`` for ``s < t``,
the corrected values are ``U = (I + A)^-1 (beta V) - (I + A)^-1 (beta e^G K) S0``.
Both forms take the state as an argument and return the new one; the caller
copies it into the arena (the ops never own state). Everything runs in float32.

On CUDA with flash-linear-attention importable, fla's chunk kernel runs the
prefill form (fla takes chunk sizes 16, 32 or 64; any other size runs fla at
64), in the model dtype with float32 decay and state as transformers feeds it.
A decode token of a whole Gated DeltaNet layer (gates, delta step and the gated
norm) is two triton kernels on CUDA (``gated_delta_decode``); the torch code is
the reference everywhere.

Grouped values: ``q, k`` may have fewer heads than ``v`` (each key head serves
``Hv / Hk`` consecutive value heads), as in Qwen3-Next.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from flashrt_ros.ops.norms import gated_rms_norm, l2_normalize
from flashrt_ros.ops.triton import use_triton


@functools.cache
def fla_available() -> bool:
    """Whether fla's gated delta rule kernels can be imported (never on a CPU-only machine)."""
    try:
        from fla.ops.gated_delta_rule import (  # noqa: F401
            chunk_gated_delta_rule as _chunk,
            fused_recurrent_gated_delta_rule as _recurrent,
        )
    except Exception:  # ImportError, or triton failing to initialise without a GPU
        return False
    return True


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's gates: log-decay ``g = -exp(A_log) softplus(a + dt_bias)`` (float32), ``beta = sigmoid(b)``.

    On CUDA with triton one kernel for ``[T, H]`` inputs (contiguous outputs).
    """
    if use_triton(a) and a.dim() == 2:
        from flashrt_ros.ops.triton.gated_deltanet import gdn_gates as fused
        return fused(a, b, A_log, dt_bias)
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def _per_value_head(x: torch.Tensor, value_heads: int) -> torch.Tensor:
    """Repeat key heads ``[T, Hk, d]`` so each of the ``value_heads`` has its own (grouped values)."""
    groups = value_heads // x.shape[1]
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor, use_qk_l2norm: bool) -> tuple[torch.Tensor, ...]:
    """float32, heads first ``[H, T, d]``, q/k optionally l2-normed, q scaled by ``dk^-1/2``."""
    q, k = _per_value_head(q, v.shape[1]), _per_value_head(k, v.shape[1])
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))
    g, beta = (x.float().transpose(0, 1) for x in (g, beta))            # [H, T]
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q * (q.shape[-1] ** -0.5), k, v, g, beta


def torch_chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                                 chunk_size: int = 64, use_qk_l2norm: bool = True,
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule over ``T`` tokens, starting from ``state``.

    Shapes: ``q, k [T, Hk, dk]`` (``Hk`` divides ``H``), ``v [T, H, dv]``,
    ``g, beta [T, H]``, ``state [H, dk, dv]``. Returns ``(out [T, H, dv] float32,
    new_state [H, dk, dv] float32)``. ``T`` need not be a multiple of
    ``chunk_size``: the tail is padded with ``beta = 0, g = 0`` rows, which leave
    the state untouched.
    """
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    heads, t, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (c - t % c) % c
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // c
    q, k, v = (x.reshape(heads, n, c, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(heads, n, c), beta.reshape(heads, n, c)

    gcum = g.cumsum(-1)                                                  # [H, N, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    log_decay = (gcum[..., :, None] - gcum[..., None, :]).masked_fill(~causal, float("-inf"))
    decay = log_decay.exp()                                              # exp(G_t - G_s), s <= t
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay                      # strictly-lower part is A
    rhs = torch.cat((v * beta[..., None], k_beta * gcum.exp()[..., None]), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u0, w = solved.split((dv, dk), dim=-1)                               # U = u0 - w @ S0
    qk = (q @ k.transpose(-1, -2)) * decay                               # inclusive causal
    q_decayed = q * gcum.exp()[..., None]
    k_to_end = k * (gcum[..., -1:] - gcum).exp()[..., None]
    chunk_decay = gcum[..., -1].exp()[..., None, None]                   # [H, N, 1, 1]

    s = state.float()
    outs = []
    for i in range(n):
        u = u0[:, i] - w[:, i] @ s
        outs.append(q_decayed[:, i] @ s + qk[:, i] @ u)
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ u
    out = torch.stack(outs, dim=1).reshape(heads, n * c, dv)[:, :t]
    return out.transpose(0, 1), s


def torch_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                                     use_qk_l2norm: bool = True, states_out: torch.Tensor | None = None,
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule (same shapes and returns as the chunked form).

    ``states_out [>= T, H, dk, dv]``: if given, the state after each token ``i``
    is also written to ``states_out[i]`` (speculative verification keeps them to
    roll back to any accepted prefix).
    """
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    s = state.float()
    outs = []
    for i in range(k.shape[1]):
        s = s * g[:, i].exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", s, k[:, i])
        delta = (v[:, i] - predicted) * beta[:, i, None]
        s = s + k[:, i, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[:, i]))
        if states_out is not None:
            states_out[i].copy_(s)
    return torch.stack(outs, dim=0), s


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, state: torch.Tensor, chunk_size: int = 64,
                           use_qk_l2norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill path: fla's chunk kernel on CUDA when available, else the torch reference.

    fla gets ``q, k, v, beta`` in their (model) dtype and float32 ``g`` and
    state, as transformers calls it; its output is in the model dtype, the
    new state float32. The torch reference computes everything in float32.
    """
    if q.is_cuda and fla_available():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        fla_chunk_size = chunk_size if chunk_size in (16, 32, 64) else 64
        out, new_state = fla_chunk(q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0),
                                   g=g.float().unsqueeze(0), beta=beta.to(q.dtype).unsqueeze(0),
                                   initial_state=state.float().unsqueeze(0), output_final_state=True,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm, chunk_size=fla_chunk_size)
        return out.squeeze(0), new_state.squeeze(0).float()
    return torch_chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size, use_qk_l2norm)


def recurrent_gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor,
                               use_qk_l2norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode path: fla's fused recurrent kernel on CUDA when available, else the torch reference."""
    if q.is_cuda and fla_available():
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent
        return _call_fla(fla_recurrent, q, k, v, g, beta, state, use_qk_l2norm)
    return torch_recurrent_gated_delta_rule(q, k, v, g, beta, state, use_qk_l2norm)


def _call_fla(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              beta: torch.Tensor, state: torch.Tensor,
              use_qk_l2norm: bool, **options: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run fla's recurrent kernel at batch 1 with every input in float32.

    Why one dtype: mixed dtypes (float32 g with bfloat16 beta) gave NaN in the
    recurrent kernel in a probe; float32 everywhere is what the reference
    computes anyway, and the state stays float32 as fla returns it.
    """
    q, k = _per_value_head(q, v.shape[1]), _per_value_head(k, v.shape[1])
    q, k, v, g, beta = (x.float().unsqueeze(0).contiguous() for x in (q, k, v, g, beta))
    out, new_state = kernel(q=q, k=k, v=v, g=g, beta=beta, initial_state=state.float().unsqueeze(0),
                            output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, **options)
    return out.squeeze(0).float(), new_state.squeeze(0).float()


def gated_delta_decode(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                       A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                       norm_weight: torch.Tensor, eps: float, num_k_heads: int, head_k_dim: int,
                       head_v_dim: int) -> torch.Tensor:
    """One decode token of a Gated DeltaNet layer after its conv: gates, delta step, gated norm.

    ``qkv [2*Hk*dk + Hv*dv]`` (conv output), ``z [Hv*dv]``, ``a, b [Hv]``;
    ``state [Hv, dk, dv]`` float32 is updated in place. Returns ``[Hv, dv]`` in
    the model dtype. On CUDA with triton this is two kernels (the delta step, then the norm).
    """
    if use_triton(qkv):
        from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step
        return gated_delta_decode_step(qkv, z, b, a, A_log, dt_bias, state, norm_weight, eps,
                                       num_k_heads, head_k_dim, head_v_dim)
    value_heads = state.shape[0]
    key_dim = num_k_heads * head_k_dim
    q, k, v = qkv.split([key_dim, key_dim, value_heads * head_v_dim])
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    out, new_state = recurrent_gated_delta_step(
        q.view(1, num_k_heads, head_k_dim), k.view(1, num_k_heads, head_k_dim),
        v.view(1, value_heads, head_v_dim), g.view(1, value_heads), beta.view(1, value_heads), state)
    state.copy_(new_state)
    return gated_rms_norm(out[0].to(qkv.dtype), z.view(value_heads, head_v_dim), norm_weight, eps)


def gated_delta_verify(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                       A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                       states_out: torch.Tensor, norm_weight: torch.Tensor, eps: float, num_k_heads: int,
                       head_k_dim: int, head_v_dim: int) -> torch.Tensor:
    """``T`` tokens of a Gated DeltaNet layer after its conv, one recurrent step each, keeping every state.

    Why not the chunked prefill form: speculative verification must be able to
    roll the layer back to the state after any accepted prefix, so the state
    after each token ``i`` is written to ``states_out[i]`` (``[>= T, Hv, dk, dv]``
    float32) and ``state`` itself is only read; the caller copies the state of
    the accepted prefix back (``HybridCausalLM.keep_verified``). Per token this
    is the decode step's arithmetic (``gated_delta_decode``). ``qkv [T, conv_dim]``,
    ``z [T, Hv*dv]``, ``a, b [T, Hv]``; returns ``[T, Hv, dv]`` in ``qkv``'s dtype.
    On CUDA with triton this is two kernels for all ``T`` tokens.
    """
    if use_triton(qkv):
        from flashrt_ros.ops.triton.gated_deltanet import gated_delta_verify_steps
        return gated_delta_verify_steps(qkv, z, b, a, A_log, dt_bias, state, states_out, norm_weight, eps,
                                        num_k_heads, head_k_dim, head_v_dim)
    t, value_heads = qkv.shape[0], state.shape[0]
    key_dim = num_k_heads * head_k_dim
    q, k, v = qkv.split([key_dim, key_dim, value_heads * head_v_dim], dim=-1)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    out, _ = torch_recurrent_gated_delta_rule(
        q.reshape(t, num_k_heads, head_k_dim), k.reshape(t, num_k_heads, head_k_dim),
        v.reshape(t, value_heads, head_v_dim), g, beta, state, states_out=states_out)
    return gated_rms_norm(out.to(qkv.dtype), z.reshape(t, value_heads, head_v_dim), norm_weight, eps)
