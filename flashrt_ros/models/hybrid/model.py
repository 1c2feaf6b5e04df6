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

from flashrt_ros.models.base import CausalLM, kv_cache_spec
from flashrt_ros.models.hybrid.attention import GatedAttention
from flashrt_ros.models.hybrid.config import FULL, HybridConfig
from flashrt_ros.models.hybrid.gated_deltanet import GatedDeltaNet
from flashrt_ros.models.hybrid.mlp import make_mlp
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.ops import rope_inv_freq
from flashrt_ros.ops.norms import add_rms_norm
from flashrt_ros.runtime.arena import BufferSpec, StateArena


class HybridBlock(nn.Module):
    """Pre-norm residual block: token mixer, then MLP.

    The residual stream travels as ``(x, delta)``: each block first adds the
    previous block's output to ``x`` and normalises in one step
    (``ops.add_rms_norm``), the same arithmetic as ``x = x + delta; norm(x)``.
    """

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.is_attention = cfg.layer_types[layer] == FULL
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        kv_index = sum(t == FULL for t in cfg.layer_types[:layer])     # slot in the shared KV cache
        self.mixer: GatedAttention | GatedDeltaNet = (
            GatedAttention(cfg, kv_index) if self.is_attention else GatedDeltaNet(cfg, layer))
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg, layer)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
                inv_freq: torch.Tensor, arena: StateArena) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = self.input_layernorm.add_and_norm(x, delta)
        if self.is_attention:
            h = self.mixer(h, positions, inv_freq, arena)
        else:
            h = self.mixer(h, arena)
        x, h = self.post_attention_layernorm.add_and_norm(x, h)
        return x, self.mlp(h)


class HybridCausalLM(CausalLM):
    """A Qwen3-Next-style hybrid decoder implementing the CausalLM arena contract.

    The recurrent state is declared float32 whatever the weight dtype: it sums
    the whole history, the kernels accumulate it in float32 anyway, and a bf16
    state would drift from a cold prefill. KV and conv state use the weight dtype.
    """

    recurrent_dtype = torch.float32

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.build_decoder(cfg, cfg.vocab_size, cfg.hidden_size,
                           (HybridBlock(cfg, i) for i in range(cfg.num_hidden_layers)),
                           OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps), tie_embeddings=cfg.tie_word_embeddings)
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
            if not block.is_attention:
                specs.append(BufferSpec(
                    f"layers.{i}.gdn.recurrent",
                    (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                    self.recurrent_dtype, group="recurrent", doc=f"delta-rule state of layer {i}"))
                specs.append(BufferSpec(
                    f"layers.{i}.gdn.conv", (cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), dtype,
                    group="conv", doc=f"last conv inputs of layer {i}"))
        attention_layers = sum(block.is_attention for block in self.layers)
        if attention_layers:
            specs.append(kv_cache_spec(max_context, attention_layers, cfg.num_key_value_heads, cfg.head_dim, dtype))
        return specs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, arena: StateArena, *,
                last_only: bool = False) -> torch.Tensor:
        x, delta = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, delta = layer(x, delta, positions, self.inv_freq, arena)
        if last_only:
            x, delta = x[-1:], delta[-1:]
        return self.lm_head(self.norm.add_and_norm(x, delta)[1]).float()
