"""Feed-forward blocks: dense SwiGLU and Qwen3-Next's sparse mixture of experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.ops.gating import silu_mul
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops.linear import Linear, fused_linear


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matrix."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w13 = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.w2 = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu_mul(self.w13(x)))

    def residual(self, x: torch.Tensor, norm: OffsetRMSNorm) -> torch.Tensor:
        """``x + forward(norm(x))``: the norm with the gate / up product and the add with the down one
        (``ops.linear.fused_linear``: two launches for one row on CUDA)."""
        gated = fused_linear(x, self.w13.weight, norm="offset", norm_weight=norm.weight, eps=norm.eps,
                             epilogue="silu_gate")
        return fused_linear(gated, self.w2.weight, epilogue="residual", residual=x)


class SparseMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert.

    Why every expert is computed: routing by gathering tokens per expert needs
    data-dependent shapes (``nonzero``), which a CUDA graph cannot capture. This
    reference path runs all experts on all tokens and weights them with a dense
    ``[T, experts]`` routing matrix that is zero off the top-k: exact, fixed
    shapes, but ``num_experts`` times the FLOPs, so fine for tests and small
    expert counts only.
    """

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.inter = cfg.moe_intermediate_size
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.gate_up = nn.Parameter(torch.zeros(cfg.num_experts, 2 * self.inter, cfg.hidden_size))
        self.down = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size, self.inter))
        self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float32)
        top_p, top_i = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        routing = torch.zeros_like(probs).scatter_(1, top_i, top_p).to(x.dtype)   # [T, E]
        gate, up = torch.einsum("th,eih->tei", x, self.gate_up).split([self.inter, self.inter], dim=-1)
        experts = torch.einsum("tei,ehi->teh", F.silu(gate) * up, self.down)        # [T, E, H]
        routed = (experts * routing[..., None]).sum(dim=1)
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def residual(self, x: torch.Tensor, norm: OffsetRMSNorm) -> torch.Tensor:
        """``x + forward(norm(x))``."""
        return x + self(norm.add_and_norm(x, None)[1])


def make_mlp(cfg: HybridConfig, layer: int) -> nn.Module:
    if cfg.is_moe_layer(layer):
        return SparseMoE(cfg)
    return SwiGLU(cfg.hidden_size, cfg.intermediate_size)
