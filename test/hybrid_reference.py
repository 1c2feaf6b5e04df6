"""Qwen3-Next's MTP head assembled from transformers' own blocks: the reference the MTP tests compare ours with,
and the module ``tools/train_tiny_hybrid.py`` trains (transformers ships no MTP module; it ignores ``mtp.*``)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextDecoderLayer,
    Qwen3NextRMSNorm,
    Qwen3NextRotaryEmbedding,
)


class ReferenceMTP(nn.Module):
    """The published MTP head from transformers' Qwen3-Next blocks (state-dict names = ``mtp.*`` minus the prefix)."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        layer_config = copy.deepcopy(config)
        layer_config.num_hidden_layers, layer_config.layer_types = 1, ["full_attention"]
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(hidden, eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(layer_config, 0)])
        self.norm = Qwen3NextRMSNorm(hidden, eps)
        self.rotary = Qwen3NextRotaryEmbedding(layer_config)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """``hidden, embeds [1, T, H]`` (rows p = 0..T-1) -> normed ``[1, T, H]``, causal over the rows."""
        x = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        t = x.shape[1]
        positions = torch.arange(t)[None]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=self.rotary(x, positions), attention_mask=mask,
                           position_ids=positions)
        return self.norm(x)
