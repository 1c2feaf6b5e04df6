"""Triton static-KV attention vs a float32 reference: prefill and split-KV decode.

On a CPU machine the kernels run in triton's interpreter (tiny shapes); on a
GPU the same tests run the compiled kernels, plus a CUDA-graph replay across
positions and the real model's shape (D=256, 16k cache) in bf16.
"""
from __future__ import annotations

import pytest
import torch

from triton_interpret import INTERPRET, kernel_device, needs_triton

pytest.importorskip("triton")
import flashrt_ros.ops.triton.attention as attention  # noqa: E402
from flashrt_ros.ops.triton.attention import (  # noqa: E402
    _decode_config,
    _prefill_config,
    _short_config,
    static_kv_attention,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
              scale: float | None = None) -> torch.Tensor:
    """Float32 softmax over keys ``j <= start + i`` for query row i; GQA by repeating kv heads."""
    n_queries, n_heads, head_dim = q.shape
    live = start + n_queries
    group = n_heads // k_cache.shape[1]
    k = k_cache[:live].float().repeat_interleave(group, dim=1)
    v = v_cache[:live].float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * (head_dim ** -0.5 if scale is None else scale)
    visible = (torch.arange(live, device=q.device)[None, :]
               <= start + torch.arange(n_queries, device=q.device)[:, None])
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", probs, v)


