"""The models the benchmark runs: ours, and transformers' twin with the same weights where possible.

Why build the transformers model first: its weights are seeded random and then
loaded into ours through the same loaders that read real checkpoints
(``load_hf_state_dict``), so both compute the same function and the HF columns
compare code paths, not weights. Without transformers (or its Qwen3-Next),
ours is seeded directly and the HF columns say why they are empty.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from flashrt_ros.models.base import CausalLM
from flashrt_ros.models.hybrid import HybridCausalLM, HybridConfig, bench_0p8b_config, random_hybrid_config
from flashrt_ros.models.hybrid.loader import load_hf_state_dict
from flashrt_ros.models.llama import LlamaConfig, build_llama
from flashrt_ros.models.registry import tiny_llama_config

MODELS = ("hybrid", "smollm2")

#: SmolLM2-135M's shape (as in its GGUF / HF config).
SMOLLM2_CONFIG = LlamaConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                             intermediate_size=1536, rope_theta=100000.0, norm_eps=1e-5,
                             tie_embeddings=True, max_position_embeddings=8192)


_MOE_ONLY = ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
             "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob")


@dataclass
class ModelPair:
    """Our model, the transformers twin (or None with ``hf_reason``), and how they were made."""

    name: str
    ours: CausalLM
    hf: nn.Module | None
    hf_reason: str
    weights: str
    notes: list[str] = field(default_factory=list)


def seeded_weights_(module: nn.Module, seed: int) -> None:
    """Seeded random weights, well scaled, generated where the parameters live (fast on a GPU).

    Matrices: N(0, 1/fan_in). Vectors (norm scales, gates, decays): their init
    plus N(0, 0.1^2), so zero-initialised ones (offset norms) matter too.
    """
    params = sorted(module.named_parameters(), key=lambda kv: kv[0])
    seen: set[int] = set()
    with torch.no_grad():
        for _, p in params:
            if p.data_ptr() in seen:            # tied weights: once
                continue
            seen.add(p.data_ptr())
            gen = torch.Generator(device=p.device).manual_seed(seed)
            seed += 1
            noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            else:
                p.add_((0.1 * noise).to(p.dtype))


def hf_qwen3next_config(cfg: HybridConfig) -> Any:
    """transformers' ``Qwen3NextConfig`` with the same architecture (dense MLP only)."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim, layer_types=list(cfg.layer_types),
        rms_norm_eps=cfg.rms_norm_eps, num_experts=0, attention_bias=cfg.attention_bias,
        tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "partial_rotary_factor": cfg.partial_rotary_factor})


def _finish(model: nn.Module, device: torch.device, dtype: torch.dtype) -> Any:
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


@contextmanager
def _building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Construct a transformers model directly in ``dtype`` on ``device``.

    Why not ``.to(dtype)`` afterwards: that would also cast its float32 RoPE
    frequencies, which ``from_pretrained(dtype=...)`` keeps in float32.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def _eval(model: nn.Module) -> Any:
    return model.eval().requires_grad_(False)


def build_hybrid(device: torch.device, dtype: torch.dtype, seed: int, quick: bool) -> ModelPair:
    cfg = random_hybrid_config() if quick else bench_0p8b_config()
    name = "hybrid-tiny" if quick else "hybrid-0.81B"
    try:
        from transformers import Qwen3NextForCausalLM
        hf_cfg = hf_qwen3next_config(cfg)
    except Exception as exc:           # transformers missing or without Qwen3-Next
        hf_reason = f"transformers Qwen3NextForCausalLM unavailable ({type(exc).__name__}: {exc})"
        with torch.device(device):
            ours = HybridCausalLM(cfg)
        seeded_weights_(ours, seed)
        return ModelPair(name, _finish(ours, device, dtype), None, hf_reason, f"seeded random (seed {seed})")
    with _building(device, dtype):
        hf = _eval(Qwen3NextForCausalLM(hf_cfg))
    seeded_weights_(hf, seed)
    # Our config read back from transformers' dict: proves the two architectures agree.
    back = HybridConfig.from_hf_dict(hf.config.to_dict(), gdn_chunk_size=cfg.gdn_chunk_size,
                                     **{k: getattr(cfg, k) for k in _MOE_ONLY})   # unused when dense
    if back != cfg:
        raise RuntimeError(f"config round trip through transformers changed it: {back} != {cfg}")
    with torch.device(device):
        ours = HybridCausalLM(cfg)
    ours = _finish(ours, device, dtype)
    load_hf_state_dict(ours, hf.state_dict())
    return ModelPair(name, ours, hf, "", f"seeded random (seed {seed}), identical in both")


def build_smollm2(device: torch.device, dtype: torch.dtype, seed: int, quick: bool,
                  force_random: bool) -> ModelPair:
    notes: list[str] = []
    cfg = tiny_llama_config() if quick else SMOLLM2_CONFIG
    name = "llama-tiny" if quick else "SmolLM2-135M"
    if not quick and not force_random:
        try:
            from flashrt_ros.models.registry import load_model
            ours, _, _, _ = load_model("smollm2", device=device, dtype=dtype)
            return ModelPair(name, ours.eval().requires_grad_(False), None,
                             "real GGUF weights: no transformers twin is built for them",
                             "SmolLM2-135M-Instruct Q4_1 GGUF, dequantised")
        except Exception as exc:
            notes.append(f"real SmolLM2 GGUF not loaded ({type(exc).__name__}: {exc}); random weights of its shape")
    try:
        from transformers import LlamaConfig as HFLlamaConfig, LlamaForCausalLM
    except Exception as exc:
        ours = build_llama(cfg, device=device, dtype=dtype, seed=seed)
        return ModelPair(name, ours, None, f"transformers LlamaForCausalLM unavailable ({exc})",
                         f"seeded random (seed {seed})", notes)
    hf_cfg = HFLlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.intermediate_size,
                           num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                           num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
                           tie_word_embeddings=cfg.tie_embeddings,
                           max_position_embeddings=cfg.max_position_embeddings,
                           rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    with _building(device, dtype):
        hf = _eval(LlamaForCausalLM(hf_cfg))
    seeded_weights_(hf, seed)
    ours = _eval(build_llama(cfg, device=device, dtype=dtype, hf_state_dict=hf.state_dict()))
    return ModelPair(name, ours, hf, "", f"seeded random (seed {seed}), identical in both", notes)


def weight_read_bytes(model: nn.Module) -> int:
    """Bytes a batch-1 decode step must read: every weight once, an input embedding only as one row.

    A tied embedding is read in full (it is the lm_head); shared tensors count once.
    """
    embeds = {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Linear)}
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        ptr = p.data_ptr()
        if ptr in seen or (ptr in embeds and ptr not in linears):
            continue
        seen.add(ptr)
        total += p.numel() * p.element_size()
    return total


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
