"""Prefill attention over the static KV cache: our triton kernel's block configs vs SDPA flash.

For the two model shapes (hybrid: 8 q / 2 kv heads, dim 256; SmolLM2: 9 / 3, dim 64)
and a 2048-token chunk at start 0 and at start 14336 (16k context), prints the
median time (CUDA events, 20 reps) of each config of ``_prefill_config``, and of
``F.scaled_dot_product_attention`` on the live keys with a lower-right causal
mask (what a flash kernel does when the position is known on the host).
Run on a GPU: ``python -m benchmarks.kernel_attention``.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import flashrt_ros.ops.triton.attention as attention
from benchmarks.gpu_args import gpu_benchmark_args
from benchmarks.timing import graph_ms, median_event_ms

SHAPES = {"hybrid": (8, 2, 256), "smollm2": (9, 3, 64)}
CONFIGS = {256: [(64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 3), (128, 64, 8, 2)],
           64: [(128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3),
                (64, 128, 4, 2)]}
T, S = 2048, 16384 + 64
CUDA = torch.device("cuda")


def _ms(fn) -> float:
    return median_event_ms(fn, 20, CUDA)


def _sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int):
    t, end = q.shape[0], start + q.shape[0]
    qs = q.transpose(0, 1).unsqueeze(0)
    ks = k_cache[:end].transpose(0, 1).unsqueeze(0)
    vs = v_cache[:end].transpose(0, 1).unsqueeze(0)
    bias = causal_lower_right(t, end)
    return lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias, enable_gqa=True)


def short_chunks(turn: int = 64) -> None:
    """A ``turn``-token chunk after a long history: split-key slice targets vs the flash-style kernel."""
    variants = [("flash-style", {"_SHORT_MAX_QUERIES": 1})] + [
        (f"split block_m {bm} target {n}",
         {"_SHORT_BLOCK_M": {True: bm, False: bm}, "_SHORT_TARGET_PROGRAMS": {True: n, False: n}})
        for bm, n in ((32, 264), (64, 132), (64, 264), (64, 528), (128, 132), (128, 264))]
    for name, (h, kv, d) in SHAPES.items():
        for start in (2048, 16384 - turn):
            cache = start + turn + 64
            k_cache = torch.randn(cache, kv, d, device="cuda", dtype=torch.bfloat16)
            v_cache = torch.randn(cache, kv, d, device="cuda", dtype=torch.bfloat16)
            q = torch.randn(turn, h, d, device="cuda", dtype=torch.bfloat16)
            pos = torch.tensor(start, device="cuda")
            live_bytes = 2 * (start + turn) * kv * d * 2
            sdpa = _sdpa(q, k_cache, v_cache, start)
            ref = sdpa()[0].transpose(0, 1).float()
            ms = graph_ms(sdpa)
            print(f"{name} T={turn} start={start}: SDPA {ms * 1e3:.1f} us ({live_bytes / ms / 1e6:.0f} GB/s)")
            for label, patch in variants:
                saved = {k: getattr(attention, k) for k in patch}
                try:
                    for k, v in patch.items():
                        setattr(attention, k, v)
                    ms = graph_ms(lambda: attention.static_kv_attention(q, k_cache, v_cache, pos))
                    out = attention.static_kv_attention(q, k_cache, v_cache, pos).float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    print(f"  {label}: {ms * 1e3:.1f} us ({live_bytes / ms / 1e6:.0f} GB/s), rel err {err:.1e}")
                finally:
                    for k, v in saved.items():
                        setattr(attention, k, v)


def main() -> None:
    args = gpu_benchmark_args(__doc__, "python -m benchmarks.kernel_attention", lambda p: p.add_argument(
        "--short", action="store_true", help="a follow-up turn's short chunk: split-key vs flash-style vs SDPA"))
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.short:
        short_chunks()
        return
    original = attention._prefill_config
    for name, (h, kv, d) in SHAPES.items():
        k_cache = torch.randn(S, kv, d, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn(S, kv, d, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(T, h, d, device="cuda", dtype=torch.bfloat16)
        for start in (0, 14336):
            pos = torch.tensor(start, device="cuda")
            end = start + T
            flops = 4 * h * d * (T * start + T * T / 2)
            qs = q.transpose(0, 1).unsqueeze(0)
            ks = k_cache[:end].transpose(0, 1).unsqueeze(0)
            vs = v_cache[:end].transpose(0, 1).unsqueeze(0)
            bias = causal_lower_right(T, end)
            sdpa = _ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias, enable_gqa=True))
            ref = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias, enable_gqa=True)[0].transpose(0, 1)
            print(f"{name} T={T} start={start}: SDPA {sdpa:.3f} ms ({flops / sdpa / 1e9:.0f} TFLOP/s)")
            for cfg in CONFIGS[d]:
                attention._prefill_config = lambda head_dim, n, c=cfg: (min(c[0], max(16, n)), *c[1:])
                try:
                    ms = graph_ms(lambda: attention.static_kv_attention(q, k_cache, v_cache, pos))
                    out = attention.static_kv_attention(q, k_cache, v_cache, pos)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    print(f"  config {cfg}: {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s), rel err {err:.1e}")
                except Exception as exc:          # a config that does not fit (shared memory)
                    print(f"  config {cfg}: failed ({type(exc).__name__}: {str(exc)[:80]})")
                finally:
                    attention._prefill_config = original


if __name__ == "__main__":
    main()
