"""``python -m benchmarks.llm``: a follow-up turn from a capsule vs a cold prefill, re-entry, decode, capsule verbs.

One process, one report: for each model (the hybrid 0.81B benchmark shape, and
SmolLM2-135M) and each context length N it measures (f) the follow-up turn:
cold prefill of N+T ids -> first token vs restore of an N-token capsule +
prefill of the T new ids -> first token, and the same for transformers
(``copy.deepcopy`` and ``clone()`` restores); the token identity of the two
paths; (r) re-entry: restore -> the token of the capsule's stored logits;
(d) batch-1 decode vs the weight-read floor, with kernel anatomies of a decode
token and of the turn's prefill; (e) snapshot / restore vs the copy floor of
the live bytes. Writes ``llm.md`` (+ ``llm.json``, ``llm_ttft.png`` when
matplotlib exists) into ``--out``. See docs/benchmarks/README.md for the columns.

    python -m benchmarks.llm                                         # H200 defaults, < 8 minutes
    python -m benchmarks.llm --quick --device cpu --out /tmp/bench   # CPU smoke run
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.anatomy import forward_anatomy
from benchmarks.budget import TimeBudget
from benchmarks.measure import RunSettings, measure_hf, measure_ours
from benchmarks.models import (MODELS, ModelPair, build_hybrid, build_smollm2, parameter_count,
                                           weight_read_bytes)
from benchmarks.provenance import provenance
from benchmarks.report import plot, render
from benchmarks.timing import copy_bandwidth
from flashrt_ros.models.base import FingerprintInputs
from flashrt_ros.ops.triton import fast_kernels, triton_available

DEFAULT_CONTEXTS = (2048, 4096, 8192, 16384)
QUICK_CONTEXTS = (32, 64)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg: str) -> None:
    print(f"[benchmarks.llm] {msg}", flush=True)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    from flashrt_ros.ops import fla_available

    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
        info["cuda"] = torch.version.cuda
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    info.update({"dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
                 "transformers": _version("transformers"), "fla": _version("flash-linear-attention"),
                 "causal-conv1d": _version("causal-conv1d"), "python": platform.python_version()})
    info["our gated-delta kernels"] = ("fla (prefill), triton (decode)" if device.type == "cuda" and fla_available()
                                       else "torch reference")
    info["HF gated-delta kernels"] = ("fla (picked up automatically)" if fla_available()
                                      else "torch reference (fla not importable)")
    return info


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.llm", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--contexts", type=int, nargs="+", default=None,
                   help=f"prompt lengths (default {' '.join(map(str, DEFAULT_CONTEXTS))}; "
                        f"--quick: {' '.join(map(str, QUICK_CONTEXTS))})")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--reps", type=int, default=None, help="TTFT repetitions, median (default 5; --quick 2)")
    p.add_argument("--capsule-reps", type=int, default=None,
                   help="snapshot/restore repetitions, median (default 50; --quick 10)")
    p.add_argument("--turn-tokens", type=int, default=None,
                   help="tokens T of the follow-up turn (default 64; --quick 8)")
    p.add_argument("--prefill-chunk", type=int, default=None, help="our prefill chunk (default 8192 on CUDA, else 2048; --quick 16)")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--quick", action="store_true", help="tiny configs and short contexts (CPU smoke test)")
    p.add_argument("--smollm2-random", action="store_true",
                   help="random weights of SmolLM2's shape (with a transformers twin) instead of the real GGUF")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run our steps eagerly")
    p.add_argument("--no-fast-kernels", action="store_true",
                   help="our CUDA path without the triton kernels (the torch reference ops; for comparison)")
    p.add_argument("--time-budget-s", type=float, default=450.0,
                   help="skip measurements that would end the run past this (default 450 s)")
    p.add_argument("--bandwidth-mib", type=int, default=None, help="copy size of the bandwidth probe "
                   "(default 1024 on CUDA, 64 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.type == "cuda" else "float32"
    args.contexts = args.contexts or list(QUICK_CONTEXTS if args.quick else DEFAULT_CONTEXTS)
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    if args.capsule_reps is None:
        args.capsule_reps = 10 if args.quick else 50
    if args.turn_tokens is None:
        args.turn_tokens = 8 if args.quick else 64
    if args.prefill_chunk is None:
        args.prefill_chunk = 16 if args.quick else 8192 if args.device.type == "cuda" else 2048
    args.bandwidth_mib = args.bandwidth_mib or (1024 if args.device.type == "cuda" else 64)
    if (min(args.contexts) < 1 or args.reps < 1 or args.capsule_reps < 1 or args.prefill_chunk < 1
            or args.turn_tokens < 1):
        p.error("contexts, repetitions, the prefill chunk and the turn tokens must be >= 1")
    return args


def _build(name: str, args: argparse.Namespace, dtype: torch.dtype) -> ModelPair:
    if name == "hybrid":
        return build_hybrid(args.device, dtype, args.seed, args.quick)
    return build_smollm2(args.device, dtype, args.seed, args.quick, args.smollm2_random)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement; returns the JSON-able result (also written under ``args.out``)."""
    budget = TimeBudget(args.time_budget_s)
    dtype = DTYPES[args.dtype]
    machine = machine_info(args.device, dtype)
    for k, v in machine.items():
        log(f"{k}: {v}")
    bandwidth = copy_bandwidth(args.bandwidth_mib << 20, args.device)
    machine["copy bandwidth (read+write)"] = f"{bandwidth / 1e9:.1f} GB/s ({args.bandwidth_mib} MiB copy)"
    log(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    graphs = args.device.type == "cuda" and not args.no_cuda_graphs
    fast = args.device.type == "cuda" and triton_available() and not args.no_fast_kernels
    machine["our decode"] = "CUDA-graph replay" if graphs else "eager"
    machine["our prefill"] = (f"{'CUDA-graph replay' if graphs else 'eager'} per chunk, chunks of "
                              f"{args.prefill_chunk} tokens (remainder in powers of two)")
    machine["our fused kernels"] = (f"triton {_version('triton')}" if fast
                                    else "off (torch reference ops)")
    settings = RunSettings(args.device, args.reps, args.capsule_reps, args.prefill_chunk, graphs, args.seed,
                           args.turn_tokens)
    models, rows = [], []
    notes = list(budget.notes)
    for name in args.models:
        log(f"building {name} ...")
        pair = _build(name, args, dtype)
        hf_reason = "skipped (--no-hf)" if args.no_hf else pair.hf_reason
        hf = None if args.no_hf else pair.hf
        notes += [f"{pair.name}: {n}" for n in pair.notes]
        weight_bytes = weight_read_bytes(pair.ours)
        models.append({"name": pair.name, "params": parameter_count(pair.ours), "weights": pair.weights,
                       "weight_bytes": weight_bytes,
                       "hf": f"{type(pair.hf).__name__}, same weights" if hf is not None else hf_reason})
        floor_ms = weight_bytes / bandwidth * 1e3
        fp = FingerprintInputs.from_model(pair.ours)
        if args.device.type == "cuda" and budget.allows("anatomy:" + name, 1, f"decode anatomy {pair.name}"):
            t0 = budget.elapsed()
            position = min(args.contexts)
            with fast_kernels(fast):
                for key, tokens in (("decode_anatomy", 1), ("turn_anatomy", args.turn_tokens)):
                    anatomy = forward_anatomy(pair.ours, position, args.device, tokens)
                    models[-1][key] = {"position": position, "tokens": tokens, **anatomy}
                    log(f"{pair.name} {key}: { {k: v for k, v in anatomy.items() if k != 'top'} }")
            budget.record("anatomy:" + name, 1, budget.elapsed() - t0)
        for context in args.contexts:
            row: dict[str, Any] = {"model": pair.name, "context": context, "decode_floor_ms": floor_ms}
            label = f"{pair.name} @ {context}"
            if budget.allows("ours:" + name, context, f"ours {label}"):
                log(f"{label}: ours ...")
                t0 = budget.elapsed()
                try:
                    with fast_kernels(fast):
                        row.update(measure_ours(pair.ours, context, settings, fp))
                except torch.cuda.OutOfMemoryError as exc:
                    notes.append(f"ours {label}: out of memory ({exc})")
                # one-off compilation in the warm-up must not inflate the estimate for longer contexts
                budget.record("ours:" + name, context, budget.elapsed() - t0 - row.get("warmup_s", 0.0))
                _progress(row, ("cold_turn_ttft_ms", "followup_ttft_ms", "followup_token_match",
                                "unaligned_token_match", "cold_ttft_ms", "reentry_ttft_ms", "decode_ms",
                                "snapshot_ms", "restore_ms", "continuation_match"))
            if hf is not None and budget.allows("hf:" + name, context, f"HF {label}"):
                log(f"{label}: transformers ...")
                t0 = budget.elapsed()
                try:
                    row.update(measure_hf(hf, pair.ours.vocab_size, context, settings))
                except torch.cuda.OutOfMemoryError as exc:
                    notes.append(f"HF {label}: out of memory ({exc})")
                budget.record("hf:" + name, context, budget.elapsed() - t0 - row.get("hf_warmup_s", 0.0))
                _progress(row, ("hf_cold_turn_ttft_ms", "hf_followup_deepcopy_ms", "hf_followup_clone_ms",
                                "hf_cold_ttft_ms", "hf_snapshot_ms", "hf_reentry_ttft_ms", "hf_continuation_match"))
            rows.append(row)
        del pair, hf
        if args.device.type == "cuda":
            torch.cuda.empty_cache()
    notes += budget.notes
    notes.append(f"total run time {budget.elapsed():.0f} s (budget {budget.total_s:.0f} s)")
    return {"command": " ".join(["python -m benchmarks.llm", *sys.argv[1:]]), "machine": machine, "models": models,
            "rows": rows, "notes": notes}


def _progress(row: dict[str, Any], keys: Sequence[str]) -> None:
    parts = [f"{k}={row[k]:.3f}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}" for k in keys]
    log("  " + " ".join(parts))


def write(result: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    notes = list(result["notes"])
    why_not = plot(result["rows"], out / "llm_ttft.png")
    if why_not:
        notes.append(why_not)
    else:
        result["plot"] = "llm_ttft.png"
    markdown = render(result["machine"], result["models"], result["rows"], notes)
    markdown = markdown.replace("## Machine", f"Command: `{result['command']}`\n\n## Machine", 1)
    if "plot" in result:
        markdown += "\n![follow-up turn: time to first token](llm_ttft.png)\n"
    path = out / "llm.md"
    path.write_text(markdown)
    (out / "llm.json").write_text(json.dumps({**result, "notes": notes, "provenance": provenance(result["machine"]["device"])},
                                             indent=1, default=str))
    print(markdown, flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    path = write(result, args.out)
    log(f"wrote {path}")
    failed = [r for r in result["rows"] if r.get("continuation_match") is False
              or (r.get("followup_aligned") and r.get("followup_token_match") is False)]
    if failed:
        log(f"CORRECTNESS FAILURE: a re-entry diverged from the uninterrupted run, or a follow-up turn from "
            f"an aligned prefix diverged from the cold run, in {len(failed)} row(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
