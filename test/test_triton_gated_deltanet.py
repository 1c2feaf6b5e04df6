"""The Gated DeltaNet kernels (conv window, fused decode step, prefill gated norm) equal the torch references.

On a CPU machine they run in triton's interpreter (conftest sets TRITON_INTERPRET=1)
at the unit-test model's shapes; on a GPU machine the same tests run the compiled
kernels, plus the real model shapes and a CUDA-graph capture.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from triton_interpret import BF16_TOL, INTERPRET, kernel_device, needs_triton

from flashrt_ros.ops.causal_conv import causal_conv1d_with_state
from flashrt_ros.ops.gated_delta import gdn_gates, torch_recurrent_gated_delta_rule
from flashrt_ros.ops.norms import gated_rms_norm
from flashrt_ros.ops.triton import fast_kernels

pytestmark = needs_triton
DEV = kernel_device()
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="real shapes and graphs need a CUDA GPU")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _ref_conv(*args, **kwargs) -> torch.Tensor:
    with fast_kernels(False):                   # on CUDA the reference would dispatch to the kernel
        return causal_conv1d_with_state(*args, **kwargs)


def _ref_norm(*args) -> torch.Tensor:
    with fast_kernels(False):
        return gated_rms_norm(*args)


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(device=DEV, dtype=dtype)


# ---- causal conv window -------------------------------------------------------------------------------


def _conv_inputs(t: int, channels: int, kernel: int, dtype: torch.dtype, seed: int):
    wide = _randn(t, channels + 24, dtype=dtype, seed=seed)
    x = wide[:, 8:8 + channels]                                  # a column slice: row stride > C
    state = _randn(channels, kernel - 1, dtype=dtype, seed=seed + 1)
    weight = _randn(channels, kernel, dtype=dtype, seed=seed + 2, scale=0.5)
    bias = _randn(channels, dtype=dtype, seed=seed + 3, scale=0.1)
    return x, state, weight, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("t", [1, 2, 3, 7, 40, 70])
def test_conv_update_matches_reference_output_and_state_window(t, with_bias, dtype):
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update

    x, state, weight, bias = _conv_inputs(t, 128, 4, dtype, seed=10 + t)
    ref_state = state.clone()
    ref = _ref_conv(x, ref_state, weight, bias if with_bias else None)
    out = causal_conv1d_update(x, state, weight, bias if with_bias else None)
    assert out.shape == (t, 128) and out.dtype == dtype and out.is_contiguous()
    assert _rel(out, ref) <= (1e-5 if dtype == torch.float32 else BF16_TOL)
    assert torch.equal(state, ref_state)                         # the window is a copy of inputs


@pytest.mark.parametrize("kernel", [2, 3, 4])
@pytest.mark.parametrize("t", [1, 2, 20])
def test_conv_update_supports_kernel_sizes_two_to_four_without_silu(kernel, t):
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update

    x, state, weight, _ = _conv_inputs(t, 72, kernel, torch.float32, seed=30 + kernel)
    ref_state = state.clone()
    ref = _ref_conv(x, ref_state, weight, silu=False)
    assert _rel(causal_conv1d_update(x, state, weight, silu=False), ref) <= 1e-5
    assert torch.equal(state, ref_state)


def test_conv_update_chained_calls_equal_one_call_over_the_concatenation():
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update

    x, state, weight, bias = _conv_inputs(8, 128, 4, torch.float32, seed=40)
    whole_state = state.clone()
    whole = causal_conv1d_update(x, whole_state, weight, bias)
    parts = [causal_conv1d_update(x[:5], state, weight, bias)]
    parts += [causal_conv1d_update(x[i:i + 1], state, weight, bias) for i in range(5, 8)]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-6, atol=1e-6)
    assert torch.equal(state, whole_state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [2, 20, 40])
def test_conv_sections_are_contiguous_column_blocks_of_the_whole_result(t, dtype):
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update

    x, state, weight, _ = _conv_inputs(t, 200, 4, dtype, seed=50 + t)   # blocks straddle channel tiles
    ref_state = state.clone()
    ref = _ref_conv(x, ref_state, weight)
    sections = (48, 48, 104)
    parts = causal_conv1d_update(x, state, weight, sections=sections)
    assert [p.shape for p in parts] == [(t, w) for w in sections] and all(p.is_contiguous() for p in parts)
    for part, want in zip(parts, ref.split(list(sections), dim=-1)):
        assert _rel(part, want) <= (1e-5 if dtype == torch.float32 else BF16_TOL)
    assert torch.equal(state, ref_state)


# ---- gates ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, heads", [(1, 4), (7, 16), (70, 6)])
def test_gates_match_reference_on_row_views_of_a_projection(t, heads, dtype):
    from flashrt_ros.ops.triton.gated_deltanet import gdn_gates as fused

    proj = _randn(t, 3 * heads + 5, dtype=dtype, seed=60 + t, scale=8.0)   # large |a|: softplus threshold
    b, a = proj[:, 5:5 + heads], proj[:, 5 + heads:5 + 2 * heads]
    A_log = _randn(heads, seed=61, scale=0.5).to(dtype)
    dt_bias = _randn(heads, seed=62).to(dtype)
    with fast_kernels(False):
        ref_g, ref_beta = gdn_gates(a, b, A_log, dt_bias)
    g, beta = fused(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype and g.is_contiguous() and beta.is_contiguous()
    assert _rel(g, ref_g) <= 1e-5
    assert _rel(beta, ref_beta) <= (1e-6 if dtype == torch.float32 else BF16_TOL)


# ---- fused decode step --------------------------------------------------------------------------------


def _decode_inputs(hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * dk + hv * dv
    a_log = torch.log(torch.empty(hv).uniform_(1.0, 16.0, generator=gen))

    def put(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=DEV, dtype=dtype)

    proj = torch.randn(conv_dim + hv * dv + 2 * hv, generator=gen)       # one in-projection row, split
    qkv, z, b, a = proj.split([conv_dim, hv * dv, hv, hv])
    return dict(qkv=put(F.silu(qkv)), z=put(z), b=put(b), a=put(2.0 * a), A_log=put(a_log),
                dt_bias=put(torch.randn(hv, generator=gen)),
                state=(0.1 * torch.randn(hv, dk, dv, generator=gen)).to(DEV),
                norm_weight=put(1.0 + 0.1 * torch.randn(dv, generator=gen)),
                eps=EPS, num_k_heads=hk, head_k_dim=dk, head_v_dim=dv)


def _reference_decode(qkv, z, b, a, A_log, dt_bias, state, norm_weight, eps, num_k_heads, head_k_dim,
                      head_v_dim) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's t == 1 path: split, repeat key heads, gates, recurrent rule, cast, gated norm."""
    hv, key_dim = state.shape[0], num_k_heads * head_k_dim
    q, k, v = qkv.split([key_dim, key_dim, hv * head_v_dim])
    q, k = (x.reshape(1, num_k_heads, head_k_dim).repeat_interleave(hv // num_k_heads, dim=1) for x in (q, k))
    beta = b.reshape(1, hv).sigmoid()
    g = -A_log.float().exp() * F.softplus(a.reshape(1, hv).float() + dt_bias.float())
    out, new_state = torch_recurrent_gated_delta_rule(q, k, v.reshape(1, hv, head_v_dim), g, beta, state)
    out = _ref_norm(out.to(qkv.dtype), z.reshape(1, hv, head_v_dim), norm_weight, eps)
    return out[0], new_state


def _decode_tols(dtype: torch.dtype) -> tuple[float, float]:
    """(out, state) bounds. bf16: beta is rounded to bf16, which the interpreter truncates (1 ulp more)."""
    if dtype == torch.float32:
        return 1e-4, 1e-4
    return BF16_TOL, 1e-2 if INTERPRET else 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (2, 2, 16, 16), (1, 3, 12, 20)],
                         ids=["gqa", "equal_heads", "odd_dims_masked"])
