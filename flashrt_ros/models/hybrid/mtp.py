"""Qwen3-Next's multi-token-prediction (MTP) head: the drafter of speculative decoding.

The published architecture (the ``mtp.*`` tensors of the released checkpoints;
vLLM's ``qwen3_next_mtp``): the embedding of token ``t+1`` and the main model's
final (normed) hidden state at position ``t`` are each RMS-normed
(``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``), concatenated in that order
and fused back to the hidden width by ``fc``; one full-attention decoder layer
(``layers.0``) at position ``t`` and a final norm follow, and the main model's
``lm_head`` turns the result into logits for token ``t+2``. For a second draft
the head is applied again, its own output standing in for the hidden state.

Its state is ordinary arena state, so capsules hold it: the layer's KV cache
(``mtp.kv_cache``, its own buffer, live up to the position like the main KV) and
``mtp.hidden``, the main model's hidden state at the last consumed position,
whose MTP row can only be computed once the next token is known.
"""
from __future__ import annotations

import torch
from torch import nn

from flashrt_ros.models.base import kv_cache_spec
from flashrt_ros.models.hybrid.block import HybridBlock
from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops.linear import Linear
from flashrt_ros.runtime.arena import BufferSpec, StateArena

MTP_KV = "mtp.kv_cache"
MTP_HIDDEN = "mtp.hidden"
MTP_GROUP = "mtp"


class MultiTokenPredictor(nn.Module):
    """The ``mtp.*`` module: pre-fc norms, ``fc``, one full-attention block, final norm (head shared)."""

    hidden_buffer = MTP_HIDDEN        # its arena buffers, by name (drafters read them from here)
    kv_buffer = MTP_KV

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.pre_fc_norm_embedding = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([HybridBlock(cfg, 0, kv_buffer=MTP_KV)])
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def state_specs(self, rows: int, dtype: torch.dtype) -> list[BufferSpec]:
        """``mtp.hidden`` and ``mtp.kv_cache`` with ``rows`` rows (the engine adds room for draft rows
        past ``max_context``); the cache is live up to the position, append-only, like the main one."""
        cfg = self.config
        return [
            BufferSpec(MTP_HIDDEN, (cfg.hidden_size,), dtype, group=MTP_GROUP,
                       doc="main model's final hidden state at the last consumed position"),
            kv_cache_spec(rows, 1, cfg.num_key_value_heads, cfg.head_dim, dtype, name=MTP_KV, group=MTP_GROUP),
        ]

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                inv_freq: torch.Tensor, arena: StateArena) -> torch.Tensor:
        """Rows ``(hidden [T, H] at position p, embedding of token p+1 [T, H])`` at ``positions [T]``
        (consecutive) -> the head's normed output ``[T, H]``; writes its KV rows at ``positions``."""
        x = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        for layer in self.layers:
            x = layer(x, positions, inv_freq, arena)
        return self.norm.add_and_norm(x, None)[1]
