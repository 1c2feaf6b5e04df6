"""The row fusions of the VLA ``fast`` numerics: each triton kernel (the interpreter on CPU, the device on a GPU)
against its torch reference in ``flashrt_ros.ops.fused_rows``, on fresh random data, every output element
poisoned first so an unwritten element fails."""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.ops import fused_rows
from flashrt_ros.ops.triton import fast_kernels, triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not importable")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(a.float()).all()
    err = float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))
    assert err <= TOL[dtype], err


def triton_path() -> object:
    """On CPU the dispatchers take the torch path; force the kernels by calling them directly."""
    from flashrt_ros.ops.triton import fused_rows as kernels
    return kernels


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,folded,valid", [(8, 1, 32, True, 5), (3, 1, 16, False, None),
                                                                  (4, 2, 8, True, None), (6, 3, 16, True, 4),
                                                                  (5, 0, 16, True, None)])
def test_qkv_rope_matches_reference(dtype, heads, kv_heads, head_dim, folded, valid):
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    L, W = 7, 24
    qkv = torch.randn(L, (heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    x = torch.randn(L, W, generator=g).mul(3).to(DEVICE, dtype) if folded else None
    pos = torch.arange(L, device=DEVICE) + 11
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=DEVICE).float() / head_dim))
    cos, sin = fused_rows.rope_tables(pos, inv)
    v = torch.tensor(valid, device=DEVICE) if valid is not None else None
    outs = {}
    for name, fn in (("ref", None), ("kernel", triton_path().qkv_rope)):
        q = torch.full((L, heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
        kv = torch.full((L + 3, 2, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
        k, vv = kv[2:2 + L, 0], kv[2:2 + L, 1]                     # strided rows of a bigger buffer
        if fn is None:
            with fast_kernels(False):
                fused_rows.qkv_rope(qkv, cos, sin, heads, kv_heads, q, k, vv, x=x, eps=1e-6, valid=v)
        else:
            fn(qkv, cos, sin, heads, kv_heads, q, k, vv, x, 1e-6, v)
        outs[name] = (q, k.clone(), vv.clone(), kv)
    for a, b in zip(outs["kernel"][:3], outs["ref"][:3]):
        close(a, b, dtype)
    assert torch.isnan(outs["kernel"][3][:2]).all()                # rows outside the view untouched
    if valid is not None:
        assert (outs["kernel"][1][valid:] == 0).all() and (outs["kernel"][2][valid:] == 0).all()


def test_qkv_rope_without_key_heads_ropes_the_queries_only():
    """``kv_heads=0`` (SmolVLA's cross-attention layers project their keys from the prefix): the queries alone."""
    g = torch.Generator().manual_seed(3)
    q_only = torch.randn(5, 4 * 8, generator=g)
    full = torch.cat([q_only, torch.randn(5, 2 * 8, generator=g)], dim=1)
    cos, sin = fused_rows.rope_tables(torch.arange(5), torch.rand(4))
    q, q_ref = torch.empty(5, 4, 8), torch.empty(5, 4, 8)
    kv = torch.empty(5, 1, 8)
    fused_rows.qkv_rope(q_only, cos, sin, 4, 0, q, q[:, :0], q[:, :0])
    fused_rows.qkv_rope(full, cos, sin, 4, 1, q_ref, kv, kv.clone())
    assert torch.equal(q, q_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("folded", [True, False])
def test_gelu_gate_matches_reference(dtype, folded):
    g = torch.Generator().manual_seed(5)
    gu = torch.randn(6, 2 * 40, generator=g).to(DEVICE, dtype)
    x = torch.randn(6, 20, generator=g).to(DEVICE, dtype) if folded else None
    with fast_kernels(False):
        ref = fused_rows.gelu_gate(gu, x=x, eps=1e-6)
    close(triton_path().gelu_gate(gu, x, 1e-6), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("folded", [True, False])
def test_silu_gate_matches_reference(dtype, folded):
    g = torch.Generator().manual_seed(6)
    gu = torch.randn(6, 2 * 40, generator=g).mul(4).to(DEVICE, dtype)
    x = torch.randn(6, 20, generator=g).to(DEVICE, dtype) if folded else None
    with fast_kernels(False):
        ref = fused_rows.silu_gate(gu, x=x, eps=1e-6)
    close(triton_path().gated_activation(gu, x, 1e-6, True), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("update,gate,shift", [(True, True, True), (True, False, False), (False, False, True)])
def test_residual_norm_matches_reference(dtype, update, gate, shift):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 48, generator=g).to(DEVICE, dtype)
    u = torch.randn(5, 48, generator=g).to(DEVICE, dtype) if update else None
    vec = [torch.randn(48, generator=g).to(DEVICE) for _ in range(3)]
    args = (x, u, vec[0] if gate else None, vec[1], vec[2] if shift else None, 1e-6)
    with fast_kernels(False):
        ref = fused_rows.residual_norm(*args)
    for a, b in zip(triton_path().residual_norm(*args), ref):
        close(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("update,bias", [(True, True), (True, False), (False, False)])
def test_residual_layer_norm_matches_reference(dtype, update, bias):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 5, 36, generator=g).to(DEVICE, dtype)
    u = torch.randn(2, 5, 36, generator=g).to(DEVICE, dtype) if update else None
    b = torch.randn(36, generator=g).to(DEVICE, dtype) if bias else None
    w, lb = torch.randn(36, generator=g).to(DEVICE, dtype), torch.randn(36, generator=g).to(DEVICE, dtype)
    with fast_kernels(False):
        ref = fused_rows.residual_layer_norm(x, u, b, w, lb, 1e-6)
    for a, r in zip(triton_path().residual_layer_norm(x, u, b, w, lb, 1e-6), ref):
        close(a, r, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,heads,valid,suffix,state_rows", [(9, 4, 5, 0, 0), (7, 8, 6, 7, 1), (6, 2, 11, 6, 0),
                                                                 (700, 4, 40, 0, 0)])
def test_prefix_attention_matches_reference(dtype, rows, heads, valid, suffix, state_rows):
    """The kernel (interpreter on CPU) against SDPA under the explicit mask: the prefix's valid keys, then the
    suffix rows with π0's state-token rule; keys past ``valid`` in the prefix hold garbage that must be skipped."""
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("triton 3.6's interpreter computes bf16 tl.dot wrongly (a 16x16 product off by 3e10, seen "
                    "2026-12-06); the bf16 case runs on a GPU")
    from flashrt_ros.ops import prefix_attention as attention
    from flashrt_ros.ops.triton.prefix_attention import prefix_attention as kernel
    g = torch.Generator().manual_seed(rows + heads)
    prefix = 48 if rows < 100 else 64
    n_keys = prefix + suffix
    D = 32
    q = torch.randn(rows, heads, D, generator=g).to(DEVICE, dtype)
    kv = torch.randn(2, n_keys, 1, D, generator=g).to(DEVICE, dtype)
    kv[:, valid:prefix] = 1e4                                        # padding rows: never seen
    v = torch.tensor(valid, device=DEVICE)
    args = (q, kv[0], kv[1], v)
    with fast_kernels(False):
        ref = attention.prefix_attention(*args, suffix_start=prefix, suffix_len=suffix, state_rows=state_rows)
    out = kernel(*args, prefix, suffix, state_rows)
    close(out, ref, dtype)
    seen = attention.visible_keys(rows, n_keys, v, prefix, suffix, state_rows)
    assert seen[:, valid:prefix].sum() == 0 and seen[:, :valid].all()
    if suffix and state_rows:
        assert not seen[0, prefix + 1:].any() and seen[1:, prefix:].all()
