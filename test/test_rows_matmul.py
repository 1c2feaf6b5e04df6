"""The few-row fused products (``ops.triton.rows_matmul``) and the split-key prefix attention against their torch
references: the interpreter on CPU, the device on a GPU; fresh random data, outputs poisoned first."""
from __future__ import annotations

import pytest
import torch

from triton_interpret import needs_triton

from flashrt_ros.ops import fused_rows, rows_matmul
from flashrt_ros.ops.triton import fast_kernels
from flashrt_ros.ops.triton.scratch import kept_for

pytestmark = needs_triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: float32 on CPU runs the interpreter's exact products; bf16 is checked on a GPU (the interpreter's bf16 dot
#: is wrong, see test_fused_rows.py)
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SMALL = (16, 32, 4, 2)             # (BLOCK_N, BLOCK_K, warps, stages): several programs and K steps at test sizes


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(a.float()).all(), "unwritten or non-finite output"
    err = float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))
    assert err <= TOL[dtype], err


def kernels():
    from flashrt_ros.ops.triton import rows_matmul as k
    return k


def fp8_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n,k,residual,norm", [(51, 48, 96, True, False), (7, 40, 64, False, True),
                                                    (64, 16, 32, True, True)])
def test_rows_matmul_matches_reference(dtype, rows, n, k, residual, norm):
    g = torch.Generator().manual_seed(rows + n)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    res = torch.randn(rows, n, generator=g).to(DEVICE, dtype) if residual else None
    out = kernels().rows_matmul(x, w, residual=res, norm_eps=1e-6 if norm else None, config=SMALL)
    ref = x.float() @ w.float().t()
    if norm:
        ref = ref * fused_rows.rms_scale(x, 1e-6)
    if residual:
        ref = ref + res.float()
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("silu", [False, True])
def test_rows_gelu_gate_matches_reference(dtype, norm, silu):
    """The gated MLP's first product: π0's tanh-GELU gate, or Llama's SiLU gate (SmolVLA's expert)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(51, 64, generator=g).to(DEVICE, dtype)
    w = (torch.randn(2 * 48, 64, generator=g) / 8).to(DEVICE, dtype)
    out = kernels().rows_gelu_gate(x, w, norm_eps=1e-6 if norm else None, config=SMALL, silu=silu)
    gate = fused_rows.silu_gate if silu else fused_rows.gelu_gate
    with fast_kernels(False):
        product = x.float() @ w.float().t()
        ref = gate(product, x=x.float(), eps=1e-6) if norm else gate(product)
    assert out.shape == (51, 48)
    close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,valid", [(4, 1, None), (2, 1, 5), (3, 2, None)])
def test_rows_qkv_rope_matches_reference(dtype, heads, kv_heads, valid):
    """Queries RoPE'd, keys RoPE'd and zero past ``valid``, values copied: into strided destination rows (a static
    KV buffer's slice), every element poisoned first."""
    g = torch.Generator().manual_seed(heads * 7 + kv_heads)
    rows, width, D = 9, 48, 32
    x = torch.randn(rows, width, generator=g).to(DEVICE, dtype)
    w = (torch.randn((heads + 2 * kv_heads) * D, width, generator=g) / 7).to(DEVICE, dtype)
    cos, sin = fused_rows.rope_tables(torch.arange(3, 3 + rows), torch.rand(D // 2, generator=g))
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    v_len = None if valid is None else torch.tensor(valid, device=DEVICE)
    outs = [torch.full((rows, heads, D), float("nan"), device=DEVICE, dtype=dtype)]
    kv = torch.full((2, rows + 4, kv_heads, D), float("nan"), device=DEVICE, dtype=dtype)
    outs += [kv[0, 2:2 + rows], kv[1, 2:2 + rows]]
    kernels().rows_qkv_rope(x, w, cos, sin, heads, kv_heads, *outs, norm_eps=1e-6, valid=v_len, config=SMALL)
    refs = [torch.empty(rows, heads, D, device=DEVICE), torch.empty(rows, kv_heads, D, device=DEVICE),
            torch.empty(rows, kv_heads, D, device=DEVICE)]
    with fast_kernels(False):
        fused_rows.qkv_rope(x.float() @ w.float().t(), cos, sin, heads, kv_heads, *refs, x=x.float(), eps=1e-6,
                            valid=v_len)
    for out, ref in zip(outs, refs):
        close(out, ref, dtype)
    assert torch.isnan(kv[:, :2]).all() and torch.isnan(kv[:, 2 + rows:]).all(), "wrote outside its rows"


def test_float8_weights_with_column_scales():
    """Weight-only FP8: the kernel widens the tile and applies each column's scale (against the dequantized
    product; the quantization error itself is the benchmark's to report)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(51, 64, generator=g).to(DEVICE)
    w8, scale = fp8_weights(torch.randn(40, 64, generator=g).to(DEVICE))
    out = kernels().rows_matmul(x, w8, scale=scale, config=SMALL)
    close(out, x @ (w8.float() * scale[:, None]).t(), torch.float32)
    with pytest.raises(ValueError, match="scales"):
        kernels().rows_matmul(x, w8, config=SMALL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n,k,split,residual", [(51, 48, 96, 3, True), (7, 40, 200, 4, False),
                                                     (64, 16, 64, 2, True)])
def test_split_k_sums_every_slice_once_in_a_fixed_order(dtype, rows, n, k, split, residual):
    """Split-K (``o`` / ``down``'s too-few column tiles): the last program of a column tile adds the slices. Every
    slice counted once (against the reference), the same bits on every call (slice order, not arrival order),
    and the arrival counts back at 0 for the next launch (a graph replays with no reset of its own)."""
    g = torch.Generator().manual_seed(rows + split)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    res = torch.randn(rows, n, generator=g).to(DEVICE, dtype) if residual else None
    config = SMALL + (split,)
    first = kernels().rows_matmul(x, w, residual=res, config=config)
    close(first, x.float() @ w.float().t() + (res.float() if residual else 0), dtype)
    for _ in range(3):
        assert torch.equal(kernels().rows_matmul(x, w, residual=res, config=config), first)
    counts = [arrived for _, arrived in kept_for(w, "split-K")]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)


def test_split_k_refuses_what_needs_the_whole_row():
    """A folded norm needs every column of ``x`` in one program, and the paired epilogues are not split: refused
    by name rather than computed wrong."""
    x, w = torch.randn(5, 64).to(DEVICE), torch.randn(48, 64).to(DEVICE)
    with pytest.raises(ValueError, match="split-K.*with a norm"):
        kernels().rows_matmul(x, w, norm_eps=1e-6, config=SMALL + (2,))
    with pytest.raises(ValueError, match="split-K.*gelu_gate"):
        kernels().rows_gelu_gate(x, w, config=SMALL + (2,))


def test_dispatch_keeps_the_reference_off_the_kernel_path():
    """The CPU path of ``ops.rows_matmul`` is the torch composition the kernels are checked against."""
    g = torch.Generator().manual_seed(6)
    x, w, res = torch.randn(5, 32, generator=g), torch.randn(24, 32, generator=g), torch.randn(5, 24, generator=g)
    torch.testing.assert_close(rows_matmul.matmul_rows(x, w, residual=res), torch.addmm(res, x, w.t()))
    w8, scale = fp8_weights(w)
    torch.testing.assert_close(rows_matmul.matmul_rows(x, w8, scale=scale), x @ (w8.float() * scale[:, None]).t())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [(16, 16, 32, 4, 2), (32, 16, 16, 4, 2),
                                    (16, 16, 32, 4, 2, 1), (32, 16, 16, 4, 2, 1)])
@pytest.mark.parametrize("rows,heads,valid,suffix,state_rows", [(7, 8, 6, 7, 1), (6, 2, 11, 6, 0), (9, 4, 5, 0, 0)])
def test_split_key_prefix_attention_matches_reference(dtype, config, rows, heads, valid, suffix, state_rows):
    """The split-key form (slices of the prefix + suffix key index, merged by a second kernel, or with ``MERGE`` by
    the last program of each row tile) against SDPA under the explicit mask; slices wholly inside the prefix's
    padding (garbage rows) must contribute nothing. The merged form gives the second kernel's bits (the same sum
    in slice order) on every call, and leaves its arrival counts at 0 for the next launch."""
    from flashrt_ros.ops import prefix_attention as attention
    from flashrt_ros.ops.triton.prefix_attention import prefix_attention as kernel
    g = torch.Generator().manual_seed(rows + heads + suffix)
    prefix, D = 64, 32
    q = torch.randn(rows, heads, D, generator=g).to(DEVICE, dtype)
    kv = torch.randn(2, prefix + suffix, 1, D, generator=g).to(DEVICE, dtype)
    kv[:, valid:prefix] = float("nan")                  # padding rows: never read into the result
    v = torch.tensor(valid, device=DEVICE)
    with fast_kernels(False):
        ref = attention.prefix_attention(q.float(), kv[0].float().nan_to_num(), kv[1].float().nan_to_num(), v,
                                         suffix_start=prefix, suffix_len=suffix, state_rows=state_rows)
    out = kernel(q, kv[0], kv[1], v, prefix, suffix, state_rows, config=config)
    close(out, ref, dtype)
    if len(config) == 6:
        two_kernels = kernel(q, kv[0], kv[1], v, prefix, suffix, state_rows, config=config[:5])
        assert torch.equal(out, two_kernels)
        assert torch.equal(kernel(q, kv[0], kv[1], v, prefix, suffix, state_rows, config=config), out)
        counts = kept_for(kv[0], "merged attention")
        assert counts and all(int(c.abs().sum()) == 0 for c in counts)
