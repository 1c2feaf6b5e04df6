"""``gemv_fused``: the decode step's norm, product and residual add or SwiGLU gate in one launch.

Two references. The unfused kernels (``ops.triton.norms.add_rms_norm``, ``gemv``, ``elementwise.silu_mul``)
round at the same points and sum each row in the same order, so in triton's interpreter (a CPU machine) the
fused result must equal theirs bit for bit; on a GPU the norm's sum of squares may be reduced in another order
(a one-ulp ``rsqrt`` difference), so there the bound is the bf16 one. And the torch references (``ops.norms``,
``F.linear``, ``ops.gating``) within the dtype's bound, which is what the model's parity rests on.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from triton_interpret import BF16_TOL, INTERPRET, kernel_device, needs_triton

from flashrt_ros.ops.norms import offset_rms_norm, rms_norm

pytestmark = needs_triton
DEV = kernel_device()
DTYPES = [torch.float32, torch.bfloat16]
NORMS = [None, "llama", "offset"]
EPILOGUES = ["store", "residual", "silu_gate"]
#: (output rows N, K): odd sizes (masked tails), SmolLM2's 576 (K padded to 1024 in the norm), a K of 600
#: (128-wide slices, a partial last one)
SHAPES = [(10, 40), (33, 576), (8, 600)]
EPS = 1e-5


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(device=DEV, dtype=dtype)


def _case(dtype: torch.dtype, n: int, k: int, epilogue: str):
    rows = 2 * n if epilogue == "silu_gate" else n
    weight = _randn(rows, k, dtype=dtype, seed=1, scale=k ** -0.5)
    x = _randn(1, k, dtype=dtype, seed=2, scale=3.0)
    norm_weight = _randn(k, dtype=dtype, seed=3, scale=0.2)
    residual = _randn(1, n, dtype=dtype, seed=4)
    return weight, x, norm_weight, residual


def _unfused_kernels(x, weight, norm, norm_weight, epilogue, residual):
    from flashrt_ros.ops.triton.elementwise import silu_mul
    from flashrt_ros.ops.triton.gemv import gemv
    from flashrt_ros.ops.triton.norms import add_rms_norm
    h = x if norm is None else add_rms_norm(x, None, norm_weight, EPS, offset=norm == "offset")[1]
    y = gemv(h, weight)
    if epilogue == "residual":            # the kernel's sum output (its norm is not read)
        return add_rms_norm(residual, y, torch.ones_like(residual[0]), EPS, offset=False)[0]
    return silu_mul(y) if epilogue == "silu_gate" else y


def _torch_reference(x, weight, norm, norm_weight, epilogue, residual):
    h = x if norm is None else (offset_rms_norm if norm == "offset" else rms_norm)(x, norm_weight, EPS)
    y = F.linear(h, weight)
    if epilogue == "residual":
        return residual + y
    if epilogue == "silu_gate":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("n,k", SHAPES)
def test_the_fused_product_is_the_unfused_kernels_and_the_torch_ops(dtype, norm, epilogue, n, k):
    from flashrt_ros.ops.triton.gemv import gemv_fused
    weight, x, norm_weight, residual = _case(dtype, n, k, epilogue)
    out = gemv_fused(x, weight, norm=norm, norm_weight=norm_weight, eps=EPS, epilogue=epilogue,
                     residual=residual)
    assert out.shape == (1, n) and out.dtype == dtype
    unfused = _unfused_kernels(x, weight, norm, norm_weight, epilogue, residual)
    if INTERPRET:
        assert torch.equal(out, unfused), (out.float() - unfused.float()).abs().max()
    else:
        assert _rel(out, unfused) <= (1e-5 if dtype == torch.float32 else BF16_TOL)
    reference = _torch_reference(x, weight, norm, norm_weight, epilogue, residual)
    assert _rel(out, reference) <= (1e-5 if dtype == torch.float32 else BF16_TOL)


def test_the_norms_rounding_is_the_one_asked_for():
    """Power: the Llama norm (cast, then scaled in the model dtype) and the offset norm (``1 + w`` in float32)
    give other bits in bf16, and each equals only its own unfused chain."""
    from flashrt_ros.ops.triton.gemv import gemv_fused
    weight, x, norm_weight, residual = _case(torch.bfloat16, 33, 576, "store")
    llama = gemv_fused(x, weight, norm="llama", norm_weight=norm_weight, eps=EPS)
    offset = gemv_fused(x, weight, norm="offset", norm_weight=norm_weight, eps=EPS)
    assert not torch.equal(llama, offset)
    if INTERPRET:
        assert not torch.equal(llama, _unfused_kernels(x, weight, "offset", norm_weight, "store", residual))


def test_bad_arguments_are_refused():
    from flashrt_ros.ops.triton.gemv import gemv_fused
    weight, x, norm_weight, residual = _case(torch.float32, 10, 40, "store")
    with pytest.raises(ValueError, match="norm one of"):
        gemv_fused(x, weight, norm="layer")
    with pytest.raises(ValueError, match="epilogue one of"):
        gemv_fused(x, weight, epilogue="gelu")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [None, "llama"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,k", [(9, 3, 16, 40), (4, 2, 32, 136)])
def test_the_qkv_product_with_rope_and_kv_write_is_the_two_kernels(dtype, norm, heads, kv_heads, head_dim, k):
    """``gemv_qkv_rope`` against ``gemv_fused`` then ``rope_kv.rope_and_write_kv`` on a shared position-major cache
    (``[S, layers, k/v, KV, D]``, this layer's views): the same queries and cache rows (bits in the interpreter), no
    other row written."""
    from flashrt_ros.ops.rope import rope_inv_freq
    from flashrt_ros.ops.triton.gemv import gemv_fused, gemv_qkv_rope
    from flashrt_ros.ops.triton.rope_kv import rope_and_write_kv
    rows = (heads + 2 * kv_heads) * head_dim
    weight = _randn(rows, k, dtype=dtype, seed=5, scale=k ** -0.5)
    x = _randn(1, k, dtype=dtype, seed=6, scale=3.0)
    norm_weight = _randn(k, dtype=dtype, seed=7, scale=0.2)
    inv_freq = rope_inv_freq(head_dim, 10000.0).to(DEV)
    positions = torch.tensor([37], device=DEV)
    caches = [torch.full((64, 2, 2, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEV) for _ in range(2)]
    q = gemv_qkv_rope(x, weight, caches[0][:, 1, 0], caches[0][:, 1, 1], positions, inv_freq, heads, kv_heads,
                      norm=norm, norm_weight=norm_weight, eps=EPS)
    qkv = gemv_fused(x, weight, norm=norm, norm_weight=norm_weight, eps=EPS)
    qs, ks, vs = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    expected = rope_and_write_kv(qs.view(1, heads, head_dim), ks.view(1, kv_heads, head_dim),
                                 vs.view(1, kv_heads, head_dim), caches[1][:, 1, 0], caches[1][:, 1, 1], positions,
                                 inv_freq, head_dim)
    assert q.shape == (1, heads, head_dim)
    if INTERPRET:
        assert torch.equal(q, expected)
        assert torch.equal(caches[0][37, 1], caches[1][37, 1])
    else:
        assert _rel(q, expected) <= (1e-5 if dtype == torch.float32 else BF16_TOL)
        assert _rel(caches[0][37, 1], caches[1][37, 1]) <= (1e-5 if dtype == torch.float32 else BF16_TOL)
    written = torch.zeros(64, 2, dtype=torch.bool, device=DEV)
    written[37, 1] = True
    assert torch.isnan(caches[0][~written]).all() and not torch.isnan(caches[0][37, 1]).any()
