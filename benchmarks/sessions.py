"""Session switch cost: park the live conversation, bring another one back; prints a markdown table.

A switch (``engine.capsules.switch_session``) is one snapshot of the current
session's live bytes into a hidden capsule, one restore of the target's parked
capsule and the drop of that capsule. It is timed between two sessions that
both hold ``--positions`` tokens of transcript, against a flat copy of the same
live bytes (the floor: a switch moves them twice). Park tier: the store's
default (``--tier``).

    python -m benchmarks.sessions --cpu                 # random-llama-tiny on CPU
    python -m benchmarks.sessions --model smollm2 --positions 128 1024
"""
from __future__ import annotations

import argparse
import platform
import sys

import torch

from benchmarks.timing import copy_floor_ms, event_ms
from flashrt_ros.engine.config import StoreConfig
from flashrt_ros.engine.llm_engine import LLMEngine
from flashrt_ros.engine.stats import percentile
from flashrt_ros.models.registry import load_model

GiB = 1 << 30


def measure(engine: LLMEngine, position: int, reps: int) -> dict:
    """Fill two sessions to ``position`` tokens, then time ``reps`` switches back and forth."""
    device = engine.device
    vocab = engine.model.vocab_size
    for session, offset in (("bench_a", 1), ("bench_b", 2)):
        engine.capsules.switch_session(session)
        engine.capsules.reset()
        engine.prefill([(i * 7 + offset) % vocab for i in range(position)])
    live = engine.arena.live_nbytes()
    times = []
    for i in range(reps + 2):
        target = "bench_a" if i % 2 == 0 else "bench_b"
        ms = event_ms(lambda: engine.capsules.switch_session(target), device)
        if i >= 2:                                  # the first two allocate the parked capsules
            times.append(ms)
    return {"position": position, "live": live, "p50": percentile(times, 50),
            "p99": percentile(times, 99), "mean": sum(times) / len(times),
            "floor": copy_floor_ms(live, device, reps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random-llama-tiny")
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 128, 512])
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--tier", default="device", choices=("device", "host"))
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    args = ap.parse_args()
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model, tokenizer, _config, fingerprint_inputs = load_model(args.model, device, dtype)
    engine = LLMEngine(model, tokenizer, max_context=args.max_context, device=device,
                       prefill_chunk=128, fingerprint_inputs=fingerprint_inputs,
                       store_config=StoreConfig(device_budget_bytes=4 * GiB, host_budget_bytes=4 * GiB,
                                                default_tier=args.tier))
    rows = [measure(engine, p, args.reps) for p in args.positions if p < args.max_context]
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    print(f"# Session switch cost\n\nModel {args.model}, {where}, torch {torch.__version__}, park tier "
          f"{args.tier}, {args.reps} switches per row (after two warm-up switches).\n")
    print("| transcript tokens | live state | switch p50 ms | switch p99 ms | switch mean ms | "
          "flat copy of the live bytes ms (p50) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['position']} | {r['live'] / 1024:.0f} KiB | {r['p50']:.3f} | {r['p99']:.3f} | "
              f"{r['mean']:.3f} | {r['floor']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
