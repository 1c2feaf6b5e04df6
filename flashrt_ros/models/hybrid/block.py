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

    Each norm runs with the product after it and each residual add with the
    product before it (``ops.linear.fused_linear``): the mixer and the MLP take
    the residual stream and its norm and return the stream after them, the
    same arithmetic as ``x = x + f(norm(x))``, one launch per product in a
    decode step on CUDA.
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

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, arena: StateArena,
                scratch: VerifyScratch | None = None) -> torch.Tensor:
        """The residual stream after this block."""
        if self.is_attention:
            x = self.mixer(x, self.input_layernorm, positions, inv_freq, arena)
        else:
            x = self.mixer(x, self.input_layernorm, arena, scratch)
        return self.mlp.residual(x, self.post_attention_layernorm)
