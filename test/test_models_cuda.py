"""On CUDA, both decoders with the triton kernels compute what the torch reference computes.

Each test runs a prefill and a few decode steps through ``model.forward`` with
the fast kernels (``ops.triton``) and through the torch reference (on the CPU
in float32, or on the GPU with ``fast_kernels(False)``), and compares logits.
Skipped without a CUDA device and triton.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.models import SMOLLM2_CONFIG, seeded_weights_
from flashrt_ros.models.hybrid import HybridCausalLM, bench_0p8b_config
from flashrt_ros.models.hybrid.config import full_attention_every
from flashrt_ros.models.llama import Llama
from flashrt_ros.models.registry import load_model
from flashrt_ros.ops.triton import fast_kernels, triton_available
from flashrt_ros.runtime.arena import StateArena, core_meta_specs

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()),
                                reason="needs a CUDA device and triton")

PREFILL, DECODE = 80, 8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@torch.no_grad()
def _run(model, device: str, ids: torch.Tensor, chunks: tuple[int, ...] = (PREFILL,)) -> torch.Tensor:
    """Logits of a chunked prefill (last token of each chunk) and of DECODE single-token steps."""
    arena = StateArena(core_meta_specs() + model.state_specs(PREFILL + DECODE + 8), device=device)
    ids, out, pos = ids.to(device), [], 0
    for n in chunks:
        out.append(model(ids[pos:pos + n], torch.arange(pos, pos + n, device=device), arena, last_only=True))
        pos += n
    for step in range(DECODE):
        token = ids[step:step + 1]
        out.append(model(token, torch.tensor([pos + step], device=device), arena))
    return torch.cat(out).float().cpu()


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (PREFILL,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("source", ["random-llama-tiny", "random-hybrid-tiny"])
def test_tiny_models_with_kernels_match_cpu_reference_in_float32(source):
    ids = _ids(256)
    cpu = _run(load_model(source, device="cpu", seed=0)[0], "cpu", ids, chunks=(64, 16))
    cuda = _run(load_model(source, device="cuda", seed=0)[0], "cuda", ids, chunks=(64, 16))
    assert _rel(cuda, cpu) <= 5e-3


def _bench_shaped(kind: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Four layers of the benchmark shapes (head dim 256 / GDN 128x128; SmolLM2's 9:3 GQA), small vocab."""
    if kind == "hybrid":
        model = HybridCausalLM(bench_0p8b_config(num_hidden_layers=4, layer_types=full_attention_every(4, 4),
                                                 vocab_size=4096))
    else:
        model = Llama(replace(SMOLLM2_CONFIG, n_layers=4, vocab_size=4096))
    seeded_weights_(model, 0)
    model = model.to(device, dtype).eval().requires_grad_(False)
    if kind == "llama":
        model.rope.reset()          # RoPE frequencies stay float32
    return model


@pytest.mark.parametrize("kind", ["hybrid", "llama"])
def test_bench_shaped_bf16_kernels_match_torch_path_on_gpu(kind):
    model = _bench_shaped(kind, "cuda", torch.bfloat16)
    ids = _ids(4096)
    fast = _run(model, "cuda", ids, chunks=(64, 8, 4, 2, 1, 1))
    with fast_kernels(False):
        slow = _run(model, "cuda", ids, chunks=(64, 8, 4, 2, 1, 1))
    reference = _run(_bench_shaped(kind, "cpu", torch.float32), "cpu", ids, chunks=(64, 8, 4, 2, 1, 1))   # float32, CPU
    assert torch.isfinite(fast).all()
    assert _rel(fast, reference) <= 3e-2          # bf16 weights and activations vs float32
    assert _rel(fast, slow) <= 3e-2               # the two bf16 paths round at different points


@pytest.mark.parametrize("source", ["random-llama-tiny", "random-hybrid-tiny"])
def test_a_decode_step_runs_each_product_with_its_norm_or_add_in_one_launch(source, monkeypatch):
    """One row on CUDA: every product of a layer but an MoE's is one launch with its norm or add (a Llama layer's
    q / k / v with RoPE and the KV write in ``gemv_qkv_rope``, its other three in ``gemv_fused``; the hybrid's mixer
    in / out and dense gate-up / down in ``gemv_fused``; the head with the final norm), and the logits equal the
    unfused ops' within the bf16 band (the norm's sum of squares may be reduced in another order)."""
    from flashrt_ros.ops.linear import fused_decode
    from flashrt_ros.ops.triton import gemv as gemv_module
    model = load_model(source, device="cuda", dtype=torch.bfloat16, seed=0)[0]
    calls = []
    for name in ("gemv_fused", "gemv_qkv_rope"):
        real = getattr(gemv_module, name)
        monkeypatch.setattr(gemv_module, name, lambda *a, real=real, **k: calls.append(real.__name__) or real(*a, **k))
    ids = _ids(256)
    fused = _run(model, "cuda", ids)
    with fused_decode(False):
        unfused = _run(model, "cuda", ids)
    n = len(model.layers)
    if isinstance(model, Llama):
        per_step = {"gemv_fused": 3 * n + 1, "gemv_qkv_rope": n}
    else:
        per_step = {"gemv_fused": 2 * n + 2 * sum(not model.config.is_moe_layer(i) for i in range(n)) + 1}
    expected = {name: DECODE * count + (name == "gemv_fused") for name, count in per_step.items()}  # + prefill's head
    assert {name: calls.count(name) for name in expected} == expected and len(calls) == sum(expected.values())
    assert _rel(fused, unfused) <= 2e-2
