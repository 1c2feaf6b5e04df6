"""The hybrid decoder: Qwen3-Next layout over the arena contract.

Layers follow ``config.layer_types``: Gated DeltaNet (state: recurrent matrix +
conv window) or gated full attention (state: static KV rows). The model never
keeps state in attributes and never reads ``meta.position``: the engine passes
``positions`` and advances the position itself.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flashrt_ros.models.base import CausalLM
from flashrt_ros.models.hybrid.attention import GatedAttention
from flashrt_ros.models.hybrid.config import FULL, HybridConfig
from flashrt_ros.models.hybrid.gated_deltanet import GatedDeltaNet
from flashrt_ros.models.hybrid.mlp import make_mlp
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops import rope_cos_sin, rope_inv_freq
from flashrt_ros.runtime.arena import POSITION, BufferSpec, StateArena


class HybridBlock(nn.Module):
    """Pre-norm residual block: token mixer, then MLP."""

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.is_attention = cfg.layer_types[layer] == FULL
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer: GatedAttention | GatedDeltaNet = (
            GatedAttention(cfg, layer) if self.is_attention else GatedDeltaNet(cfg, layer))
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg, layer)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, arena: StateArena) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_attention:
            h = self.mixer(h, positions, cos, sin, arena)
        else:
            h = self.mixer(h, arena)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridCausalLM(CausalLM):
    """A Qwen3-Next-style hybrid decoder implementing the CausalLM arena contract.

    The recurrent state is declared float32 whatever the weight dtype: it sums
    the whole history, the kernels accumulate it in float32 anyway, and a bf16
    state would drift from a cold prefill. KV and conv state use the weight dtype.
    """

    recurrent_dtype = torch.float32

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rotary_dim, cfg.rope_theta), persistent=False)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        """Keep the RoPE frequencies float32 through ``.to(bfloat16)`` (they are constants, not state)."""
        super()._apply(fn, recurse)
        self.inv_freq = rope_inv_freq(self.config.rotary_dim, self.config.rope_theta).to(
            self.embed_tokens.weight.device)
        return self

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def state_specs(self, max_context: int) -> list[BufferSpec]:
        cfg, dtype = self.config, self.state_dtype
        specs: list[BufferSpec] = []
        for i, block in enumerate(self.layers):
            if block.is_attention:
                for part in ("k", "v"):
                    specs.append(BufferSpec(
                        f"layers.{i}.kv.{part}", (max_context, cfg.num_key_value_heads, cfg.head_dim), dtype,
                        group="kv", live_axis=0, length_from=POSITION, append_only=True,
                        doc=f"attention {part.upper()} cache of layer {i}"))
            else:
                specs.append(BufferSpec(
                    f"layers.{i}.gdn.recurrent",
                    (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                    self.recurrent_dtype, group="recurrent", doc=f"delta-rule state of layer {i}"))
                specs.append(BufferSpec(
                    f"layers.{i}.gdn.conv", (cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), dtype,
                    group="conv", doc=f"last conv inputs of layer {i}"))
        return specs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                arena: StateArena) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer(x, positions, cos, sin, arena)
        return self.lm_head(self.norm(x)).float()
