"""Our hybrid decoder, loaded from a transformers checkpoint, computes what Qwen3NextForCausalLM computes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from flashrt_ros.models.hybrid import HybridCausalLM, HybridConfig, load_hybrid_checkpoint
from flashrt_ros.runtime.arena import StateArena, core_meta_specs
from flashrt_ros.runtime.errors import InvalidArgument

PROMPT_LEN = 40            # > 2 GDN chunks of the tiny config (16): covers chunk padding and carry-over
MAX_CONTEXT = 128
# The parity target is <= 1e-3; float32 differences measure ~1e-6, and 1e-3 would let a
# wrongly loaded dt_bias (~4e-4 on this tiny model) pass, so the bound is tighter.
REL_TOL = 1e-4


def _hf_config(**overrides) -> Qwen3NextConfig:
    kwargs = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=0, max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    kwargs.update(overrides)
    return Qwen3NextConfig(**kwargs)


def _save_random_hf(tmp: Path, seed: int, **overrides) -> Qwen3NextForCausalLM:
    """A seeded transformers model whose every weight (norms, gates, decays too) is perturbed.

    Why perturb: transformers initialises norm weights to 0/1 and q/k norms alike, so a
    loader that swapped them would still pass; noise on every tensor makes each one matter.
    """
    torch.manual_seed(seed)
    hf = Qwen3NextForCausalLM(_hf_config(**overrides)).eval()
    with torch.no_grad():
        for p in hf.parameters():   # vectors (norms, dt_bias, A_log) get more: they are O(1) scales
            p.add_((0.3 if p.dim() == 1 else 0.05) * torch.randn_like(p))
    hf.save_pretrained(tmp)
    return hf


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _arena(model: HybridCausalLM) -> StateArena:
    return StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT))


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> tuple[Qwen3NextForCausalLM, HybridCausalLM]:
    path = tmp_path_factory.mktemp("qwen3next_dense")
    hf = _save_random_hf(path, seed=0)
    return hf, load_hybrid_checkpoint(path, torch.float32, "cpu", gdn_chunk_size=16)


@torch.no_grad()
def test_prefill_and_32_decode_steps_match_transformers(dense) -> None:
    hf, ours = dense
    ids = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1))
    arena = _arena(ours)
    ref = hf(ids[None], use_cache=True)
    logits = ours(ids, torch.arange(PROMPT_LEN), arena)
    assert _rel(logits, ref.logits[0]) <= REL_TOL
    cache = ref.past_key_values
    token = logits[-1].argmax()
    for step in range(32):
        ref = hf(token.view(1, 1), cache=cache, use_cache=True)
        cache = ref.past_key_values
        logits = ours(token.view(1), torch.tensor([PROMPT_LEN + step]), arena)
        assert _rel(logits, ref.logits[0]) <= REL_TOL, f"decode step {step}"
        token = logits[-1].argmax()


@torch.no_grad()
def test_greedy_tokens_identical_to_transformers_generate_for_64_steps(dense) -> None:
    hf, ours = dense
    ids = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(2))
    expected = hf.generate(ids[None], max_new_tokens=64, do_sample=False, min_new_tokens=64)[0, PROMPT_LEN:]
    arena = _arena(ours)
    logits = ours(ids, torch.arange(PROMPT_LEN), arena)
    tokens = []
    for step in range(64):
        token = logits[-1].argmax()
        tokens.append(int(token))
        logits = ours(token.view(1), torch.tensor([PROMPT_LEN + step]), arena)
    assert len(expected) == 64
    assert tokens == expected.tolist()


@torch.no_grad()
def test_moe_tied_checkpoint_matches_transformers(tmp_path: Path) -> None:
    hf = _save_random_hf(tmp_path, seed=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, mlp_only_layers=[0], tie_word_embeddings=True)
    ours = load_hybrid_checkpoint(tmp_path, torch.float32, "cpu", gdn_chunk_size=16)
    assert ours.config.is_moe_layer(1) and not ours.config.is_moe_layer(0)
    ids = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(4))
    arena = _arena(ours)
    ref = hf(ids[None], use_cache=True)
    logits = ours(ids, torch.arange(24), arena)
    assert _rel(logits, ref.logits[0]) <= REL_TOL
    cache, token = ref.past_key_values, logits[-1].argmax()
    for step in range(4):
        ref = hf(token.view(1, 1), cache=cache, use_cache=True)
        cache = ref.past_key_values
        logits = ours(token.view(1), torch.tensor([24 + step]), arena)
        assert _rel(logits, ref.logits[0]) <= REL_TOL
        token = logits[-1].argmax()


def test_moe_config_without_top_k_loads_with_transformers_default_of_ten(tmp_path: Path) -> None:
    """A config.json that omits num_experts_per_tok (and the MoE widths) means transformers' defaults."""
    _save_random_hf(tmp_path, seed=7, num_experts=12, num_experts_per_tok=10, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
        del raw[key]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    hf_default = Qwen3NextConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    cfg = HybridConfig.from_hf_dict(raw)
    assert (cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) == (
        hf_default.num_experts_per_tok, hf_default.moe_intermediate_size,
        hf_default.shared_expert_intermediate_size) == (10, 512, 512)
    assert load_hybrid_checkpoint(tmp_path).layers[0].mlp.top_k == 10


def test_moe_top_k_above_the_expert_count_is_refused() -> None:
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        HybridConfig.from_hf_dict({**_hf_config(num_experts=4).to_dict(), "num_experts_per_tok": 5})


def test_config_json_maps_onto_hybrid_config(tmp_path: Path) -> None:
    _save_random_hf(tmp_path, seed=5)
    raw = json.loads((tmp_path / "config.json").read_text())
    cfg = HybridConfig.from_hf_dict(raw)
    assert cfg.layer_types == tuple(raw["layer_types"])
    assert cfg.rotary_dim == 8 and cfg.conv_dim == 2 * 32 + 64
    legacy = {k: v for k, v in raw.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(full_attention_interval=2, rope_theta=5e5, partial_rotary_factor=0.25)
    old = HybridConfig.from_hf_dict(legacy)
    assert old.layer_types == ("linear_attention", "full_attention") * 2
    assert (old.rope_theta, old.rotary_dim) == (5e5, 4)


def test_loader_refuses_unknown_and_missing_weights(tmp_path: Path) -> None:
    _save_random_hf(tmp_path, seed=6)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "model.layers.0.linear_attn.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="does not use"):
        load_hybrid_checkpoint(tmp_path)
    del weights["model.layers.3.self_attn.q_norm.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="lacks"):
        load_hybrid_checkpoint(tmp_path)
