"""Gemma decoder layers as π0 / π0.5 use them (PaliGemma's language model and the action expert), pure torch.

Why our own: LeRobot builds them from openpi's patched transformers
(``GemmaModel`` with adaRMS norms and gated residuals) and keeps the prefix KV
in a ``DynamicCache``; we need fixed shapes and the KV in arena buffers. Module
and parameter names are transformers' (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm.weight`` or ``.dense``), so LeRobot's ``model.safetensors``
loads strictly. The attention itself runs outside the layer (``qkv`` then
``finish``): the prefix writes its keys to the arena, the expert reads them.

Arithmetic as in the reference: RMSNorm in float32 scaled by ``1 + weight``;
adaRMS (π0.5's expert): ``normed * (1 + scale) + shift`` with ``(scale, shift,
gate) = dense(cond)`` and residual ``x + gate * y``; tanh-GELU gated MLP;
rotate-half RoPE with base 10 000; attention scores and softmax in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.ops.norms import offset_rms_norm
from flashrt_ros.ops.rope import apply_partial_rope, rope_cos_sin, rope_inv_freq


@dataclass(frozen=True)
class GemmaSizes:
    """One Gemma stack (openpi's ``gemma.Config`` plus the vocabulary)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    vocab_size: int = 257152
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


#: the variants LeRobot's ``get_gemma_config`` knows (``paligemma_variant`` / ``action_expert_variant``)
GEMMA_VARIANTS = {"gemma_2b": GemmaSizes(width=2048, depth=18, mlp_dim=16384),
                  "gemma_300m": GemmaSizes(width=1024, depth=18, mlp_dim=4096)}


class GemmaRMSNorm(nn.Module):
    """``forward(x, cond) -> (normed, gate)``: plain (``weight``, gate None) or adaRMS (``dense``)."""

    def __init__(self, dim: int, eps: float, cond_dim: int | None = None) -> None:
        super().__init__()
        self.eps = eps
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if self.dense is None:
            return offset_rms_norm(x, self.weight, self.eps), None
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond).chunk(3, dim=-1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def gated_add(residual: Tensor, update: Tensor, gate: Tensor | None) -> Tensor:
    return residual + update if gate is None else residual + update * gate


class GemmaAttention(nn.Module):
    def __init__(self, width: int, s: GemmaSizes) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, s.num_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(width, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(width, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, width, bias=False)


class GemmaMLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaLayer(nn.Module):
    """One decoder layer; ``cond_dim`` makes both norms adaRMS (π0.5's expert)."""

    def __init__(self, s: GemmaSizes, cond_dim: int | None = None) -> None:
        super().__init__()
        self.sizes = s
        self.self_attn = GemmaAttention(s.width, s)
        self.mlp = GemmaMLP(s.width, s.mlp_dim)
        self.input_layernorm = GemmaRMSNorm(s.width, s.rms_norm_eps, cond_dim)
        self.post_attention_layernorm = GemmaRMSNorm(s.width, s.rms_norm_eps, cond_dim)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor, cond: Tensor | None = None
            ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries and keys (RoPE'd) ``(L, heads, head_dim)``, values, and the attention gate."""
        s, a = self.sizes, self.self_attn
        h, gate = self.input_layernorm(x, cond)
        q = apply_partial_rope(a.q_proj(h).view(-1, s.num_heads, s.head_dim), cos, sin)
        k = apply_partial_rope(a.k_proj(h).view(-1, s.num_kv_heads, s.head_dim), cos, sin)
        return q, k, a.v_proj(h).view(-1, s.num_kv_heads, s.head_dim), gate

    def finish(self, x: Tensor, attn: Tensor, gate: Tensor | None, cond: Tensor | None = None) -> Tensor:
        """Output projection and gated residual, then the MLP block."""
        x = gated_add(x, self.self_attn.o_proj(attn.to(x.dtype)), gate)
        h, gate = self.post_attention_layernorm(x, cond)
        return gated_add(x, self.mlp(h), gate)


class GemmaStack(nn.Module):
    """``layers`` and the final ``norm`` (and ``embed_tokens`` for the language model)."""

    def __init__(self, s: GemmaSizes, *, embed: bool, cond_dim: int | None = None) -> None:
        super().__init__()
        if embed:
            self.embed_tokens = nn.Embedding(s.vocab_size, s.width)
        self.layers = nn.ModuleList(GemmaLayer(s, cond_dim) for _ in range(s.depth))
        self.norm = GemmaRMSNorm(s.width, s.rms_norm_eps, cond_dim)
        self.register_buffer("inv_freq", rope_inv_freq(s.head_dim, s.rope_theta), persistent=False)

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin for ``positions`` (float32 arithmetic, like transformers' rotary embedding)."""
        return rope_cos_sin(positions, self.inv_freq, dtype)


def gqa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention with float32 scores: ``q (L, H, D)``, ``k, v (S, Hkv, D)``, boolean
    ``mask (L, S)`` -> ``(L, H * D)``. The query heads sharing a key head are folded into its rows
    (one matmul per key head, no copies of the keys). Every query row must see at least one key."""
    L, H, D = q.shape
    kv_heads = k.shape[1]
    group = H // kv_heads
    qf = q.to(torch.float32).permute(1, 0, 2).reshape(kv_heads, group * L, D)
    scores = torch.matmul(qf, k.to(torch.float32).permute(1, 2, 0)) * D ** -0.5
    scores = scores.masked_fill(~mask.repeat(group, 1)[None], torch.finfo(torch.float32).min)
    probs = F.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.permute(1, 0, 2))                      # (kv_heads, group * L, D)
    return out.reshape(kv_heads, group, L, D).permute(2, 0, 1, 3).reshape(L, H * D)
