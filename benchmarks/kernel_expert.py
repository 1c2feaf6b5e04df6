"""π0's expert layer piece by piece at the published size: attention and the four products at 51 rows, each form
checked against its reference on fresh random data, then timed in CUDA graphs.

What it answers (``docs/benchmarks/pi0_fast.md`` has the floor): how far the
split-key attention and the fused few-row products (``ops.triton.rows_matmul``,
bf16 and float8 weights) take one expert layer from the ~65 us the profile
measured, against ~10 us of weight reads; which launch shapes to keep. Also the
prefix's products at 560 rows in bf16 (cuBLAS) and FP8 (``torch._scaled_mm``,
row-wise scales) for the FP8 design. Run on a GPU:
    python -m benchmarks.kernel_expert [--json OUT.json] [--quick]
"""
from __future__ import annotations

import json
import math
import time

import torch

from benchmarks.gpu_args import gpu_benchmark_args
from benchmarks.timing import graph_ms
from flashrt_ros.models.lerobot.pi0.gemma_fast import additive_mask, single_key_head_attention
from flashrt_ros.ops import fused_rows
from flashrt_ros.ops.prefix_attention import prefix_attention as attention_ref
from flashrt_ros.ops.prefix_attention import visible_keys
from flashrt_ros.ops.triton import fast_kernels
from flashrt_ros.ops.triton import prefix_attention as pa
from flashrt_ros.ops.triton import rows_matmul as rm