def test_decode_step_matches_reference_token_and_updates_state_in_place(heads, dtype):
    from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step

    inputs = _decode_inputs(*heads, dtype, seed=50)
    ref_out, ref_state = _reference_decode(**{**inputs, "state": inputs["state"].clone()})
    state = inputs["state"]
    out = gated_delta_decode_step(**inputs)
    out_tol, state_tol = _decode_tols(dtype)
    assert out.shape == (heads[1], heads[3]) and out.dtype == dtype
    assert state is inputs["state"] and state.dtype == torch.float32
    assert _rel(out, ref_out) <= out_tol
    assert _rel(state, ref_state) <= state_tol
    assert _rel(state, _decode_inputs(*heads, dtype, seed=50)["state"]) > 1e-2   # it did change


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_steps_in_a_row_keep_matching_with_the_state_carried_in_place(dtype):
    from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step

    state = _decode_inputs(2, 4, 16, 16, dtype, seed=60)["state"]
    ref_state = state.clone()
    out_tol, state_tol = _decode_tols(dtype)
    for step in range(3):
        inputs = {**_decode_inputs(2, 4, 16, 16, dtype, seed=61 + step), "state": state}
        ref_out, ref_state = _reference_decode(**{**inputs, "state": ref_state})
        assert _rel(gated_delta_decode_step(**inputs), ref_out) <= out_tol, step
        assert _rel(state, ref_state) <= state_tol, step


