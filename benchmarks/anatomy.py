"""Where a forward's GPU time goes (a decode token, or a follow-up turn's prefill): kernels and time by kind.

Why: "decode is N x the weight-read floor" says nothing about the cause. A
batch-1 step is a chain of kernels; with a CUDA graph the gaps between them are
small but each kernel still has a fixed cost. Counting the kernels of one
eager model forward and summing their device time by kind (cuBLAS matrix
products, our triton kernels, other torch kernels) shows whether the step is
bound by weight reads, by kernel count, or by something else. This profiles
the model's forward of one token (the engine adds a few bookkeeping kernels:
the token write, sampling, counters). The same breakdown of a ``T``-token
forward at position ``N`` is the anatomy of a follow-up turn's prefill.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from flashrt_ros.models.base import CausalLM
from flashrt_ros.runtime.arena import StateArena, core_meta_specs

_GEMM_MARKERS = ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitk")
_OURS = ("_add_rms_norm", "_attention_", "_decode_step", "_causal_conv", "_conv_state", "_gated_product",
         "_rope_kv", "_gated_rms_rows", "_gdn_gates")
_FLA = ("chunk_", "fused_recurrent", "l2norm", "recompute_w_u", "solve_tril")


def kernel_kind(name: str) -> str:
    low = name.lower()
    if any(m in low for m in _GEMM_MARKERS):
        return "gemm"
    if name.startswith(_OURS):
        return "triton (ours)"
    if any(m in low for m in _FLA):
        return "fla"
    return "other"


@torch.no_grad()
def forward_anatomy(model: CausalLM, position: int, device: torch.device, tokens: int = 1,
                    steps: int = 5) -> dict[str, Any]:
    """Kernels and device time of one ``tokens``-token forward at ``position``, by kind (means over ``steps``)."""
    from torch.profiler import ProfilerActivity, profile

    arena = StateArena(core_meta_specs() + model.state_specs(position + tokens + 8), device=device)
    token = torch.ones(tokens, dtype=torch.int64, device=device)
    pos = position + torch.arange(tokens, dtype=torch.int64, device=device)
    for _ in range(3):                          # warm-up: compilation, autotune, handles
        model(token, pos, arena, last_only=True)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model(token, pos, arena, last_only=True)
        torch.cuda.synchronize(device)
    count: dict[str, float] = defaultdict(float)
    time_us: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        count[kind] += 1
        time_us[kind] += event.time_range.elapsed_us()
        by_name[event.name][0] += 1
        by_name[event.name][1] += event.time_range.elapsed_us()
    del arena
    out: dict[str, Any] = {"kernels": sum(count.values()) / steps,
                           "kernel_ms": sum(time_us.values()) / steps / 1e3}
    for kind in ("gemm", "triton (ours)", "fla", "other"):
        out[f"{kind} kernels"] = count.get(kind, 0.0) / steps
        out[f"{kind} ms"] = time_us.get(kind, 0.0) / steps / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]
    out["top"] = [{"kernel": name[:90], "per_step": n / steps, "us_per_step": us / steps} for name, (n, us) in top]
    return out