ROWS, WIDTH, MLP, HEADS, D = 51, 1024, 4096, 8, 256          # Gemma 300M expert, π0 chunk 50 + state token
PREFIX, VALID = 560, 530                                     # 2 cameras x 256 + 48 prompt rows; 18 prompt tokens
LAYERS, STEPS = 18, 10
EPS = 1e-6
VLM = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (32768, 2048), "down": (2048, 16384)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def attention_rows(results: dict, quick: bool) -> None:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    total = PREFIX + ROWS
    kv = torch.randn(2, total, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
    valid = torch.tensor(VALID, device=dev)
    cases = {"expert": (ROWS, PREFIX, ROWS, 1), "prefix": (PREFIX, PREFIX, 0, 0)}
    configs = {"expert": [(16, 64, 4, 2), (32, 64, 4, 2), (16, 64, 64, 4, 2), (32, 64, 64, 4, 2),
                          (32, 64, 128, 4, 2), (64, 64, 64, 4, 2), (64, 64, 128, 8, 2), (32, 32, 64, 4, 2),
                          (16, 64, 128, 4, 2), (64, 32, 64, 4, 2)],
               # the split forms with the merge in the same kernel (one launch a call, not two; quick runs them)
               "expert merged": [(16, 64, 128, 4, 2, 1), (16, 64, 64, 4, 2, 1), (32, 64, 64, 4, 2, 1),
                                 (32, 64, 128, 4, 2, 1)],
               "prefix": [(64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (64, 64, 4, 3),
                          (128, 64, 8, 3)]}
    for case, (n_q, start, suffix, state_rows) in cases.items():
        q = torch.randn(n_q, HEADS, D, device=dev, dtype=torch.bfloat16, generator=g)
        keys, values = kv[0, :start + suffix], kv[1, :start + suffix]
        with fast_kernels(False):
            ref = attention_ref(q.float(), keys.float(), values.float(), valid, suffix_start=start,
                                suffix_len=suffix, state_rows=state_rows)
        allowed = visible_keys(n_q, start + suffix, valid, start, suffix, state_rows)
        mask = additive_mask(allowed.repeat_interleave(HEADS, dim=0), torch.bfloat16)
        sdpa = lambda: single_key_head_attention(q, keys, values, mask)  # noqa: E731
        row = {"sdpa": {"us": graph_ms(sdpa) * 1e3, "err": rel(sdpa(), ref)}}
        tried = (configs[case][:4] if quick else configs[case]) + configs.get(f"{case} merged", [])
        for cfg in tried:
            run = lambda: pa.prefix_attention(q, keys, values, valid, start, suffix, state_rows, config=cfg)  # noqa
            try:
                out = run()
                row[str(cfg)] = {"us": graph_ms(run) * 1e3, "err": rel(out, ref)}
            except Exception as exc:                      # a shape the compiler refuses: recorded, not fatal
                row[str(cfg)] = {"error": repr(exc)[:300]}
        results[f"attention {case}"] = row
        print(f"attention {case} ({n_q * HEADS} rows over {start + suffix} keys):", flush=True)
        for name, r in row.items():
            print(f"  {name}: {r}", flush=True)


def product_rows(results: dict, quick: bool) -> None:
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(1)
    shapes = {"qkv": ((HEADS + 2) * D, WIDTH, "qkv_rope"), "o": (WIDTH, HEADS * D, "residual"),
              "gate_up": (2 * MLP, WIDTH, "gelu_gate"), "down": (WIDTH, MLP, "residual")}
    configs = [(16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 64, 4, 5), (16, 64, 4, 6), (64, 128, 8, 3),
               (32, 256, 8, 3), (16, 512, 8, 2)]
    # split-K for the products whose 64 column tiles leave half of an H100's 132 SMs idle (quick runs them too)
    split_configs = [(16, 128, 4, 4, 2), (16, 128, 4, 4, 4), (16, 128, 4, 3, 8), (32, 128, 4, 4, 4),
                     (16, 256, 4, 3, 4)]
    cos = torch.rand(ROWS, D // 2, device=dev, generator=g)
    sin = torch.rand(ROWS, D // 2, device=dev, generator=g)
    for name, (n, k, epilogue) in shapes.items():
        x = torch.randn(ROWS, k, device=dev, dtype=dt, generator=g)
        ws = [torch.randn(n, k, device=dev, dtype=dt, generator=g) / math.sqrt(k) for _ in range(4)]
        res = torch.randn(ROWS, n, device=dev, dtype=dt, generator=g)
        q = torch.empty(ROWS, HEADS, D, device=dev, dtype=dt)
        kk = torch.empty(ROWS, 1, D, device=dev, dtype=dt)
        vv = torch.empty(ROWS, 1, D, device=dev, dtype=dt)
        it = iter(range(10 ** 9))
        nbytes = n * k * 2

        def reference(w: torch.Tensor, scale=None) -> torch.Tensor:
            wf = w.float() if scale is None else w.float() * scale[:, None]
            with fast_kernels(False):
                if epilogue == "qkv_rope":
                    qf = torch.empty(ROWS, HEADS, D, device=dev)
                    kf, vf = torch.empty(ROWS, 1, D, device=dev), torch.empty(ROWS, 1, D, device=dev)
                    fused_rows.qkv_rope(x.float() @ wf.t(), cos, sin, HEADS, 1, qf, kf, vf, x=x, eps=EPS)
                    return torch.cat([qf.flatten(), kf.flatten(), vf.flatten()])
                if epilogue == "gelu_gate":
                    return fused_rows.gelu_gate(x.float() @ wf.t(), x=x, eps=EPS)
                return res.float() + x.float() @ wf.t()

        def ours(w: torch.Tensor, scale=None, cfg=None) -> torch.Tensor:
            if epilogue == "qkv_rope":
                rm.rows_qkv_rope(x, w, cos, sin, HEADS, 1, q, kk, vv, scale=scale, norm_eps=EPS, config=cfg)
                return torch.cat([q.flatten(), kk.flatten(), vv.flatten()])
            if epilogue == "gelu_gate":
                return rm.rows_gelu_gate(x, w, scale=scale, norm_eps=EPS, config=cfg)
            return rm.rows_matmul(x, w, residual=res, scale=scale, config=cfg)

        def ours_only(w: torch.Tensor, scale=None, cfg=None) -> None:
            if epilogue == "qkv_rope":
                rm.rows_qkv_rope(x, w, cos, sin, HEADS, 1, q, kk, vv, scale=scale, norm_eps=EPS, config=cfg)
            elif epilogue == "gelu_gate":
                rm.rows_gelu_gate(x, w, scale=scale, norm_eps=EPS, config=cfg)
            else:
                rm.rows_matmul(x, w, residual=res, scale=scale, config=cfg)

        def cublas_composed() -> None:          # today's fast path: the product, then its row kernel
            w = ws[next(it) % 4]
            if epilogue == "qkv_rope":
                fused_rows.qkv_rope(x @ w.t(), cos, sin, HEADS, 1, q, kk, vv, x=x, eps=EPS)
            elif epilogue == "gelu_gate":
                fused_rows.gelu_gate(x @ w.t(), x=x, eps=EPS)
            else:
                torch.addmm(res, x, w.t())

        row = {"weight_MB": nbytes / 1e6, "floor_us_at_3TBps": nbytes / 3e12 * 1e6,
               "cublas_plain_us": graph_ms(lambda: x @ ws[next(it) % 4].t()) * 1e3,
               "cublas_composed_us": graph_ms(cublas_composed) * 1e3}
        w8 = [fp8(w) for w in ws]
        tried = (configs[:3] if quick else configs) + (split_configs if epilogue == "residual" else [])
        for cfg in tried:
            if epilogue == "qkv_rope" and (D // 2) % cfg[0]:
                continue
            for kind, weights in (("bf16", [(w, None) for w in ws]), ("fp8", w8)):
                try:
                    err = rel(ours(*weights[0], cfg=cfg), reference(*weights[0]))
                    for w in weights:              # each matrix's split-K scratch made before the capture
                        ours_only(*w, cfg=cfg)
                    us = graph_ms(lambda: ours_only(*weights[next(it) % 4], cfg=cfg)) * 1e3
                    row[f"{kind} {cfg}"] = {"us": us, "err": err}
                except Exception as exc:
                    row[f"{kind} {cfg}"] = {"error": repr(exc)[:300]}
        results[f"product {name}"] = row
        print(f"product {name} ({ROWS} x {k} -> {n}, {epilogue}):", flush=True)
        for key, r in row.items():
            print(f"  {key}: {r}", flush=True)


def vlm_fp8_rows(results: dict) -> None:
    """The prefix's products at 560 rows: cuBLAS bf16 against ``torch._scaled_mm`` FP8 with row-wise scales."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(2)
    for name, (n, k) in VLM.items():
        x = torch.randn(PREFIX, k, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) / math.sqrt(k)
        row = {"bf16_us": graph_ms(lambda: x @ w.t()) * 1e3}
        try:
            w8, ws = fp8(w)
            xs = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
            x8 = (x.float() / xs).to(torch.float8_e4m3fn)
            run = lambda: torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws[None, :].contiguous(),  # noqa: E731
                                           out_dtype=torch.bfloat16)
            row["fp8_rowwise_us"] = graph_ms(run) * 1e3
            row["fp8_err"] = rel(run(), x.float() @ w.float().t())
        except Exception as exc:
            row["fp8_error"] = repr(exc)[:300]
        results[f"vlm {name}"] = row
        print(f"vlm {name} ({PREFIX} x {k} -> {n}): {row}", flush=True)


def main() -> None:
    def add(p):
        p.add_argument("--json", help="write the rows here")
        p.add_argument("--quick", action="store_true", help="a few launch shapes only")
    args = gpu_benchmark_args(__doc__, "python -m benchmarks.kernel_expert", add)
    results: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    t0 = time.perf_counter()
    for part in (attention_rows, product_rows):
        try:
            part(results, args.quick)
        except Exception as exc:
            import traceback
            traceback.print_exc()
            results[part.__name__] = {"error": repr(exc)[:500]}
    try:
        vlm_fp8_rows(results)
    except Exception as exc:
        results["vlm"] = {"error": repr(exc)[:500]}
    results["seconds"] = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps({k: v for k, v in results.items()}, indent=None)[:200])


if __name__ == "__main__":
    main()
