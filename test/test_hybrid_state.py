"""All of the hybrid decoder's state lives in the declared arena buffers, however the prompt is split."""
from __future__ import annotations

import copy

import pytest
import torch

from flashrt_ros.models.base import KV_CACHE
from flashrt_ros.models.hybrid import HybridCausalLM, bench_0p8b_config, random_hybrid_config
from flashrt_ros.runtime.arena import POSITION, StateArena, core_meta_specs

MAX_CONTEXT = 96
PROMPT = 40


def _random_model(seed: int = 0, **overrides) -> HybridCausalLM:
    torch.manual_seed(seed)
    model = HybridCausalLM(random_hybrid_config(**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 1 else 0.08)
    return model


def _arena(model: HybridCausalLM) -> StateArena:
    return StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT))


def _prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (PROMPT,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _run_split(model: HybridCausalLM, ids: torch.Tensor, splits: list[int]) -> tuple[torch.Tensor, StateArena]:
    """Feed ``ids`` in consecutive pieces of the given sizes; return all logits and the arena."""
    arena, start, outs = _arena(model), 0, []
    for size in splits:
        outs.append(model(ids[start:start + size], torch.arange(start, start + size), arena))
        start += size
    assert start == len(ids)
    return torch.cat(outs), arena


@pytest.mark.parametrize("splits", [[7, 33], [16, 16, 8], [1, 15, 3, 21], [39, 1]])
def test_chunked_prefill_agrees_with_token_by_token_decode(splits: list[int]) -> None:
    model, ids = _random_model(), _prompt()
    stepwise, arena_steps = _run_split(model, ids, [1] * PROMPT)
    chunked, arena_chunks = _run_split(model, ids, splits)
    whole, _ = _run_split(model, ids, [PROMPT])
    torch.testing.assert_close(chunked, stepwise, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(whole, stepwise, rtol=1e-4, atol=1e-4)
    for name in arena_steps:                       # the states agree too, not only the logits
        torch.testing.assert_close(arena_chunks[name], arena_steps[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk_size", [4, 64])
def test_gdn_chunk_size_does_not_change_the_result(chunk_size: int) -> None:
    ids = _prompt()
    reference, _ = _run_split(_random_model(gdn_chunk_size=16), ids, [PROMPT])
    other, _ = _run_split(_random_model(gdn_chunk_size=chunk_size), ids, [PROMPT])
    torch.testing.assert_close(other, reference, rtol=1e-4, atol=1e-4)


def test_state_specs_declare_kv_recurrent_and_conv_per_layer_type() -> None:
    model = _random_model()
    cfg = model.config
    specs = {s.name: s for s in model.state_specs(MAX_CONTEXT)}
    kv = specs[KV_CACHE]
    attention = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"]
    assert (kv.shape, kv.group, kv.live_axis, kv.length_from, kv.append_only) == (
        (MAX_CONTEXT, len(attention), 2, cfg.num_key_value_heads, cfg.head_dim), "kv", 0, POSITION, True)
    assert list(specs)[-1] == KV_CACHE          # last: the fully-live state before it is one copy run
    for i, kind in enumerate(cfg.layer_types):
        if kind == "full_attention":
            assert f"layers.{i}.gdn.recurrent" not in specs
        else:
            rec, conv = specs[f"layers.{i}.gdn.recurrent"], specs[f"layers.{i}.gdn.conv"]
            assert rec.shape == (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
            assert (rec.group, rec.dtype) == ("recurrent", torch.float32)
            assert (conv.shape, conv.group) == ((cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), "conv")
    assert len(specs) == 2 * (len(cfg.layer_types) - len(attention)) + 1


@torch.no_grad()
def test_forward_writes_every_state_group_and_leaves_weights_untouched() -> None:
    model = _random_model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    arena = _arena(model)
    model(_prompt(), torch.arange(PROMPT), arena)
    for name in arena:
        if name.endswith((".gdn.recurrent", ".gdn.conv")):
            assert torch.count_nonzero(arena[name]) > 0, name
        elif name == KV_CACHE:
            assert torch.count_nonzero(arena[name][:PROMPT].abs().sum(dim=(2, 3, 4)).prod(dim=1)) == PROMPT
            # rows past the written positions stay untouched (attention reads them only under the mask)
            assert torch.count_nonzero(arena[name][PROMPT:]) == 0, name
    assert int(arena[POSITION]) == 0                        # the engine, not the model, advances it
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), f"forward changed {k}"


@torch.no_grad()
def test_restoring_the_arena_bytes_reproduces_the_next_step_exactly() -> None:
    model, ids = _random_model(), _prompt()
    arena = _arena(model)
    model(ids[:30], torch.arange(30), arena)
    snapshot = arena.block.clone()
    first = model(ids[30:], torch.arange(30, PROMPT), arena)
    assert not torch.equal(arena.block, snapshot)         # the step did change the state
    model(ids[:5], torch.arange(30, 35), arena)            # wander off with other tokens
    arena.block.copy_(snapshot)
    again = model(ids[30:], torch.arange(30, PROMPT), arena)
    assert torch.equal(again, first)


@torch.no_grad()
def test_models_sharing_weights_with_separate_arenas_are_independent() -> None:
    """If any state hid in a module attribute, the interleaved stream would see the other's tokens."""
    model, ids = _random_model(), _prompt()
    twin = copy.copy(model)                                # a second model object, the very same weights
    assert twin.lm_head.weight is model.lm_head.weight
    alone, _ = _run_split(model, ids, [20, 20])
    other_ids = _prompt(seed=9)
    arena_a, arena_b = _arena(model), _arena(twin)
    interleaved = []
    for a, b in ((0, 20), (20, PROMPT)):                   # alternate the two streams step by step
        interleaved.append(model(ids[a:b], torch.arange(a, b), arena_a))
        twin(other_ids[a:b], torch.arange(a, b), arena_b)
    assert torch.equal(torch.cat(interleaved), alone)


@torch.no_grad()
def test_model_never_reads_meta_position() -> None:
    model, ids = _random_model(), _prompt()
    arena_a, arena_b = _arena(model), _arena(model)
    arena_b[POSITION].fill_(12345)
    assert torch.equal(model(ids, torch.arange(PROMPT), arena_a), model(ids, torch.arange(PROMPT), arena_b))


def test_bench_config_is_the_0p8b_shape() -> None:
    cfg = bench_0p8b_config()
    with torch.device("meta"):
        model = HybridCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.80e9 <= n_params <= 0.82e9
    assert cfg.layer_types.count("full_attention") == 6 and cfg.layer_types[3] == "full_attention"
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 2, 256)
    assert (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.conv_dim) == (16, 128, 6144)


@torch.no_grad()
def test_bfloat16_model_keeps_float32_rope_and_recurrent_state() -> None:
    model, ids = _random_model(), _prompt()
    reference, _ = _run_split(model, ids, [24, 16])
    model.to(torch.bfloat16)
    assert model.inv_freq.dtype == torch.float32            # a constant, kept exact through .to()
    specs = {s.name: s.dtype for s in model.state_specs(MAX_CONTEXT)}
    assert specs["layers.0.gdn.recurrent"] == torch.float32
    assert specs["layers.0.gdn.conv"] == specs[KV_CACHE] == torch.bfloat16
    low, _ = _run_split(model, ids, [24, 16])
    assert low.dtype == torch.float32
    assert ((low - reference).norm() / reference.norm()).item() < 5e-2
