"""Our arena Llama matches transformers' LlamaForCausalLM on tiny random weights."""
import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from flashrt_ros.models.base import KV_CACHE
from flashrt_ros.models.gguf_loader import unpermute_rope_rows
from flashrt_ros.models.llama import LlamaConfig, build_llama
from flashrt_ros.runtime.arena import POSITION, StateArena, core_meta_specs


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    hf_cfg = HFLlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, rope_theta=50000.0,
                           rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=128)
    hf = LlamaForCausalLM(hf_cfg).eval()
    cfg = LlamaConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=96,
                      rope_theta=50000.0, norm_eps=1e-5, tie_embeddings=True)
    ours = build_llama(cfg, hf_state_dict={k: v.clone() for k, v in hf.state_dict().items()})
    return hf, ours


@torch.no_grad()
def test_chunked_prefill_and_decode_match_transformers(pair):
    hf, ours = pair
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(1))
    ref = hf(ids[None]).logits[0]
    arena = StateArena(core_meta_specs() + ours.state_specs(64))
    parts = [ours(ids[:9], torch.arange(9), arena), ours(ids[9:16], torch.arange(9, 16), arena)]
    parts += [ours(ids[i:i + 1], torch.tensor([i]), arena) for i in range(16, 20)]
    out = torch.cat(parts)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_kv_rows_past_the_query_position_are_ignored(pair):
    """Attention runs over the static buffer: garbage beyond the position must not leak in."""
    _, ours = pair
    ids = torch.randint(0, 300, (6,), generator=torch.Generator().manual_seed(2))
    clean = StateArena(core_meta_specs() + ours.state_specs(32))
    dirty = StateArena(core_meta_specs() + ours.state_specs(32))
    dirty[KV_CACHE].normal_()
    a = ours(ids, torch.arange(6), clean)
    b = ours(ids, torch.arange(6), dirty)
    assert torch.equal(a, b)


def test_state_specs_follow_the_contract(pair):
    _, ours = pair
    (s,) = ours.state_specs(48)
    assert s.name == KV_CACHE and s.shape == (48, 2, 2, 2, 16)     # positions, layers, k/v, kv heads, dim
    assert s.group == "kv" and s.live_axis == 0
    assert s.length_from == POSITION and s.append_only and s.dtype == torch.float32


def test_unpermute_inverts_the_llama_cpp_rope_permutation():
    heads, head_dim, dim = 3, 8, 12
    w = torch.randn(heads * head_dim, dim)
    # llama.cpp's converter: per head, interleave the two rotate-half halves row by row.
    permuted = w.reshape(heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(w.shape)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rope_rows(permuted, heads), w)
