"""How far rounding moves a π0 / π0.5 chunk, and how far a broken network does: the measurements the bf16 bounds of
``benchmarks.action_checks`` rest on. CPU, published size, float32 and bf16, our engine only (no LeRobot).

One replan (10 flow steps, one chunk) from the same observation and noise for:

* A ``exact`` float32 (the function);
* B ``exact`` float32 on the weights rounded to bf16 (what a bf16 side computes with: the reference of bf16 sides);
* C ``exact`` bf16, D ``fast`` bf16 (the sides the bounds judge);
* the ``fast`` bf16 forms deliberately broken: the expert's middle layer skipped; head 0 of that layer's
  attention output zeroed; head 0 of the language model's middle layer zeroed;
* E ``fp8``: ``fast`` with the language model's and the expert's products on float8 weights (the widened weights
  on this CPU: the function a GPU computes).

Each against A and B: relative RMS ``||x - ref|| / ||ref||`` and relative max ``max|x - ref| / max|ref|``. A
bound for bf16 sides sits above C / D against B and below E-G. Takes ~4 minutes and ~15 GB of memory on 2 cores:
    python -m benchmarks.check_power [--kind pi0|pi05] [--json OUT.json] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.pi0_replan import TASK, build, observation
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction


def chunk(policy, obs: dict) -> torch.Tensor:
    """The action queue after one replan from a reset (seed 0)."""
    engine = PolicyEngine(policy, device="cpu", cuda_graph=False)
    try:
        set_instruction(engine, TASK)
        engine.capsules.reset(seed=0)
        engine.step(obs)
        return engine.arena[policy.QUEUE].float().clone()
    finally:
        engine.close()


def broken_forms(policy):
    """(name, apply, undo) of the deliberately broken ``fast`` forms (``benchmarks.pi0``'s self-tests do the
    first two the same way)."""
    from benchmarks.pi0_selftests import break_policy
    for name in ("selftest-skip-layer", "selftest-zero-head", "selftest-zero-vlm-head"):
        yield name, (lambda n=name: break_policy(policy, n))


def measure(kind: str, smoke: bool) -> dict:
    t0 = time.perf_counter()
    policy = build(kind, 2, "cpu", smoke)
    obs = observation(policy.cfg, "cpu")
    chunks = {"A exact float32": chunk(policy, obs)}
    with torch.no_grad():
        for p in policy.parameters():
            if p.dtype == torch.float32:
                p.copy_(p.bfloat16().float())
    chunks["B exact float32, bf16-rounded weights"] = chunk(policy, obs)
    policy.cast(torch.bfloat16)
    chunks["C exact bf16"] = chunk(policy, obs)
    policy.use_numerics("fast")
    policy.fast.attention = "kernel"
    chunks["D fast bf16"] = chunk(policy, obs)
    for name, apply in broken_forms(policy):
        undo = apply()
        chunks[f"{name} (fast bf16)"] = chunk(policy, obs)
        undo()
    del policy
    fp8 = build(kind, 2, "cpu", smoke)                 # the same seed: the same weights, then float8 products
    fp8.cast(torch.bfloat16)
    fp8.use_numerics("fp8")
    fp8.fast.attention = "kernel"
    chunks["E fp8 (float8 weights; the prefix's activations quantised too)"] = chunk(fp8, obs)
    a, b = chunks["A exact float32"], chunks["B exact float32, bf16-rounded weights"]

    def rel(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
        return {"rms": float((x - ref).norm() / ref.norm()), "max": float((x - ref).abs().max() / ref.abs().max())}
    rows = {name: {"vs_A": rel(x, a), "vs_B": rel(x, b)} for name, x in chunks.items()}
    return {"kind": kind, "smoke": smoke, "device": "cpu", "threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - t0, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("pi0", "pi05"), default="pi0")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = measure(args.kind, args.smoke)
    for name, r in result["rows"].items():
        print(f"{name:48s} vs A: rms {r['vs_A']['rms']:.2e} max {r['vs_A']['max']:.2e}   "
              f"vs B: rms {r['vs_B']['rms']:.2e} max {r['vs_B']['max']:.2e}")
    if args.json:
        from benchmarks.provenance import provenance
        args.json.write_text(json.dumps({**result, "provenance": provenance(torch.device("cpu"))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
