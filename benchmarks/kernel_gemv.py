"""Batch-1 matrix-vector products: cuBLAS (F.linear) vs our triton GEMV, on the decode shapes.

Prints a table (median of CUDA-graph replays of 20 back-to-back products, so launch
gaps are small), the achieved read bandwidth and the ratio; then every shape's launch
shapes swept against ``gemv_config``'s choice, and what the work ``gemv_fused`` takes
into the product (norm, residual add, SwiGLU gate) costs beside the plain product. Run on a GPU:
    python -m benchmarks.kernel_gemv
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from benchmarks.gpu_args import gpu_benchmark_args
from benchmarks.timing import graph_ms
from flashrt_ros.ops.triton.gemv import gemv, gemv_config, gemv_fused

SHAPES = {  # (out N, in K): hybrid 0.81B and SmolLM2-135M decode projections
    "hybrid in_proj": (8224, 1024), "hybrid out_proj": (1024, 2048), "hybrid w13": (7168, 1024),
    "hybrid w2": (1024, 3584), "hybrid wqkv": (5120, 1024), "hybrid lm_head": (151936, 1024),
    "smollm2 wqkv": (960, 576), "smollm2 wo": (576, 576), "smollm2 w13": (3072, 576), "smollm2 w2": (576, 1536),
    "smollm2 lm_head": (49152, 576),
}


def main() -> None:
    gpu_benchmark_args(__doc__, "python -m benchmarks.kernel_gemv")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| shape | N x K | cuBLAS us | GB/s | triton us | GB/s | triton/cuBLAS | max rel err |")
    print("|---|---|---|---|---|---|---|---|")
    total = {"cublas": 0.0, "triton": 0.0}
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(4)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        i = iter(range(10**9))
        t_cublas = graph_ms(lambda: F.linear(x, ws[next(i) % 4]))
        t_triton = graph_ms(lambda: gemv(x, ws[next(i) % 4]))
        ref = F.linear(x.float(), ws[0].float())
        err = ((gemv(x, ws[0]).float() - ref).norm() / ref.norm()).item()
        gb = n * k * 2 / 1e9
        total["cublas"] += t_cublas
        total["triton"] += t_triton
        print(f"| {name} | {n} x {k} | {t_cublas * 1e3:.1f} | {gb / t_cublas * 1e3:.0f} | {t_triton * 1e3:.1f} | "
              f"{gb / t_triton * 1e3:.0f} | {t_triton / t_cublas:.2f} | {err:.1e} |")
    print(f"sum over shapes: cuBLAS {total['cublas'] * 1e3:.1f} us, triton {total['triton'] * 1e3:.1f} us")
    # the launch shapes of every shape: which config each shape should take (gemv_config's choice first)
    print("\n| shape | gemv_config | its us | best config | best us | best GB/s |")
    print("|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(4)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), ws[0].float())
        chosen = gemv_config(n, k)
        times = {}
        for cfg in (chosen,) + SWEEP:
            if cfg in times or cfg[1] > triton.next_power_of_2(k):
                continue
            try:
                err = ((gemv(x, ws[0], cfg).float() - ref).norm() / ref.norm()).item()
                if err > 1e-2:
                    raise AssertionError(f"error {err:.1e}")
                i = iter(range(10**9))
                times[cfg] = graph_ms(lambda: gemv(x, ws[next(i) % 4], cfg))
            except Exception as exc:                   # a shape the compiler refuses: reported, not fatal
                print(f"  {name} {cfg}: {exc!r}"[:200])
        best = min(times, key=times.get)
        print(f"| {name} | {chosen} | {times[chosen] * 1e3:.1f} | {best} | {times[best] * 1e3:.1f} | "
              f"{n * k * 2 / 1e9 / times[best] * 1e3:.0f} |", flush=True)


    fused_overhead()


def fused_overhead() -> None:
    """What the work fused around a product costs (``gemv_fused``, gemv_config's shape): the norm before it
    (every program sums the row's squares again), the residual add after it, SwiGLU's gate (two weight rows a
    program) against the plain product of the same bytes."""
    print("\n| shape | N x K | gemv us | + norm us | + norm + residual us | + norm + silu gate (2N rows) us |")
    print("|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        if "lm_head" in name:
            continue
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(4)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        norm = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
        i = iter(range(10**9))
        plain = graph_ms(lambda: gemv(x, ws[next(i) % 4]))
        normed = graph_ms(lambda: gemv_fused(x, ws[next(i) % 4], norm="llama", norm_weight=norm, eps=1e-5))
        residual = graph_ms(lambda: gemv_fused(x, ws[next(i) % 4], norm="llama", norm_weight=norm, eps=1e-5,
                                               epilogue="residual", residual=res))
        gated = graph_ms(lambda: gemv_fused(x, ws[next(i) % 4], norm="llama", norm_weight=norm, eps=1e-5,
                                            epilogue="silu_gate")) if n % 2 == 0 else float("nan")
        print(f"| {name} | {n} x {k} | {plain * 1e3:.1f} | {normed * 1e3:.1f} | {residual * 1e3:.1f} | "
              f"{gated * 1e3:.1f} |", flush=True)


#: ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` tried for every shape
SWEEP = tuple((bn, bk, w, st) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024) for w in (4, 8)
              for st in (2, 3, 4) if bn * bk <= 8192)


if __name__ == "__main__":
    main()
