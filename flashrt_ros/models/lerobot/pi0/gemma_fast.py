"""Gemma decoder layers in the ``fast`` numerics: fused projections, folded norms, fused row kernels, SDPA.

Why a second form of the layer: ``gemma.GemmaLayer`` keeps the reference's
arithmetic to the bit (norms and attention in float32, RoPE in the model dtype,
one kernel per torch op), which is what the CPU parity with LeRobot needs but
costs ~70 kernels per layer. Here a layer is four matrix products, the
attention, and two or three row kernels (``ops.fused_rows``):

- q / k / v are one product and gate / up another (the weights concatenated
  once); a plain RMSNorm's ``1 + w`` is folded into the product's columns and
  the row's ``rsqrt`` applied after it (``folded``); adaRMS (π0.5's expert),
  whose scale depends on the flow step, runs as one fused residual-norm row
  kernel with per-step tables the policy precomputes (``ada``);
- the RoPE of queries and keys and the write of keys and values straight into
  their static buffer rows are one kernel; the output and down products add the
  residual in cuBLAS (``addmm``). An expert's few rows (a chunk) take
  ``ops.rows_matmul`` instead: each product is one kernel with its row work
  (the norm's scale, RoPE and the KV writes, the gated GELU, the residual) fused;
- attention: all query heads share the one key head, so they are folded into
  query rows (row ``l * heads + h``) of a single-head SDPA over the static keys,
  with an additive mask (no copies of keys, no float32 scores; the backend's
  own float32 softmax); ``pi0_fast`` can take ``ops.prefix_attention`` instead.

The weights are built from a loaded ``GemmaLayer`` and replace it (no second
copy stays on the device).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashrt_ros.models.lerobot.pi0.gemma import GemmaLayer, GemmaSizes
from flashrt_ros.ops.fp8 import quantize_weight
from flashrt_ros.ops.fused_rows import residual_norm
from flashrt_ros.ops.rows_matmul import gelu_gate_rows, matmul_rows, qkv_rope_rows


def _fold(weight: Tensor, norm_weight: Tensor) -> Tensor:
    """``W diag(1 + w)``: a plain RMSNorm's scale folded into the linear layer after it (float32, rounded once)."""
    return (weight.float() * (1.0 + norm_weight.float())[None, :]).to(weight.dtype)


#: the products of a layer, by the name of their fused weight
PRODUCTS = ("qkv", "o", "gate_up", "down")


class FastGemmaLayer(nn.Module):
    """One layer's fused weights; ``folded``: the two norms are plain RMSNorms folded into the products;
    ``fp8``: each product's weights in float8 E4M3 with a float32 scale per output row (``<name>_scale``; the norm
    folded in first, so the scale covers it), else ``<name>_scale`` is None."""

    def __init__(self, layer: GemmaLayer, folded: bool, fp8: bool = False) -> None:
        super().__init__()
        s: GemmaSizes = layer.sizes
        self.sizes, self.folded = s, folded
        a, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        if folded:
            qkv = _fold(qkv, layer.input_layernorm.weight)
            gate_up = _fold(gate_up, layer.post_attention_layernorm.weight)
        weights = {"qkv": qkv, "o": a.o_proj.weight.detach(), "gate_up": gate_up, "down": mlp.down_proj.weight.detach()}
        for name in PRODUCTS:
            w, scale = quantize_weight(weights[name]) if fp8 else (weights[name], None)
            setattr(self, name, nn.Parameter(w, requires_grad=False))
            self.register_buffer(f"{name}_scale", scale)

    def project_qkv(self, x: Tensor, h: Tensor | None, cos: Tensor, sin: Tensor, k_dst: Tensor, v_dst: Tensor,
                    valid: Tensor | None = None) -> Tensor:
        """Queries ``(L, heads, D)``; keys and values written to ``k_dst`` / ``v_dst`` (``(L, kv, D)`` rows).
        ``h``: the normalised rows (adaRMS); None for a folded norm (the raw rows ``x`` are scaled)."""
        s = self.sizes
        q = torch.empty(x.shape[0], s.num_heads, s.head_dim, dtype=x.dtype, device=x.device)
        rows, eps = (x, s.rms_norm_eps) if h is None else (h, None)
        qkv_rope_rows(rows, self.qkv, cos, sin, s.num_heads, s.num_kv_heads, q, k_dst, v_dst, norm_eps=eps,
                      valid=valid, scale=self.qkv_scale)
        return q

    def output(self, attn: Tensor, residual: Tensor | None = None) -> Tensor:
        """The attention's output product (``+ residual``)."""
        return matmul_rows(attn, self.o, residual=residual, scale=self.o_scale)

    def gate_up_down(self, h: Tensor) -> Tensor:
        """The MLP on normalised rows ``h`` (adaRMS), without the residual (which is gated)."""
        return matmul_rows(gelu_gate_rows(h, self.gate_up, scale=self.gate_up_scale), self.down,
                           scale=self.down_scale)

    def folded_rest(self, x: Tensor, attn: Tensor) -> Tensor:
        """Output product (+ residual), then the MLP with its folded norm (+ residual)."""
        x = self.output(attn, residual=x)
        gated = gelu_gate_rows(x, self.gate_up, norm_eps=self.sizes.rms_norm_eps, scale=self.gate_up_scale)
        return matmul_rows(gated, self.down, residual=x, scale=self.down_scale)


def single_key_head_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """``q (L, H, D)`` against one key head ``keys, values (S, 1, D)``: the heads as query rows ``l * H + h``
    of one SDPA; ``mask``: additive, ``(1, 1, 1 or L * H, S)`` in ``q``'s dtype. Returns ``(L, H * D)``."""
    L, H, D = q.shape
    S = keys.shape[0]
    with sdpa_kernel(_MASKED_BACKENDS if q.is_cuda else _ANY_BACKEND):
        out = F.scaled_dot_product_attention(q.view(1, 1, L * H, D), keys.view(1, 1, S, D),
                                             values.view(1, 1, S, D), attn_mask=mask)
    return out.view(L, H * D)


#: a masked attention on CUDA: the memory-efficient kernel (masks, head dim 256, capturable), else the math one
_MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_ANY_BACKEND = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where ``allowed``, ``-inf`` elsewhere, as ``(1, 1, rows, S)``."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, float("-inf")).to(dtype)[None, None]


def adarms_tables(norm: nn.Module, cond: Tensor) -> Tensor:
    """``(steps, 3, W)`` float32: an adaRMS norm's ``(scale, shift, gate)`` for each step's condition."""
    return torch.stack(norm.dense(cond.to(norm.dense.weight.dtype)).float().chunk(3, dim=-1), dim=1)


def ada_residual_norm(x: Tensor, update: Tensor | None, gate: Tensor | None, table: Tensor,
                      eps: float) -> tuple[Tensor, Tensor]:
    """The residual step and adaRMS with one step's ``(scale, shift, gate)`` table row ``(3, W)``."""
    return residual_norm(x, update, gate, table[0], table[1], eps)
