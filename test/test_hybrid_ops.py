"""The hybrid decoder's ops agree with their definitions and with transformers' reference code."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextRMSNorm,
    Qwen3NextRMSNormGated,
    torch_recurrent_gated_delta_rule as hf_recurrent,
)

from flashrt_ros.ops import (
    apply_partial_rope,
    causal_conv1d_with_state,
    chunk_gated_delta_rule,
    gated_rms_norm,
    offset_rms_norm,
    recurrent_gated_delta_step,
    rope_cos_sin,
    rope_inv_freq,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)


def _delta_inputs(t: int, heads: int = 3, dk: int = 8, dv: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, heads, dk, generator=gen), torch.randn(t, heads, dk, generator=gen)
    v = torch.randn(t, heads, dv, generator=gen)
    g = -2.0 * torch.rand(t, heads, generator=gen)          # log-decay <= 0
    beta = torch.rand(t, heads, generator=gen)
    state = 0.3 * torch.randn(heads, dk, dv, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("t", [1, 5, 16, 37])
@pytest.mark.parametrize("chunk_size", [4, 16, 64])
def test_chunked_delta_rule_equals_recurrent_from_any_state(t: int, chunk_size: int) -> None:
    q, k, v, g, beta, state = _delta_inputs(t)
    out_c, state_c = torch_chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size)
    out_r, state_r = torch_recurrent_gated_delta_rule(q, k, v, g, beta, state)
    torch.testing.assert_close(out_c, out_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state_c, state_r, rtol=1e-5, atol=1e-5)


def test_recurrent_delta_rule_matches_transformers_reference() -> None:
    q, k, v, g, beta, state = _delta_inputs(9)
    out, new_state = torch_recurrent_gated_delta_rule(q, k, v, g, beta, state)
    ref_out, ref_state = hf_recurrent(q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, ref_out[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new_state, ref_state[0], rtol=1e-5, atol=1e-6)


def test_delta_rule_split_into_two_calls_equals_one_call() -> None:
    q, k, v, g, beta, state = _delta_inputs(30)
    whole, final = torch_chunk_gated_delta_rule(q, k, v, g, beta, state, 8)
    first, mid = torch_chunk_gated_delta_rule(q[:11], k[:11], v[:11], g[:11], beta[:11], state, 8)
    second, end = torch_chunk_gated_delta_rule(q[11:], k[11:], v[11:], g[11:], beta[11:], mid, 8)
    torch.testing.assert_close(torch.cat((first, second)), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(end, final, rtol=1e-5, atol=1e-5)


def test_verify_form_equals_decode_steps_and_keeps_the_state_after_each_token() -> None:
    """``gated_delta_verify`` (speculative verification) = one decode step per token, bit for bit on CPU,
    with every intermediate state kept and the input state left alone."""
    from flashrt_ros.ops.gated_delta import gated_delta_decode, gated_delta_verify

    gen = torch.Generator().manual_seed(3)
    hk, hv, dk, dv, t = 2, 4, 8, 6, 4
    conv_dim = 2 * hk * dk + hv * dv
    proj = torch.randn(t, conv_dim + hv * dv + 2 * hv, generator=gen)
    qkv, z, b, a = proj.split([conv_dim, hv * dv, hv, hv], dim=-1)
    A_log, dt_bias = torch.randn(hv, generator=gen), torch.randn(hv, generator=gen)
    norm_weight = 1.0 + 0.1 * torch.randn(dv, generator=gen)
    state = 0.3 * torch.randn(hv, dk, dv, generator=gen)
    before, states = state.clone(), torch.zeros(t, hv, dk, dv)
    out = gated_delta_verify(qkv, z, b, a, A_log, dt_bias, state, states, norm_weight, 1e-6, hk, dk, dv)
    assert torch.equal(state, before)
    running = before.clone()
    for i in range(t):
        step = gated_delta_decode(qkv[i], z[i], b[i], a[i], A_log, dt_bias, running, norm_weight, 1e-6, hk, dk, dv)
        assert torch.equal(out[i], step), i
        assert torch.equal(states[i], running), i


def test_dispatch_uses_torch_path_on_cpu() -> None:
    q, k, v, g, beta, state = _delta_inputs(6)
    assert torch.equal(chunk_gated_delta_rule(q, k, v, g, beta, state, 4)[0],
                       torch_chunk_gated_delta_rule(q, k, v, g, beta, state, 4)[0])
    assert torch.equal(recurrent_gated_delta_step(q[:1], k[:1], v[:1], g[:1], beta[:1], state)[1],
                       torch_recurrent_gated_delta_rule(q[:1], k[:1], v[:1], g[:1], beta[:1], state)[1])


def test_conv_with_state_in_pieces_equals_zero_padded_causal_conv() -> None:
    gen = torch.Generator().manual_seed(1)
    channels, kernel, t = 5, 4, 13
    x, w = torch.randn(t, channels, generator=gen), torch.randn(channels, kernel, generator=gen)
    ref = F.silu(F.conv1d(x.T[None], w[:, None, :], padding=kernel - 1, groups=channels)[0, :, :t]).T
    state = torch.zeros(channels, kernel - 1)
    pieces = [causal_conv1d_with_state(x[a:b], state, w) for a, b in ((0, 1), (1, 6), (6, 7), (7, 13))]
    torch.testing.assert_close(torch.cat(pieces), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, x[-(kernel - 1):].T)   # the window holds the last K-1 inputs


def test_partial_rope_rotates_only_leading_dims_and_is_relative() -> None:
    head_dim, rot = 16, 8
    inv_freq = rope_inv_freq(rot, 10000.0)
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, head_dim, generator=gen), torch.randn(1, 2, head_dim, generator=gen)

    def at(x: torch.Tensor, pos: int) -> torch.Tensor:
        cos, sin = rope_cos_sin(torch.tensor([pos]), inv_freq, torch.float32)
        return apply_partial_rope(x, cos, sin)

    assert torch.equal(at(q, 7)[..., rot:], q[..., rot:])
    torch.testing.assert_close(at(q, 0), q)
    torch.testing.assert_close(at(q, 7).norm(dim=-1), q.norm(dim=-1))
    # the attention score depends only on the distance between query and key
    s1 = (at(q, 10) * at(k, 3)).sum(-1)
    s2 = (at(q, 107) * at(k, 100)).sum(-1)
    torch.testing.assert_close(s1, s2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_match_transformers_bitwise(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 32, generator=gen).to(dtype)
    gate = torch.randn(4, 32, generator=gen).to(dtype)
    hf_norm = Qwen3NextRMSNorm(32, eps=1e-6).to(dtype)
    hf_gated = Qwen3NextRMSNormGated(32, eps=1e-6).to(dtype)
    with torch.no_grad():
        hf_norm.weight.normal_(0, 0.1, generator=gen)
        hf_gated.weight.normal_(1, 0.1, generator=gen)
        assert torch.equal(offset_rms_norm(x, hf_norm.weight, 1e-6), hf_norm(x))
        assert torch.equal(gated_rms_norm(x, gate, hf_gated.weight, 1e-6), hf_gated(x, gate))
