"""One pre-norm residual block of the hybrid decoder: a token mixer, then an MLP.

The mixer is Gated DeltaNet or gated full attention, by ``config.layer_types``;
the MTP head's block is full attention over a KV buffer of its own.
"""
from __future__ import annotations

import torch
from torch import nn

from flashrt_ros.models.base import KV_CACHE
from flashrt_ros.models.hybrid.attention import GatedAttention
from flashrt_ros.models.hybrid.config import FULL, HybridConfig
from flashrt_ros.models.hybrid.gated_deltanet import GatedDeltaNet
from flashrt_ros.models.hybrid.mlp import make_mlp
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.models.hybrid.verification import VerifyScratch
from flashrt_ros.runtime.arena import StateArena


class HybridBlock(nn.Module):
    """Pre-norm residual block: token mixer, then MLP.

    The residual stream travels as ``(x, delta)``: each block first adds the
    previous block's output to ``x`` and normalises in one step
    (``ops.add_rms_norm``), the same arithmetic as ``x = x + delta; norm(x)``.
    """

    def __init__(self, cfg: HybridConfig, layer: int, *, kv_buffer: str = KV_CACHE) -> None:
        """``kv_buffer`` other than the shared cache: a full-attention block over slot 0 of that
        buffer whatever ``layer_types`` says (the MTP head's block, whose MLP follows layer 0's rule)."""
        super().__init__()
        own_cache = kv_buffer != KV_CACHE
        self.is_attention = own_cache or cfg.layer_types[layer] == FULL
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        kv_index = 0 if own_cache else sum(t == FULL for t in cfg.layer_types[:layer])   # slot in the cache
        self.mixer: GatedAttention | GatedDeltaNet = (
            GatedAttention(cfg, kv_index, kv_buffer) if self.is_attention else GatedDeltaNet(cfg, layer))
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg, layer)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
                inv_freq: torch.Tensor, arena: StateArena,
                scratch: VerifyScratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = self.input_layernorm.add_and_norm(x, delta)
        if self.is_attention:
            h = self.mixer(h, positions, inv_freq, arena)
        else:
            h = self.mixer(h, arena, scratch)
        x, h = self.post_attention_layernorm.add_and_norm(x, h)
        return x, self.mlp(h)
