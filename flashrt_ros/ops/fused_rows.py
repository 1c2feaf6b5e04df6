"""Row-wise fusions for the transformer stacks of the VLA policies' ``fast`` numerics.

Why: a decoder layer written as torch ops is a norm (six kernels in float32), the
projections, a RoPE per tensor (a cat and four products each), the KV copies,
the attention and a gated MLP (three more); at a VLA's sizes those small kernels
cost more than the matrix products. Here each row operation is one function
whose CUDA path is one triton kernel (``flashrt_ros.ops.triton.fused_rows``),
and the torch expression beside it is the reference (CPU, and what the kernels
are tested against under ``TRITON_INTERPRET=1``).

Two norm placements, chosen by the caller:
- *folded* (a plain RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` before a
  linear layer, Gemma's; Llama's multiplies by ``w``): the scale is folded into
  the linear's columns once, the product runs on the raw residual row, and the
  row's ``rsqrt`` scales the product afterwards (the ``x`` argument of
  ``qkv_rope`` and the gates): the norm costs no kernel of its own;
- *explicit* (adaRMS, whose scale changes with the flow step): ``residual_norm``
  adds the (gated) update to the residual stream and normalises it in one pass
  (Llama's plain RMSNorm with its residual: ``ops.norms.add_rms_norm``).

Every function takes and returns the model dtype; arithmetic is float32 inside
and each result is rounded once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.triton import use_triton


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``rsqrt(mean(x^2) + eps)`` per row of ``x (L, W)`` in float32, shape ``(L, 1)``."""
    xf = x.float()
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin ``(L, D / 2)`` in float32 for rotate-half RoPE at ``positions`` (``radians = p * inv_freq``)."""
    radians = positions.float()[:, None] * inv_freq.float()[None, :]
    return radians.cos(), radians.sin()


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    t1, t2 = t[..., :half], t[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1)


def qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
             q_out: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor, *, x: torch.Tensor | None = None,
             eps: float = 0.0, valid: torch.Tensor | None = None) -> None:
    """Split a fused ``qkv (L, (heads + 2 kv_heads) * D)`` product, RoPE the queries and keys, write all three.

    ``x``: the raw residual rows the product was taken from (folded norm): every row is first scaled by
    their ``rsqrt(mean(x^2) + eps)``. ``q_out (L, heads, D)``, ``k_out`` / ``v_out (L, kv_heads, D)`` may be
    views (a static KV buffer's rows; inner dims contiguous). ``valid`` (0-d device tensor): rows from that
    index on get zero keys and values (a prefix's padding)."""
    if use_triton(qkv):
        from flashrt_ros.ops.triton.fused_rows import qkv_rope as fused
        fused(qkv, cos, sin, heads, kv_heads, q_out, k_out, v_out, x, eps, valid)
        return
    L = qkv.shape[0]
    D = q_out.shape[-1]
    t = qkv.float()
    if x is not None:
        t = t * rms_scale(x, eps)
    q = _rotate(t[:, :heads * D].view(L, heads, D), cos, sin)
    k = _rotate(t[:, heads * D:(heads + kv_heads) * D].view(L, kv_heads, D), cos, sin)
    v = t[:, (heads + kv_heads) * D:].reshape(L, kv_heads, D)
    if valid is not None:
        keep = (torch.arange(L, device=qkv.device) < valid)[:, None, None]
        k, v = torch.where(keep, k, 0.0), torch.where(keep, v, 0.0)
    q_out.copy_(q)
    k_out.copy_(k)
    v_out.copy_(v)


def gelu_gate(gate_up: torch.Tensor, *, x: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` for ``gate_up = [gate | up] (L, 2F)`` -> ``(L, F)``; ``x``: folded norm's rows."""
    return _gate(gate_up, x, eps, silu=False)


def silu_gate(gate_up: torch.Tensor, *, x: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """``silu(gate) * up`` (Llama's MLP) for ``gate_up = [gate | up] (L, 2F)`` -> ``(L, F)``; ``x`` as ``gelu_gate``."""
    return _gate(gate_up, x, eps, silu=True)


def _gate(gate_up: torch.Tensor, x: torch.Tensor | None, eps: float, silu: bool) -> torch.Tensor:
    if use_triton(gate_up):
        from flashrt_ros.ops.triton.fused_rows import gated_activation as fused
        return fused(gate_up, x, eps, silu)
    t = gate_up.float()
    if x is not None:
        t = t * rms_scale(x, eps)
    g, u = t.chunk(2, dim=-1)
    act = F.silu(g) if silu else F.gelu(g, approximate="tanh")
    return (act * u).to(gate_up.dtype)


def residual_norm(x: torch.Tensor, update: torch.Tensor | None, gate: torch.Tensor | None, scale: torch.Tensor,
                  shift: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms(s) * (1 + scale) + shift)`` with ``s = x + gate * update`` (``x + update`` without a gate,
    ``x`` without an update): a residual step and the RMSNorm / adaRMS after it. ``gate``, ``scale``,
    ``shift`` are ``(W,)`` vectors (float32 or the model dtype); ``s`` is rounded to ``x``'s dtype first."""
    if use_triton(x):
        from flashrt_ros.ops.triton.fused_rows import residual_norm as fused
        return fused(x, update, gate, scale, shift, eps)
    s = x
    if update is not None:
        u = update.float() if gate is None else update.float() * gate.float()
        s = (x.float() + u).to(x.dtype)
    h = s.float() * rms_scale(s, eps) * (1.0 + scale.float())
    if shift is not None:
        h = h + shift.float()
    return s, h.to(x.dtype)


def residual_layer_norm(x: torch.Tensor, update: torch.Tensor | None, bias: torch.Tensor | None,
                        weight: torch.Tensor, ln_bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, layer_norm(s))`` with ``s = x + update + bias`` (``x`` without an update): a SigLIP residual
    step with the output projection's bias, and the LayerNorm that follows it."""
    if use_triton(x):
        from flashrt_ros.ops.triton.fused_rows import residual_layer_norm as fused
        return fused(x, update, bias, weight, ln_bias, eps)
    s = x
    if update is not None:
        u = update.float() if bias is None else update.float() + bias.float()
        s = (x.float() + u).to(x.dtype)
    h = F.layer_norm(s.float(), (s.shape[-1],), weight.float(), ln_bias.float(), eps)
    return s, h.to(x.dtype)
