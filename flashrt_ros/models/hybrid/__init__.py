"""Hybrid Qwen3-Next-style decoder: Gated DeltaNet + gated full attention over the arena.

One concept per module: ``config`` (hyper-parameters), ``gated_deltanet`` and
``attention`` (token mixers), ``mlp``, ``norms``, ``model`` (the CausalLM) and
``loader`` (transformers checkpoints).
"""
from flashrt_ros.models.hybrid.config import HybridConfig, bench_0p8b_config, random_hybrid_config
from flashrt_ros.models.hybrid.loader import load_hf_state_dict, load_hybrid_checkpoint
from flashrt_ros.models.hybrid.model import HybridCausalLM

__all__ = ["HybridCausalLM", "HybridConfig", "bench_0p8b_config", "load_hf_state_dict",
           "load_hybrid_checkpoint", "random_hybrid_config"]