def _verify_inputs(t: int, hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, seed: int) -> dict:
    """``t`` tokens as rows of one in-projection output (row views, as the layer passes them)."""
    rows = [_decode_inputs(hk, hv, dk, dv, dtype, seed + i) for i in range(t)]
    first = rows[0]
    proj = torch.stack([torch.cat([r["qkv"], r["z"], r["b"], r["a"]]) for r in rows])     # [T, width]
    conv_dim = first["qkv"].numel()
    qkv, z, b, a = proj.split([conv_dim, hv * dv, hv, hv], dim=-1)
    return dict(first, qkv=qkv.contiguous(), z=z, b=b, a=a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 5])
def test_verify_steps_equal_decode_steps_in_a_row_and_keep_every_state(t, dtype):
    """The T-token verify kernel = T decode steps: same outputs, ``states[i]`` = state after token i,
    and the input state untouched (verification may be rejected)."""
    from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step, gated_delta_verify_steps

    inputs = _verify_inputs(t, 2, 4, 16, 16, dtype, seed=80)
    state = inputs["state"]
    before = state.clone()
    states = torch.full((t + 1, *state.shape), float("nan"), device=DEV)
    out = gated_delta_verify_steps(**{**inputs, "states_out": states})
    assert torch.equal(state, before)
    assert torch.isnan(states[t]).all()               # only the first T slots are written
    running = before.clone()
    out_tol, state_tol = _decode_tols(dtype)
    for i in range(t):
        row = {**inputs, "qkv": inputs["qkv"][i], "z": inputs["z"][i], "b": inputs["b"][i], "a": inputs["a"][i],
               "state": running}
        expected = gated_delta_decode_step(**row)        # updates ``running`` in place
        assert _rel(out[i], expected) <= out_tol, i
        assert _rel(states[i], running) <= state_tol, i
        ref_out, _ = _reference_decode(**{**row, "state": states[i - 1] if i else before})
        assert _rel(out[i], ref_out) <= out_tol, i


# ---- prefill gated norm -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32)])
def test_gated_rms_norm_rows_matches_reference_on_strided_views(dtype, weight_dtype):
    from flashrt_ros.ops.triton.gated_deltanet import gated_rms_norm_rows

    t, hv, dv = 5, 4, 16
    x = _randn(t, hv * dv + 20, dtype=dtype, seed=70)[:, 4:4 + hv * dv].reshape(t, hv, dv)  # row-sliced
    gate = _randn(hv, t, dv, dtype=dtype, seed=71).transpose(0, 1)                         # heads outer
    weight = 1.0 + _randn(dv, dtype=weight_dtype, seed=72, scale=0.1)
    assert not x.is_contiguous() and not gate.is_contiguous()
    out = gated_rms_norm_rows(x, gate, weight, EPS)
    assert out.shape == (t, hv, dv) and out.dtype == dtype and out.is_contiguous()
    assert _rel(out, _ref_norm(x, gate, weight, EPS)) <= (1e-5 if dtype == torch.float32 else BF16_TOL)


# ---- CUDA only: real shapes and graph capture -------------------------------------------------------


@cuda_only
@pytest.mark.parametrize("hk,hv", [(16, 16), (16, 32)], ids=["16x16", "gqa_16x32"])
def test_real_shape_decode_step_matches_reference_in_bf16(hk, hv):
    from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step

    inputs = _decode_inputs(hk, hv, 128, 128, torch.bfloat16, seed=80)
    ref_out, ref_state = _reference_decode(**{**inputs, "state": inputs["state"].clone()})
    out = gated_delta_decode_step(**inputs)
    assert _rel(out, ref_out) <= BF16_TOL
    assert _rel(inputs["state"], ref_state) <= 1e-3
    # same rounding points as the reference: only float32 summation order can flip a bf16 rounding
    assert (out == ref_out).float().mean().item() >= 0.9


