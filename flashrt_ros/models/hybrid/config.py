"""Hyper-parameters of the hybrid (Gated DeltaNet + gated attention) decoder.

Field names follow transformers' ``Qwen3NextConfig`` so a ``config.json`` maps
one-to-one; ``gdn_chunk_size`` is ours (the prefill chunk of the torch path).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class HybridConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    layer_types: tuple[str, ...] = ()        # empty: every 4th layer full attention
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    # Mixture of experts (Qwen3-Next's sparse MLP); num_experts = 0 means dense everywhere.
    # The MoE defaults are transformers' Qwen3NextConfig defaults (they matter only when num_experts > 0).
    num_experts: int = 0
    num_experts_per_tok: int = 10
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True
    gdn_chunk_size: int = 64
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", full_attention_every(self.num_hidden_layers, 4))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must name one type per layer")
        if set(self.layer_types) - {LINEAR, FULL}:
            raise ValueError(f"unknown layer types {set(self.layer_types) - {LINEAR, FULL}}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.hidden_act != "silu":
            raise ValueError(f"only silu is supported, not {self.hidden_act}")
        if self.rotary_dim % 2:
            raise ValueError("head_dim * partial_rotary_factor must be even")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..num_experts ({self.num_experts}), "
                             f"got {self.num_experts_per_tok}")

    # --- derived sizes ------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv: q, k and v of the linear layer."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["mlp_only_layers"] = list(self.mlp_only_layers)
        return {"architecture": "qwen3_next_hybrid", **d}

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], **overrides: Any) -> HybridConfig:
        """Build from a transformers ``config.json`` dict (old and new rope layouts)."""
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope type {rope_type!r} is not supported")
        n_layers = d["num_hidden_layers"]
        layer_types = d.get("layer_types") or full_attention_every(
            n_layers, d.get("full_attention_interval", 4))
        hidden = d["hidden_size"]
        heads = d["num_attention_heads"]
        kwargs: dict[str, Any] = dict(
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or hidden // heads,
            linear_num_key_heads=d["linear_num_key_heads"],
            linear_num_value_heads=d["linear_num_value_heads"],
            linear_key_head_dim=d["linear_key_head_dim"],
            linear_value_head_dim=d["linear_value_head_dim"],
            linear_conv_kernel_dim=d.get("linear_conv_kernel_dim", 4),
            layer_types=tuple(layer_types),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25)),
            attention_bias=d.get("attention_bias", False),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            max_position_embeddings=d.get("max_position_embeddings", 32768),
            num_experts=d.get("num_experts", 0) or 0,
            num_experts_per_tok=d.get("num_experts_per_tok", cls.num_experts_per_tok),
            moe_intermediate_size=d.get("moe_intermediate_size", cls.moe_intermediate_size),
            shared_expert_intermediate_size=d.get("shared_expert_intermediate_size",
                                                  cls.shared_expert_intermediate_size),
            decoder_sparse_step=d.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
            norm_topk_prob=d.get("norm_topk_prob", True),
            hidden_act=d.get("hidden_act", "silu"),
        )
        kwargs.update(overrides)
        return cls(**kwargs)


def full_attention_every(n_layers: int, interval: int) -> tuple[str, ...]:
    """Qwen3-Next's pattern: layers ``interval-1, 2*interval-1, ...`` are full attention."""
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers))


_TINY = HybridConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4, partial_rotary_factor=0.5,
    max_position_embeddings=512, gdn_chunk_size=16)


def random_hybrid_config(**overrides: Any) -> HybridConfig:
    """A tiny config (4 layers, 3 linear + 1 full attention) for unit tests; any field overridable."""
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        overrides["layer_types"] = ()
    return replace(_TINY, **overrides)


def bench_0p8b_config(**overrides: Any) -> HybridConfig:
    """The 0.81B benchmark shape: 24 layers (every 4th full attention), dense MLP, untied lm_head.

    0.81B parameters = 0.50B in the layers + 2 x 0.156B for the embedding and lm_head.
    """
    base = HybridConfig(
        vocab_size=151936, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
        rope_theta=10_000_000.0, tie_word_embeddings=False, max_position_embeddings=262144)
    return replace(base, **overrides)


__all__ = ["FULL", "LINEAR", "HybridConfig", "bench_0p8b_config", "full_attention_every",
           "random_hybrid_config"]
