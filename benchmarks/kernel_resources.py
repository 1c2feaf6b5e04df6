"""Our triton kernels compiled for an H100 (sm_90) on any machine, a GPU or not: shared memory, registers, spills.

Why: whether the compiler takes a kernel, whether its tiles fit an H100's 227 KiB of shared memory, and how many
registers it holds (so how many programs an SM keeps in flight) are known without a device: ``triton.compile``
runs the whole pipeline to a cubin (triton's wheel carries ptxas), and ``ptxas -v`` reports the resources. The
cases are the launch shapes our wrappers pick. ``test/test_triton_sm90_compile.py`` checks every case compiles and
fits; this prints them:

    python -m benchmarks.kernel_resources            # a table: shared bytes, registers, spill bytes per case
    python -m benchmarks.kernel_resources --json     # what the test reads

Run without ``TRITON_INTERPRET=1`` (under it ``@triton.jit`` makes interpreted functions the compiler cannot take;
the test runs this in a process of its own for that reason).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashrt_ros.ops.triton import next_power_of_2

#: an H100's shared memory a block may take (227 KiB)
H100_SHARED = 232448


def compile_sm90(fn, constexprs: dict, *, pointer: str = "bf16", pointers: dict | None = None,
                 floats: tuple[str, ...] = (), ints: dict | None = None, num_warps: int = 4,
                 num_stages: int = 3) -> dict:
    """``fn`` compiled for sm_90 as a launch would specialise it: every ``*_ptr`` argument a 16-byte aligned
    pointer to ``pointer`` (or its entry in ``pointers``), the ``floats`` float32, every other argument an int32
    with the value ``ints`` gives it standing in for the launch's (1: a constant, as triton specialises it; a
    multiple of 16: marked divisible; unnamed: neither). Without the alignment marks triton neither vectorises
    the loads nor pipelines them (num_stages has no effect), so its registers and shared memory would be another
    kernel's. Returns ``{"shared", "registers", "spill_bytes", "warps"}`` (registers and spills from
    ``ptxas -v``, None where it could not be run)."""
    pointers, ints = pointers or {}, ints or {}
    signature, constants, attrs = {}, dict(constexprs), {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
        elif p.name.endswith("_ptr"):
            signature[p.name] = "*" + pointers.get(p.name, pointer)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif p.name in floats:
            signature[p.name] = "fp32"
        elif ints.get(p.name) == 1:
            signature[p.name] = "constexpr"
            constants[p.name] = 1
        else:
            signature[p.name] = "i32"
            if p.name in ints and ints[p.name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    return {"shared": int(kernel.metadata.shared), "warps": num_warps, **_ptxas_resources(kernel.asm["ptx"])}


def _ptxas_resources(ptx: str) -> dict:
    """Registers per thread and spill bytes of ``ptx`` for sm_90a, from ``ptxas -v`` (triton's own ptxas)."""
    from triton.backends.nvidia.compiler import get_ptxas
    try:
        ptxas = get_ptxas(90).path
    except Exception:                          # no ptxas reachable: the cubin was made, the counts are unknown
        return {"registers": None, "spill_bytes": None}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True).stderr
    registers = re.search(r"Used (\d+) registers", out)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", out)]
    return {"registers": int(registers.group(1)) if registers else None, "spill_bytes": sum(spills) if spills else None}