@cuda_only
@pytest.mark.parametrize("t", [1, 100])
def test_real_shape_conv_update_matches_reference_in_bf16(t):
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update

    x, state, weight, _ = _conv_inputs(t, 6144, 4, torch.bfloat16, seed=90)
    ref_state = state.clone()
    ref = _ref_conv(x, ref_state, weight)
    assert _rel(causal_conv1d_update(x, state, weight), ref) <= BF16_TOL
    assert torch.equal(state, ref_state)


@cuda_only
def test_real_shape_gated_rms_norm_rows_matches_reference_in_bf16():
    from flashrt_ros.ops.triton.gated_deltanet import gated_rms_norm_rows

    x = _randn(37, 32 * 128 + 64, dtype=torch.bfloat16, seed=95)[:, :32 * 128].reshape(37, 32, 128)
    gate = _randn(37, 32, 128, dtype=torch.bfloat16, seed=96)
    weight = 1.0 + _randn(128, dtype=torch.bfloat16, seed=97, scale=0.1)
    assert _rel(gated_rms_norm_rows(x, gate, weight, EPS), _ref_norm(x, gate, weight, EPS)) <= BF16_TOL


@cuda_only
@pytest.mark.parametrize("t", [2, 5])
def test_real_shape_verify_steps_match_decode_steps_in_bf16_and_replay_in_a_graph(t):
    from flashrt_ros.ops.triton.gated_deltanet import gated_delta_decode_step, gated_delta_verify_steps

    inputs = _verify_inputs(t, 16, 32, 128, 128, torch.bfloat16, seed=110)
    states = torch.zeros((t, *inputs["state"].shape), device=DEV)
    out = gated_delta_verify_steps(**{**inputs, "states_out": states})
    running = inputs["state"].clone()
    for i in range(t):
        row = {**inputs, "qkv": inputs["qkv"][i], "z": inputs["z"][i], "b": inputs["b"][i], "a": inputs["a"][i],
               "state": running}
        assert _rel(out[i], gated_delta_decode_step(**row)) <= BF16_TOL, i
        assert _rel(states[i], running) <= 1e-5, i
    replayed = torch.zeros_like(states)
    graph = torch.cuda.CUDAGraph()
    gated_delta_verify_steps(**{**inputs, "states_out": replayed})       # compile before capture
    with torch.cuda.graph(graph):
        captured = gated_delta_verify_steps(**{**inputs, "states_out": replayed})
    replayed.zero_()
    graph.replay()
    assert torch.equal(captured, out) and torch.equal(replayed, states)


@cuda_only
def test_conv_and_decode_step_replay_in_a_cuda_graph_like_eager():
    from flashrt_ros.ops.triton.gated_deltanet import causal_conv1d_update, gated_delta_decode_step

    hk, hv, dk, dv = 16, 32, 128, 128
    conv_dim = 2 * hk * dk + hv * dv
    inputs = _decode_inputs(hk, hv, dk, dv, torch.bfloat16, seed=100)
    _, conv_state, conv_weight, _ = _conv_inputs(1, conv_dim, 4, torch.bfloat16, seed=101)
    tokens = [_randn(1, conv_dim, dtype=torch.bfloat16, seed=102 + i) for i in range(2)]
    start = (conv_state.clone(), inputs["state"].clone())
    static_x = tokens[0].clone()

    def step() -> torch.Tensor:
        qkv = causal_conv1d_update(static_x, conv_state, conv_weight)
        return gated_delta_decode_step(**{**inputs, "qkv": qkv})

    def reset() -> None:
        conv_state.copy_(start[0])
        inputs["state"].copy_(start[1])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                            # compile and warm up off the capture stream
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    reset()
    replayed = []
    for token in tokens:
        static_x.copy_(token)
        graph.replay()
        replayed.append(static_out.clone())
    graph_states = (conv_state.clone(), inputs["state"].clone())

    reset()
    eager = []
    for token in tokens:
        static_x.copy_(token)
        eager.append(step())
    torch.cuda.synchronize()
    for got, want in zip(replayed, eager):
        assert torch.equal(got, want)
    assert torch.equal(graph_states[0], conv_state) and torch.equal(graph_states[1], inputs["state"])
    assert not torch.equal(graph_states[1], start[1])      # the replays did advance the recurrent state
