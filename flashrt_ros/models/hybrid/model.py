"""The hybrid decoder: Qwen3-Next layout over the arena contract.

Layers follow ``config.layer_types``: Gated DeltaNet (state: recurrent matrix +
conv window) or gated full attention (state: static KV rows). The model never
keeps state in attributes and never reads ``meta.position``: the engine passes
``positions`` and advances the position itself.

For speculative decoding it also offers the pieces an engine composes
(``hidden_states``, ``logits``, ``verify_scratch``) and, when built with
``mtp=True``, Qwen3-Next's multi-token-prediction head as ``mtp``.
"""
from __future__ import annotations

from typing import Any

import torch

from flashrt_ros.models.base import CausalLM, kv_cache_spec
from flashrt_ros.models.hybrid.block import HybridBlock
from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.mtp import MultiTokenPredictor
from flashrt_ros.models.hybrid.norms import OffsetRMSNorm
from flashrt_ros.models.hybrid.verification import VerifyScratch
from flashrt_ros.ops import rope_inv_freq
from flashrt_ros.ops.linear import fused_linear
from flashrt_ros.runtime.arena import BufferSpec, StateArena


class HybridCausalLM(CausalLM):
    """A Qwen3-Next-style hybrid decoder implementing the CausalLM arena contract.

    The recurrent state is declared float32 whatever the weight dtype: it sums
    the whole history, the kernels accumulate it in float32 anyway, and a bf16
    state would drift from a cold prefill. KV and conv state use the weight dtype.
    """

    recurrent_dtype = torch.float32

    def __init__(self, cfg: HybridConfig, *, mtp: bool = False) -> None:
        """``mtp``: also build the multi-token-prediction head (``self.mtp``, weights ``mtp.*``)."""
        super().__init__()
        self.build_decoder(cfg, cfg.vocab_size, cfg.hidden_size,
                           (HybridBlock(cfg, i) for i in range(cfg.num_hidden_layers)),
                           OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps), tie_embeddings=cfg.tie_word_embeddings)
        self.mtp = MultiTokenPredictor(cfg) if mtp else None
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rotary_dim, cfg.rope_theta), persistent=False)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        """Keep the RoPE frequencies float32 through ``.to(bfloat16)`` (they are constants, not state)."""
        super()._apply(fn, recurse)
        self.inv_freq = rope_inv_freq(self.config.rotary_dim, self.config.rope_theta).to(
            self.embed_tokens.weight.device)
        return self

    def config_dict(self) -> dict[str, Any]:
        d = self.config.to_dict()
        if self.mtp is not None:
            d["mtp_layers"] = len(self.mtp.layers)
        return d

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
        x = self._residual_stream(input_ids, positions, arena)
        if last_only:
            x = x[-1:]
        return fused_linear(x, self.lm_head.weight, norm="offset", norm_weight=self.norm.weight,
                            eps=self.norm.eps).float()

    # ------------------------------------------------------------ speculative decoding
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, arena: StateArena, *,
                      scratch: VerifyScratch | None = None) -> torch.Tensor:
        """Like ``forward``, but the final normed hidden states ``[T, H]`` of every token.

        ``scratch`` (from ``verify_scratch``): a speculative verification, whose
        Gated DeltaNet layers keep each token's state there and leave the arena's
        (``scratch.keep_prefix`` then picks the accepted one).
        """
        return self.norm.add_and_norm(self._residual_stream(input_ids, positions, arena, scratch), None)[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[T, vocab]`` of normed hidden states (the main model's or the MTP head's)."""
        return self.lm_head(hidden).float()

    def verify_scratch(self, tokens: int) -> VerifyScratch:
        """Scratch for verifications of up to ``tokens`` tokens (not state: see ``models.hybrid.verification``)."""
        linear = [i for i, block in enumerate(self.layers) if not block.is_attention]
        return VerifyScratch(self.config, linear, tokens, self.state_dtype, self.embed_tokens.weight.device)

    def mtp_state_specs(self, rows: int) -> list[BufferSpec]:
        """The MTP head's arena buffers (its KV cache with ``rows`` rows); needs ``mtp=True``."""
        if self.mtp is None:
            raise ValueError("this model was built without its MTP head")
        return self.mtp.state_specs(rows, self.state_dtype)

    def mtp_hidden(self, hidden: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
                   arena: StateArena) -> torch.Tensor:
        """The MTP head on rows ``(hidden at p, token p+1)`` at ``positions``: normed ``[T, H]``
        (``logits`` of it predict token p+2)."""
        assert self.mtp is not None, "this model was built without its MTP head"
        return self.mtp(hidden, self.embed_tokens(next_tokens), positions, self.inv_freq, arena)

    def _residual_stream(self, input_ids: torch.Tensor, positions: torch.Tensor, arena: StateArena,
                         scratch: VerifyScratch | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.inv_freq, arena, scratch)
        return x