def fused_decode_product(norm: int, epilogue: int, n: int, k: int) -> dict:
    """``n`` weight rows (``n / 2`` outputs for the SwiGLU gate, epilogue 2), the wrapper's launch shape."""
    from flashrt_ros.ops.triton.gemv import _gemv_fused_kernel, gemv_config, paired_config
    block_n, block_k, warps, stages = (paired_config if epilogue == 2 else gemv_config)(n, k)
    return compile_sm90(_gemv_fused_kernel, dict(NORM=norm, EPILOGUE=epilogue, K_POW2=next_power_of_2(k),
                                                 BLOCK_N=block_n, BLOCK_K=block_k),
                        floats=("eps",), ints=dict(N=n // 2 if epilogue == 2 else n, K=k, stride_wn=k),
                        num_warps=warps, num_stages=stages)


def qkv_rope_product(head_dim: int) -> dict:
    from flashrt_ros.ops.triton.gemv import _gemv_qkv_rope_kernel, paired_config
    block_n, block_k, warps, stages = paired_config(960, 576)
    return compile_sm90(_gemv_qkv_rope_kernel, dict(NORM=1, K_POW2=1024, HEAD_DIM=head_dim, BLOCK_N=block_n,
                                                    BLOCK_K=block_k),
                        pointers={"positions_ptr": "i64", "inv_freq_ptr": "fp32"}, floats=("eps",),
                        ints=dict(K=576, stride_wn=576, cache_stride=30 * 2 * 3 * head_dim, n_heads=9, n_kv_heads=3),
                        num_warps=warps, num_stages=stages)


def decode_attention(merge: bool, head_dim: int, group: int) -> dict:
    from flashrt_ros.ops.triton.attention import _attention_split_kernel, _decode_config
    block_n, split, n_splits, warps, stages = _decode_config(head_dim, 4096)
    splits_pad = next_power_of_2(n_splits)
    return compile_sm90(_attention_split_kernel, dict(
        H=group * 2, GROUP=group, D=head_dim, BLOCK_M=max(16, next_power_of_2(group)), BLOCK_N=block_n, SPLIT=split,
        NUM_SPLITS=n_splits, SPLITS_PAD=splits_pad, CHUNK=min(16, splits_pad), MERGE=merge, DOT_PRECISION="tf32"),
        pointers={"start_ptr": "i64", "part_acc_ptr": "fp32", "part_max_ptr": "fp32", "part_sum_ptr": "fp32",
                  "arrived_ptr": "i32"}, floats=("qk_scale",),
        ints=dict(n_queries=1, stride_qt=group * 2 * head_dim, stride_qh=head_dim, stride_qd=1,
                  stride_kt=24 * 2 * 2 * head_dim, stride_kh=head_dim, stride_vt=24 * 2 * 2 * head_dim,
                  stride_vh=head_dim, stride_ot=group * 2 * head_dim, stride_oh=head_dim),
        num_warps=warps, num_stages=stages)


def expert_rows_product(dtype: str, epilogue: str, split_k: int = 1) -> dict:
    from flashrt_ros.ops.triton.rows_matmul import (_EPILOGUES, DEFAULT_CONFIGS, FLOAT32_MAX_STAGES, MAX_ROWS,
                                                    _rows_matmul_kernel)
    block_n, block_k, warps, stages, *_ = DEFAULT_CONFIGS[epilogue]
    if dtype == "fp32":
        stages = min(stages, FLOAT32_MAX_STAGES)
    rope = epilogue == "qkv_rope"
    n, k = {"qkv_rope": (2560, 1024), "gelu_gate": (4096, 1024), "silu_gate": (4096, 1024)}.get(epilogue, (1024, 4096))
    return compile_sm90(_rows_matmul_kernel, dict(
        EPILOGUE=_EPILOGUES[epilogue], NORM=False, W_SCALED=False, HAS_VALID=False, HEADS=8 if rope else 0,
        KV_HEADS=1 if rope else 0, HALF=128 if rope else 1, BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32"),
        pointer=dtype, pointers={"scale_ptr": "fp32", "cos_ptr": "fp32", "sin_ptr": "fp32", "valid_ptr": "i64",
                                 "part_ptr": "fp32", "arrived_ptr": "i32"},
        floats=("eps",), ints=dict(M=51, N=n, K=k, K_SLICE=k // split_k, stride_x=k, stride_out=n, stride_res=n,
                                   stride_cs=128, stride_q=2048, stride_k=256, stride_v=256),
        num_warps=warps, num_stages=stages)


def prefix_attention(dtype: str, rows: int, merge: bool = False) -> dict:
    """π0's prefix attention at ``attention_config``'s shape for ``rows`` query rows over a 2-camera prefix (816 keys)
    and a 51-row suffix: one pass for a prefix's rows, split keys (optionally merged) for the expert's."""
    import torch

    from flashrt_ros.ops.triton.prefix_attention import _prefix_attention_kernel, attention_config
    suffix_start, suffix_len = 816, 51
    n_keys = suffix_start + suffix_len
    config = attention_config(rows, n_keys, torch.float32 if dtype == "fp32" else torch.bfloat16)
    if len(config) == 4:
        block_m, block_n, warps, stages = config
        split = triton.cdiv(n_keys, block_n) * block_n
    else:
        block_m, block_n, split, warps, stages, *_ = config
    n_splits = triton.cdiv(n_keys, split)
    return compile_sm90(_prefix_attention_kernel, dict(
        SUFFIX_START=suffix_start, SUFFIX_LEN=suffix_len, HEADS=8, STATE_ROWS=1, D=256, BLOCK_M=block_m,
        BLOCK_N=block_n, SPLIT=split, NUM_SPLITS=n_splits, SPLITS_PAD=next_power_of_2(n_splits),
        MERGE=merge and n_splits > 1, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32"),
        pointer=dtype, pointers={"part_acc_ptr": "fp32", "part_max_ptr": "fp32", "part_sum_ptr": "fp32",
                                 "valid_ptr": "i64", "arrived_ptr": "i32"},
        floats=("qk_scale",), ints=dict(n_rows=rows, stride_kt=256, stride_vt=256), num_warps=warps,
        num_stages=stages)


#: case name -> the compile it runs
CASES = {
    **{f"fused_decode_product[norm{norm}-epilogue{epi}-{n}x{k}]": (fused_decode_product, (norm, epi, n, k))
       for norm in (0, 1, 2) for epi in (0, 1, 2) for n, k in ((960, 576), (1024, 3584), (7168, 1024))},
    **{f"qkv_rope_product[{d}]": (qkv_rope_product, (d,)) for d in (64, 128)},
    **{f"decode_attention[merge{int(m)}-{d}-{g}]": (decode_attention, (m, d, g))
       for m in (False, True) for d, g in ((64, 3), (256, 4))},
    **{f"expert_rows_product[{dt}-{e}]": (expert_rows_product, (dt, e))
       for dt in ("bf16", "fp32") for e in ("store", "residual", "gelu_gate", "qkv_rope", "silu_gate")},
    **{f"expert_rows_product[{dt}-{e}-split4]": (expert_rows_product, (dt, e, 4))
       for dt in ("bf16", "fp32") for e in ("store", "residual")},
    **{f"prefix_attention[{dt}-{rows}rows-merge{int(m)}]": (prefix_attention, (dt, rows, m))
       for dt in ("bf16", "fp32") for rows, m in ((816 * 8, False), (51 * 8, False), (51 * 8, True))},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object, case -> resources or error")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: run without TRITON_INTERPRET=1 (the module doc says why)", file=sys.stderr)
        return 2
    results = {}
    for name, (fn, fn_args) in CASES.items():
        try:
            results[name] = fn(*fn_args)
        except Exception as exc:                 # reported per case; the test names it
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    if args.json:
        json.dump(results, sys.stdout)
        return 0
    print(f"triton {triton.__version__}, target sm_90 (H100: {H100_SHARED} bytes of shared memory a block)")
    print("| case | shared bytes | registers / thread | spill bytes | warps |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | error: {r['error'][:100]} | | | |")
        else:
            print(f"| {name} | {r['shared']} | {r['registers']} | {r['spill_bytes']} | {r['warps']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
