"""Llama-family decoder (SmolLM2, Llama 2/3 without rope scaling), gpt-fast style.

Why this shape: the KV cache is not a module attribute but one static arena
buffer shared by all layers (``kv_cache``, ``[max_context, layers, 2, kv_heads,
head_dim]``; see ``models.base.kv_cache_spec``). Each attention layer hands its
slice to ``ops.rope_write_and_attend`` (RoPE, the cache write at ``positions``
and causal attention; see there for the CPU, CUDA and triton paths), so every
step has fixed shapes, never syncs with the host and can be captured in a CUDA
graph; a capsule restore only has to copy bytes back into the same buffers.

Projections are fused (``wqkv``, ``w13``): at batch 1 decode is a chain of
matrix-vector products, and fewer, larger ones are cheaper; each norm and
residual add rides with a product (``ops.linear.fused_linear``: one launch per
product in a decode step on CUDA).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
from torch import nn

from flashrt_ros.models.base import CausalLM, kv_cache_spec, kv_views
from flashrt_ros.ops.linear import Linear, fused_linear
from flashrt_ros.ops.norms import rms_norm
from flashrt_ros.ops.rope import rope_inv_freq
from flashrt_ros.ops.static_kv_attention import project_rope_write_and_attend
from flashrt_ros.runtime.arena import BufferSpec, StateArena


@dataclass(frozen=True)
class LlamaConfig:
    """Architecture hyper-parameters (the names follow llama.cpp / gpt-fast)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int = 0            # 0: dim // n_heads
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": "llama", **asdict(self)}


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as Llama does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Holds the RoPE frequencies; cos/sin come from the position tensor in each attention call.

    ``inv_freq`` is kept in float32 whatever the model dtype: call :meth:`reset`
    after moving the model to another dtype or materialising it from ``meta``.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)

    def reset(self) -> None:
        self.inv_freq = rope_inv_freq(self.head_dim, self.theta).to(self.inv_freq.device)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_size = cfg.n_heads * cfg.head_dim
        self.kv_size = cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.dim, self.q_size + 2 * self.kv_size, bias=False)
        self.wo = Linear(self.q_size, cfg.dim, bias=False)
        self.kv_index = layer             # this layer's slot in the shared KV cache

    def attend(self, x: torch.Tensor, norm: RMSNorm, positions: torch.Tensor, inv_freq: torch.Tensor,
               arena: StateArena) -> torch.Tensor:
        """The normed residual stream's projection, RoPE, the KV write and causal attention; before ``wo``."""
        return project_rope_write_and_attend(x, self.wqkv.weight, norm.weight, norm.eps,
                                             *kv_views(arena, self.kv_index), positions, inv_freq, self.n_heads,
                                             self.n_kv_heads)


class FeedForward(nn.Module):
    """SwiGLU's weights, the gate and up projections fused into one matrix (``TransformerBlock`` runs them)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w13 = Linear(cfg.dim, 2 * cfg.intermediate_size, bias=False)
        self.w2 = Linear(cfg.intermediate_size, cfg.dim, bias=False)


class TransformerBlock(nn.Module):
    """Pre-norm block as four products (``ops.linear.fused_linear``): each norm runs with the product after it
    and each residual add with the product before it, RoPE and the KV write with the q / k / v product
    (``Attention.attend``), so a decode step's layer is four launches and the attention's; with more rows
    (prefill, the CPU) the same rounding as separate ops."""

    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                arena: StateArena) -> torch.Tensor:
        """The residual stream after this block."""
        a, ff = self.attention, self.feed_forward
        n1, n2 = self.attention_norm, self.ffn_norm
        x = fused_linear(a.attend(x, n1, positions, inv_freq, arena), a.wo.weight, epilogue="residual", residual=x)
        gated = fused_linear(x, ff.w13.weight, norm="llama", norm_weight=n2.weight, eps=n2.eps, epilogue="silu_gate")
        return fused_linear(gated, ff.w2.weight, epilogue="residual", residual=x)


class Llama(CausalLM):
    """A Llama decoder implementing the CausalLM arena contract."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.build_decoder(cfg, cfg.vocab_size, cfg.dim, (TransformerBlock(cfg, i) for i in range(cfg.n_layers)),
                           RMSNorm(cfg.dim, cfg.norm_eps), tie_embeddings=cfg.tie_embeddings,
                           embedding="tok_embeddings", head="output")
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def state_specs(self, max_context: int) -> list[BufferSpec]:
        cfg = self.config
        return [kv_cache_spec(max_context, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, self.state_dtype)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, arena: StateArena, *,
                last_only: bool = False) -> torch.Tensor:
        x = self.tok_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.rope.inv_freq, arena)
        if last_only:
            x = x[-1:]
        return fused_linear(x, self.output.weight, norm="llama", norm_weight=self.norm.weight,
                            eps=self.norm.eps).float()

    # --- weights ------------------------------------------------------------
    @torch.no_grad()
    def load_hf_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        """Take weights named as in transformers' ``LlamaForCausalLM`` (q/k in HF rope layout).

        Both loaders (GGUF, after un-permuting Q/K, and a transformers model in
        the tests) produce this naming, so the fusion lives in one place. The
        parameters are *replaced* (no copy into a random init; works on a model
        built on the ``meta`` device); the caller's tensors are cloned only where
        fusion needs a new tensor anyway.
        """
        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"missing weight {name}")
            return sd[name].detach()

        def put(module: nn.Module, tensor: torch.Tensor) -> None:
            if tuple(module.weight.shape) != tuple(tensor.shape):
                raise ValueError(f"weight shape {tuple(tensor.shape)} != {tuple(module.weight.shape)}")
            module.weight = nn.Parameter(tensor.clone() if tensor.is_inference() else tensor,
                                         requires_grad=False)

        put(self.tok_embeddings, take("model.embed_tokens.weight"))
        put(self.norm, take("model.norm.weight"))
        if self.config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        else:
            put(self.output, take("lm_head.weight"))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            put(layer.attention_norm, take(p + "input_layernorm.weight"))
            put(layer.ffn_norm, take(p + "post_attention_layernorm.weight"))
            put(layer.attention.wqkv, torch.cat(
                [take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")], dim=0))
            put(layer.attention.wo, take(p + "self_attn.o_proj.weight"))
            put(layer.feed_forward.w13, torch.cat(
                [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0))
            put(layer.feed_forward.w2, take(p + "mlp.down_proj.weight"))


def build_llama(cfg: LlamaConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                hf_state_dict: Mapping[str, torch.Tensor] | None = None, seed: int | None = None) -> Llama:
    """An eval-mode Llama in ``dtype`` on ``device``: loaded from ``hf_state_dict`` or random (``seed``).

    With a state dict the module is built on ``meta`` first and its parameters
    are replaced by the given tensors, so no time goes into a random init that is
    overwritten anyway. Parameters never require grad: this is inference code.
    """
    if hf_state_dict is not None:
        with torch.device("meta"):
            model = Llama(cfg)
        model.rope.inv_freq = torch.empty_like(model.rope.inv_freq, device="cpu")
        model.load_hf_state_dict(hf_state_dict)
    else:
        gen = torch.Generator().manual_seed(0 if seed is None else seed)
        model = Llama(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1] ** 0.5))
        model.requires_grad_(False)
    model = model.to(device=device, dtype=dtype).eval()
    model.rope.reset()
    return model
