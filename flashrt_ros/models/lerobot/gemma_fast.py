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
  residual in cuBLAS (``addmm_`` into the residual rows, which the layer owns);
- attention (``ops.prefix_attention``): all query heads share the one key head
  and are folded into the rows of one kernel whose mask is arithmetic on the key
  index (the prefix's valid rows, π0's state-token rule), float32 accumulation.

The weights are built from a loaded ``GemmaLayer`` and replace it (no second
copy stays on the device).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from flashrt_ros.models.lerobot.gemma import GemmaLayer, GemmaSizes
from flashrt_ros.ops.fused_rows import gelu_gate, qkv_rope, residual_norm


def _fold(weight: Tensor, norm_weight: Tensor) -> Tensor:
    """``W diag(1 + w)``: a plain RMSNorm's scale folded into the linear layer after it (float32, rounded once)."""
    return (weight.float() * (1.0 + norm_weight.float())[None, :]).to(weight.dtype)


class FastGemmaLayer(nn.Module):
    """One layer's fused weights; ``folded``: the two norms are plain RMSNorms folded into the products."""

    def __init__(self, layer: GemmaLayer, folded: bool) -> None:
        super().__init__()
        s: GemmaSizes = layer.sizes
        self.sizes, self.folded = s, folded
        a, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        if folded:
            qkv = _fold(qkv, layer.input_layernorm.weight)
            gate_up = _fold(gate_up, layer.post_attention_layernorm.weight)
        self.qkv = nn.Parameter(qkv, requires_grad=False)
        self.o = nn.Parameter(a.o_proj.weight.detach(), requires_grad=False)
        self.gate_up = nn.Parameter(gate_up, requires_grad=False)
        self.down = nn.Parameter(mlp.down_proj.weight.detach(), requires_grad=False)

    def project_qkv(self, x: Tensor, h: Tensor | None, cos: Tensor, sin: Tensor, k_dst: Tensor, v_dst: Tensor,
                    valid: Tensor | None = None) -> Tensor:
        """Queries ``(L, heads, D)``; keys and values written to ``k_dst`` / ``v_dst`` (``(L, kv, D)`` rows).
        ``h``: the normalised rows (adaRMS); None for a folded norm (the raw rows ``x`` are scaled)."""
        s = self.sizes
        q = torch.empty(x.shape[0], s.num_heads, s.head_dim, dtype=x.dtype, device=x.device)
        if h is None:
            qkv_rope(x @ self.qkv.t(), cos, sin, s.num_heads, s.num_kv_heads, q, k_dst, v_dst, x=x,
                     eps=s.rms_norm_eps, valid=valid)
        else:
            qkv_rope(h @ self.qkv.t(), cos, sin, s.num_heads, s.num_kv_heads, q, k_dst, v_dst, valid=valid)
        return q

    def gate_up_down(self, h: Tensor) -> Tensor:
        """The MLP on normalised rows ``h`` (adaRMS), without the residual (which is gated)."""
        return gelu_gate(h @ self.gate_up.t()) @ self.down.t()

    def folded_rest(self, x: Tensor, attn: Tensor) -> Tensor:
        """Output product (+ residual), then the MLP with its folded norm (+ residual)."""
        x = x.addmm_(attn, self.o.t())           # in place: no copy of the residual before cuBLAS
        return x.addmm_(gelu_gate(x @ self.gate_up.t(), x=x, eps=self.sizes.rms_norm_eps), self.down.t())


def adarms_tables(norm: nn.Module, cond: Tensor) -> Tensor:
    """``(steps, 3, W)`` float32: an adaRMS norm's ``(scale, shift, gate)`` for each step's condition."""
    return torch.stack(norm.dense(cond.to(norm.dense.weight.dtype)).float().chunk(3, dim=-1), dim=1)


def ada_residual_norm(x: Tensor, update: Tensor | None, gate: Tensor | None, table: Tensor,
                      eps: float) -> tuple[Tensor, Tensor]:
    """The residual step and adaRMS with one step's ``(scale, shift, gate)`` table row ``(3, W)``."""
    return residual_norm(x, update, gate, table[0], table[1], eps)
