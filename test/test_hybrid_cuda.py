"""On a GPU with flash-linear-attention: the fla path agrees with the torch reference and captures.

These tests need CUDA and the ``fla`` package; on a CPU-only machine there is no
such path to test, so they are skipped there (the CPU reference path is covered
by test_hybrid_ops / test_hybrid_state / test_hybrid_parity).
"""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.models.hybrid import HybridCausalLM, random_hybrid_config
from flashrt_ros.ops import (
    chunk_gated_delta_rule,
    fla_available,
    recurrent_gated_delta_step,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)
from flashrt_ros.runtime.arena import StateArena, core_meta_specs

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and fla_available()),
                                reason="needs CUDA and flash-linear-attention")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _inputs(t: int, heads: int = 16, dk: int = 128, dv: int = 128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, heads, dk, device="cuda", generator=gen)
    k = torch.randn(t, heads, dk, device="cuda", generator=gen)
    v = torch.randn(t, heads, dv, device="cuda", generator=gen)
    g = -2.0 * torch.rand(t, heads, device="cuda", generator=gen)
    beta = torch.rand(t, heads, device="cuda", generator=gen)
    state = 0.3 * torch.randn(heads, dk, dv, device="cuda", generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("t", [1, 100, 1000])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_fla_chunk_matches_torch_reference(t: int, chunk_size: int) -> None:
    args = _inputs(t)
    out, state = chunk_gated_delta_rule(*args, chunk_size=chunk_size)
    ref_out, ref_state = torch_chunk_gated_delta_rule(*args, chunk_size=chunk_size)
    assert _rel(out, ref_out) <= 5e-3 and _rel(state, ref_state) <= 5e-3


def test_fla_recurrent_step_matches_torch_reference() -> None:
    args = _inputs(1)
    out, state = recurrent_gated_delta_step(*args)
    ref_out, ref_state = torch_recurrent_gated_delta_rule(*args)
    assert _rel(out, ref_out) <= 5e-3 and _rel(state, ref_state) <= 5e-3


def _model_and_arena(device: str) -> tuple[HybridCausalLM, StateArena]:
    torch.manual_seed(0)
    model = HybridCausalLM(random_hybrid_config(gdn_chunk_size=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 1 else 0.08)
    model = model.to(device)
    return model, StateArena(core_meta_specs() + model.state_specs(256), device=device)


@torch.no_grad()
def test_model_on_cuda_with_fla_matches_cpu_reference() -> None:
    ids = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(1))
    outs = {}
    for device in ("cpu", "cuda"):
        model, arena = _model_and_arena(device)
        logits = [model(ids.to(device), torch.arange(80, device=device), arena)]
        for step in range(8):
            logits.append(model(ids[step:step + 1].to(device), torch.tensor([80 + step], device=device), arena))
        outs[device] = torch.cat(logits).cpu()
    assert _rel(outs["cuda"], outs["cpu"]) <= 5e-3


@torch.no_grad()
def test_decode_step_captured_in_cuda_graph_replays_like_eager() -> None:
    model, arena = _model_and_arena("cuda")
    ids = torch.randint(0, 256, (64,), device="cuda")
    model(ids, torch.arange(64, device="cuda"), arena)
    token, position = torch.zeros(1, dtype=torch.long, device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    saved = arena.block.clone()
    with torch.cuda.stream(side):                       # warm up (kernel autotuning) off the capture
        for _ in range(2):
            token.fill_(3), position.fill_(64)
            model(token, position, arena)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model(token, position, arena)
    expected = []
    arena.block.copy_(saved)
    for step, t in enumerate((5, 17, 99)):              # eager reference
        expected.append(model(torch.tensor([t], device="cuda"), torch.tensor([64 + step], device="cuda"), arena))
    arena.block.copy_(saved)                             # restore in place: the graph's addresses stay valid
    for step, t in enumerate((5, 17, 99)):
        token.fill_(t), position.fill_(64 + step)
        graph.replay()
        assert torch.equal(logits, expected[step]), f"replay step {step}"