def make_inputs(n_queries: int, start: int, n_heads: int, n_kv: int, head_dim: int, max_context: int,
                dtype: torch.dtype = torch.float32, garbage: float = float("nan"), seed: int = 0,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, caches whose rows past ``start + n_queries - 1`` hold ``garbage``, and the device start."""
    device = kernel_device()
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, n_heads, head_dim, generator=gen).to(device, dtype)
    k_cache = torch.randn(max_context, n_kv, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(max_context, n_kv, head_dim, generator=gen).to(device, dtype)
    k_cache[start + n_queries:] = garbage
    v_cache[start + n_queries:] = garbage
    return q, k_cache, v_cache, torch.tensor(start, dtype=torch.int64, device=device)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def assert_matches_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             start: torch.Tensor, tol: float, scale: float | None = None) -> None:
    out = static_kv_attention(q, k_cache, v_cache, start, scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert torch.isfinite(out).all()
    ref = reference(q, k_cache, v_cache, int(start.reshape(-1)[0]), scale)
    assert relative_error(out, ref) <= tol


@pytest.fixture(params=["split-key", "flash"])
def prefill_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a prefill test through both forms: short chunks split over keys, long ones flash-style."""
    if request.param == "flash":
        monkeypatch.setattr(attention, "_SHORT_MAX_QUERIES", 1)
    return request.param


@needs_triton
@pytest.mark.usefixtures("prefill_form")
@pytest.mark.parametrize("n_queries, start, n_heads, n_kv, head_dim, max_context", [
    (5, 37, 4, 2, 16, 64),       # mid-cache, GQA group of 2
    (40, 0, 4, 2, 32, 64),       # a prompt from position 0
    (9, 20, 9, 3, 16, 64),       # group of 3 (not a power of two)
    (2, 0, 2, 2, 16, 16),        # two tokens, one head per kv head, cache smaller than a key block
    (6, 62, 4, 2, 16, 128),      # first query one short of a key-block end: that block is diagonal
    (6, 63, 4, 2, 16, 128),      # first query on a key-block end: that block is unmasked
])
def test_prefill_matches_float32_reference(n_queries: int, start: int, n_heads: int, n_kv: int,
                                           head_dim: int, max_context: int) -> None:
    assert_matches_reference(*make_inputs(n_queries, start, n_heads, n_kv, head_dim, max_context), tol=1e-4)


@needs_triton
@pytest.mark.usefixtures("prefill_form")
def test_prefill_spanning_several_query_tiles_and_key_blocks_matches_reference() -> None:
    n_queries, start, head_dim = 150, 70, 16
    block_m, block_n, _, _ = _prefill_config(head_dim, n_queries)
    assert n_queries > block_m and start > block_n      # unmasked and diagonal blocks in several tiles
    assert_matches_reference(*make_inputs(n_queries, start, 4, 2, head_dim, 256), tol=1e-4)


@needs_triton
@pytest.mark.parametrize("start, n_heads, n_kv, head_dim, max_context", [
    (100, 4, 2, 16, 128),        # GQA, two slices
    (0, 4, 2, 16, 128),          # first token: one live key
    (57, 9, 3, 32, 128),         # group of 3 (not a power of two)
    (130, 8, 1, 16, 256),        # all heads share one kv head; two of four slices empty
])
def test_decode_matches_float32_reference(start: int, n_heads: int, n_kv: int, head_dim: int,
                                          max_context: int) -> None:
    assert_matches_reference(*make_inputs(1, start, n_heads, n_kv, head_dim, max_context), tol=1e-4)


@needs_triton
@pytest.mark.parametrize("n_queries, start, n_heads, n_kv, max_context", [
    (64, 700, 4, 2, 1024),       # a 64-token turn after 700 cached tokens: several key slices
    (7, 1000, 9, 3, 1024),       # group of 3, rows of one tile span two slices' boundary
    (33, 128, 4, 1, 512),        # the chunk starts exactly on a slice boundary
    (16, 120, 4, 2, 512),        # early rows see fewer slices than late ones
])
def test_split_key_prefill_over_several_slices_matches_reference(n_queries: int, start: int, n_heads: int,
                                                                 n_kv: int, max_context: int) -> None:
    head_dim = 16
    _, block_n, split, n_splits, _, _ = _short_config(head_dim, n_queries, n_heads // n_kv, n_kv, max_context)
    assert n_splits > 1 and split >= 2 * block_n and (start + n_queries) > split
    assert_matches_reference(*make_inputs(n_queries, start, n_heads, n_kv, head_dim, max_context), tol=1e-4)


@pytest.mark.parametrize("n_queries", [2, 64, 256])
@pytest.mark.parametrize("max_context", [16, 2048 + 64, 16384 + 64, 131072])
@pytest.mark.parametrize("head_dim, group, n_kv", [(256, 4, 2), (64, 3, 3)])
def test_split_key_slices_are_power_of_two_multiples_of_the_key_block_covering_the_cache(
        n_queries: int, max_context: int, head_dim: int, group: int, n_kv: int) -> None:
    block_m, block_n, split, n_splits, _, _ = _short_config(head_dim, n_queries, group, n_kv, max_context)
    assert split % block_n == 0 and split & (split - 1) == 0 and block_m & (block_m - 1) == 0
    assert (n_splits - 1) * split < max_context <= n_splits * split


@needs_triton
@pytest.mark.parametrize("start", [300, 8191])
def test_decode_loops_over_key_blocks_within_a_slice_and_skips_empty_slices(start: int) -> None:
    head_dim, max_context = 16, 8192
    block_n, split, n_splits, _, _ = _decode_config(head_dim, max_context)
    assert split > block_n and n_splits * split >= max_context
    assert_matches_reference(*make_inputs(1, start, 4, 2, head_dim, max_context), tol=1e-4)


@needs_triton
@pytest.mark.usefixtures("prefill_form")
@pytest.mark.parametrize("n_queries", [1, 6])
def test_garbage_in_rows_past_the_live_length_does_not_change_the_output(n_queries: int) -> None:
    shape = (n_queries, 45, 4, 2, 16, 128)
    outputs = [static_kv_attention(*make_inputs(*shape, garbage=value))
               for value in (0.0, float("nan"), float("inf"))]
    assert torch.isfinite(outputs[0]).all()
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


@needs_triton
@pytest.mark.parametrize("n_queries, start, layout", [(7, 11, "columns"), (7, 11, "gated"), (1, 30, "gated")])
def test_query_sliced_from_a_wider_projection_uses_its_strides(n_queries: int, start: int,
                                                               layout: str) -> None:
    n_heads, n_kv, head_dim = 4, 2, 16
    _, k_cache, v_cache, start_t = make_inputs(n_queries, start, n_heads, n_kv, head_dim, 64)
    device = kernel_device()
    if layout == "columns":     # q is the first H*D columns of a fused q|k|v projection
        proj = torch.randn(n_queries, (n_heads + 2 * n_kv) * head_dim, device=device)
        q = proj[:, :n_heads * head_dim].view(n_queries, n_heads, head_dim)
    else:                       # each head's query is followed by its output gate
        q = torch.randn(n_queries, n_heads, 2 * head_dim, device=device)[..., :head_dim]
    assert not q.is_contiguous()
    assert_matches_reference(q, k_cache, v_cache, start_t, tol=1e-4)


@needs_triton
@pytest.mark.parametrize("n_queries", [1, 4])
def test_start_given_as_a_one_element_vector_and_a_custom_scale(n_queries: int) -> None:
    q, k_cache, v_cache, start = make_inputs(n_queries, 19, 4, 2, 16, 64)
    assert_matches_reference(q, k_cache, v_cache, start.reshape(1), tol=1e-4, scale=0.3)


@needs_triton
@pytest.mark.usefixtures("prefill_form")
@pytest.mark.parametrize("n_queries, start, head_dim", [(5, 37, 16), (20, 10, 64), (1, 100, 64),
                                                        (12, 30, 256), (1, 50, 256)])
def test_bf16_matches_float32_reference_for_model_head_dims(n_queries: int, start: int,
                                                            head_dim: int) -> None:
    inputs = make_inputs(n_queries, start, 4, 2, head_dim, 128, dtype=torch.bfloat16)
    assert_matches_reference(*inputs, tol=1e-2)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("max_context", [16, 128, 4096, 16384 + 64, 131072])
def test_decode_slices_are_power_of_two_multiples_of_the_key_block_covering_the_cache(
        head_dim: int, max_context: int) -> None:
    block_n, split, n_splits, _, _ = _decode_config(head_dim, max_context)
    assert split % block_n == 0 and split & (split - 1) == 0
    assert (n_splits - 1) * split < max_context <= n_splits * split
    assert n_splits <= 2 * 64


@needs_cuda
@needs_triton
@pytest.mark.parametrize("n_queries", [1, 7, 64])
def test_one_cuda_graph_serves_every_start_position(n_queries: int) -> None:
    max_context = 320                  # position 200 + 64 queries fits
    q, k_cache, v_cache, start = make_inputs(n_queries, 0, 4, 2, 64, max_context, dtype=torch.bfloat16,
                                             garbage=1.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            static_kv_attention(q, k_cache, v_cache, start)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static_kv_attention(q, k_cache, v_cache, start)

    replayed = []
    for position in (3, 200):
        start.fill_(position)
        graph.replay()
        eager = static_kv_attention(q, k_cache, v_cache, torch.tensor(position, device=q.device))
        assert torch.equal(out, eager)
        assert relative_error(out, reference(q, k_cache, v_cache, position)) <= 1e-2
        replayed.append(out.clone())
    assert not torch.equal(replayed[0], replayed[1])


@needs_cuda
@needs_triton
@pytest.mark.parametrize("n_queries, start", [(2048, 14336), (1, 16000), (64, 16320), (64, 2048)])
def test_model_shape_bf16_at_16k_context_matches_reference(n_queries: int, start: int) -> None:
    inputs = make_inputs(n_queries, start, 8, 2, 256, 16384 + 64, dtype=torch.bfloat16)
    assert_matches_reference(*inputs, tol=1e-2)


@needs_triton
@pytest.mark.parametrize("n_queries, start", [(6, 20), (1, 40)])
def test_layer_views_of_the_shared_position_major_cache_work(n_queries: int, start: int) -> None:
    """The models' caches are ``kv_cache[:, layer, 0|1]`` views of one ``[S, L, 2, KV, D]`` buffer."""
    q, k_cache, v_cache, start_t = make_inputs(n_queries, start, 4, 2, 16, 64)
    shared = torch.full((64, 3, 2, 2, 16), float("nan"), dtype=q.dtype, device=q.device)
    shared[:, 1, 0], shared[:, 1, 1] = k_cache, v_cache
    assert_matches_reference(q, shared[:, 1, 0], shared[:, 1, 1], start_t, tol=1e-4)


@needs_triton
@pytest.mark.parametrize("n_queries, start, n_heads, n_kv, max_context", [
    (1, 100, 4, 2, 128),         # decode, GQA, two live slices
    (1, 0, 4, 2, 128),           # first token: one live slice
    (1, 57, 9, 3, 128),          # a group of 3
    (7, 1000, 9, 3, 1024),       # a short chunk whose tile spans a slice boundary
    (16, 120, 4, 2, 512),        # early rows see fewer slices than late ones
])
def test_merged_split_attention_gives_the_combine_kernels_bits_and_resets_its_counts(
        n_queries: int, start: int, n_heads: int, n_kv: int, max_context: int) -> None:
    """The split programs merging their own slices (``merged_split_attention``: one launch, no combine kernel) run
    the combine kernel's code, so the output is the same bits, call after call; the arrival counts are 0 again
    after every launch (a graph replays on them)."""
    from flashrt_ros.ops.triton.scratch import kept_for
    q, k_cache, v_cache, start_t = make_inputs(n_queries, start, n_heads, n_kv, 16, max_context)
    combined = static_kv_attention(q, k_cache, v_cache, start_t)
    with attention.merged_split_attention(True):
        merged = [static_kv_attention(q, k_cache, v_cache, start_t) for _ in range(2)]
    assert torch.equal(merged[0], combined) and torch.equal(merged[1], combined)
    counts = kept_for(k_cache, "split_attention")      # (an earlier buffer at the same address may have left one)
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)
