"""The small fused kernels (add+RMSNorm, gated products, q/k norm + RoPE + KV write) equal their torch references.

On a CPU machine they run in triton's interpreter (conftest sets TRITON_INTERPRET=1);
on a GPU machine the same tests run the compiled kernels.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from triton_interpret import BF16_TOL, INTERPRET, kernel_device, needs_triton

from flashrt_ros.models.llama import RMSNorm
from flashrt_ros.ops import apply_partial_rope, offset_rms_norm, rope_cos_sin, rope_inv_freq

pytestmark = needs_triton
DEV = kernel_device()
DTYPES = [torch.float32, torch.bfloat16]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _tol(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else BF16_TOL


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEV, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_equals_add_then_reference_norm(dtype, offset, with_delta):
    from flashrt_ros.ops.triton.norms import add_rms_norm

    x, delta = _randn(5, 48, dtype=dtype, seed=1), _randn(5, 48, dtype=dtype, seed=2)
    weight = 0.2 * _randn(48, dtype=dtype, seed=3) + (0.0 if offset else 1.0)
    total, normed = add_rms_norm(x, delta if with_delta else None, weight, 1e-6, offset=offset)
    ref_total = x + delta if with_delta else x
    if offset:
        ref = offset_rms_norm(ref_total, weight, 1e-6)
    else:
        norm = RMSNorm(48, 1e-6).to(device=DEV, dtype=dtype)
        norm.weight.data.copy_(weight)
        ref = norm(ref_total)
    if INTERPRET and dtype == torch.bfloat16:      # the interpreter truncates to bf16
        assert _rel(total, ref_total) <= BF16_TOL
    else:                                            # compiled: the same rounding as torch's add
        assert torch.equal(total, ref_total)
    assert _rel(normed, ref) <= _tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_equals_swiglu_reference(dtype):
    from flashrt_ros.ops.triton.elementwise import silu_mul

    gate_up = _randn(3, 2 * 1100, dtype=dtype, seed=4)      # more than one column block
    gate, up = gate_up.split([1100, 1100], dim=-1)
    assert _rel(silu_mul(gate_up), F.silu(gate) * up) <= _tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_mul_reads_a_strided_gate(dtype):
    from flashrt_ros.ops.triton.elementwise import sigmoid_mul

    proj = _randn(4, 96, dtype=dtype, seed=5)
    x, gate = proj[:, :32].contiguous(), proj[:, 40:72]        # gate: a strided column slice
    assert _rel(sigmoid_mul(x, gate), x * torch.sigmoid(gate)) <= _tol(dtype)


def _cache(s: int, kv: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((s, kv, d), float("nan"), dtype=dtype, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start,t", [(0, 6), (37, 1), (1000, 3)])
def test_hybrid_qk_norm_partial_rope_and_kv_write_equal_reference(dtype, start, t):
    from flashrt_ros.ops.triton.rope_kv import rope_and_write_kv

    heads, kv, d, rot = 4, 2, 16, 8
    proj = _randn(t, 2 * heads * d + 2 * kv * d, dtype=dtype, seed=6)
    q, _, k, v = proj.split([heads * d, heads * d, kv * d, kv * d], dim=-1)
    q, k, v = q.view(t, heads, d), k.view(t, kv, d), v.view(t, kv, d)
    qw, kw = 0.1 * _randn(d, dtype=dtype, seed=7), 0.1 * _randn(d, dtype=dtype, seed=8)
    positions = torch.arange(start, start + t, device=DEV)
    inv_freq = rope_inv_freq(rot, 10_000_000.0).to(DEV)
    k_cache, v_cache = _cache(start + t + 2, kv, d, dtype), _cache(start + t + 2, kv, d, dtype)
    q_out = rope_and_write_kv(q, k, v, k_cache, v_cache, positions, inv_freq, rot, qw, kw, 1e-6)

    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    ref_q = apply_partial_rope(offset_rms_norm(q, qw, 1e-6), cos, sin)
    ref_k = apply_partial_rope(offset_rms_norm(k, kw, 1e-6), cos, sin)
    assert _rel(q_out, ref_q) <= _tol(dtype)
    assert _rel(k_cache[start:start + t], ref_k) <= _tol(dtype)
    assert torch.equal(v_cache[start:start + t], v)
    assert torch.isnan(k_cache[:start]).all() and torch.isnan(k_cache[start + t:]).all()   # nothing else written


@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_full_rope_without_norm_equals_reference(dtype):
    from flashrt_ros.ops.triton.rope_kv import rope_and_write_kv

    t, heads, kv, d = 3, 6, 2, 32
    proj = _randn(t, heads * d + 2 * kv * d, dtype=dtype, seed=9)
    q, k, v = proj.split([heads * d, kv * d, kv * d], dim=-1)
    q, k, v = q.view(t, heads, d), k.view(t, kv, d), v.view(t, kv, d)
    positions = torch.arange(5, 5 + t, device=DEV)
    inv_freq = rope_inv_freq(d, 100000.0).to(DEV)
    k_cache, v_cache = _cache(16, kv, d, dtype), _cache(16, kv, d, dtype)
    q_out = rope_and_write_kv(q, k, v, k_cache, v_cache, positions, inv_freq, d)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    assert _rel(q_out, apply_partial_rope(q, cos, sin)) <= _tol(dtype)
    assert _rel(k_cache[5:5 + t], apply_partial_rope(k, cos, sin)) <= _tol(dtype)
    assert torch.equal(v_cache[5:5 + t], v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(10, 40), (33, 1024), (9, 576), (8, 600)])
def test_gemv_equals_matrix_vector_product(dtype, n, k):
    from flashrt_ros.ops.triton.gemv import gemv

    weight, x = _randn(n, k, dtype=dtype, seed=10) / k ** 0.5, _randn(1, k, dtype=dtype, seed=11)
    out = gemv(x, weight)
    assert out.shape == (1, n) and out.dtype == dtype
    assert _rel(out, x.float() @ weight.float().T) <= _tol(dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GEMV dispatch applies to CUDA tensors")
def test_linear_runs_batch_one_through_gemv_and_other_rows_through_cublas(monkeypatch):
    from flashrt_ros.ops import linear as linear_mod
    from flashrt_ros.ops.triton import gemv as gemv_mod

    layer = linear_mod.Linear(256, 96, bias=False).to("cuda", torch.bfloat16)
    calls = []
    monkeypatch.setattr(gemv_mod, "gemv", lambda x, w: calls.append(x.shape) or F.linear(x, w))
    x = _randn(3, 256, dtype=torch.bfloat16, seed=12)
    layer(x[:1]), layer(x)
    assert calls == [(1, 256)]


def test_kv_write_into_a_layer_view_of_the_shared_cache_touches_only_that_layer():
    from flashrt_ros.ops.triton.rope_kv import rope_and_write_kv

    t, heads, kv, d = 2, 4, 2, 16
    proj = _randn(t, heads * d + 2 * kv * d, dtype=torch.float32, seed=13)
    q, k, v = proj.split([heads * d, kv * d, kv * d], dim=-1)
    shared = torch.full((8, 3, 2, kv, d), float("nan"), device=DEV)       # [S, layers, k/v, KV, D]
    positions = torch.arange(3, 3 + t, device=DEV)
    inv_freq = rope_inv_freq(d, 10000.0).to(DEV)
    rope_and_write_kv(q.view(t, heads, d), k.view(t, kv, d), v.view(t, kv, d), shared[:, 1, 0], shared[:, 1, 1],
                      positions, inv_freq, d)
    cos, sin = rope_cos_sin(positions, inv_freq, torch.float32)
    assert _rel(shared[3:5, 1, 0], apply_partial_rope(k.view(t, kv, d), cos, sin)) <= 1e-5
    assert torch.equal(shared[3:5, 1, 1], v.view(t, kv, d))
    written = torch.zeros(8, 3, 2, dtype=torch.bool, device=DEV)
    written[3:5, 1] = True
    assert torch.isnan(shared[~written]).all()
