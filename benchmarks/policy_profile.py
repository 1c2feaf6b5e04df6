"""Where a LeRobot policy's step spends its device time: captured replan / pop replays, variants, a kernel profile.

Why: the episode benchmark (``benchmarks.policies``) says how long a robot
waits; this says why, and measures each speed change against its alternative
in one run (``--variants``), so a change is kept only if it pays. Diffusion's
weight floor (the bytes of its networks read once per denoising step, at the
copy bandwidth measured here) is the bound a replan is compared with.

    python -m benchmarks.policy_profile --json OUT.json          # on a GPU
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.policies import make_checkpoint
from benchmarks.provenance import provenance
from benchmarks.timing import copy_bandwidth, median_event_ms
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.lerobot import load_lerobot_policy
from flashrt_ros.models.lerobot.diffusion.diffusion_net import gemm_conv1d
from flashrt_ros.ops.triton import fast_kernels


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int = 50) -> float:
    """Median device time of one graph replay (CUDA events; the arena drifts, shapes do not)."""
    return median_event_ms(graph.replay, reps, torch.device("cuda"))


def top_kernels(engine: PolicyEngine, n: int = 12) -> list[dict]:
    """The eager replan body under the profiler: the most expensive kernels by device time."""
    from torch.profiler import ProfilerActivity, profile
    saved = engine.arena.block.clone()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.bodies.step_body(True if engine.bodies.queue is not None else None)
        torch.cuda.synchronize()
    engine.arena.block.copy_(saved)
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:n]:
        rows.append({"kernel": e.key[:90], "calls": e.count, "device_ms": e.device_time_total / 1e3})
    return rows


def measure(kind: str, directory: Path, dtype: torch.dtype, variant: str, tmp: Path) -> dict:
    policy = load_lerobot_policy(directory, dtype=dtype)
    if variant == "channels_last":
        policy.to(memory_format=torch.channels_last)
    if variant == "contiguous_weights":          # the ablation of layout.lay_out_convs
        policy.lay_out_weights = False
    with fast_kernels(variant != "unfused_group_norm"):
        engine = PolicyEngine(policy, device="cuda", cuda_graph=True, directory=str(tmp))
    out = {"policy": kind, "dtype": str(dtype).removeprefix("torch."), "variant": variant}
    runners = engine.bodies.steps
    if True in runners:
        out["replan_graph_ms"] = replay_ms(runners[True].graph)
        out["pop_graph_ms"] = replay_ms(runners[False].graph, 200)
    else:
        out["replan_graph_ms"] = replay_ms(runners[None].graph)
    if variant == "base":
        out["top_kernels"] = top_kernels(engine)
    if kind == "diffusion":
        net = policy.diffusion
        unet_bytes = sum(p.numel() * p.element_size() for p in net.unet.parameters())
        enc_bytes = sum(p.numel() * p.element_size() for p in net.rgb_encoder.parameters())
        out["unet_bytes"], out["encoder_bytes"] = unet_bytes, enc_bytes
        out["weight_bytes_per_replan"] = unet_bytes * len(policy.steps) + enc_bytes
    engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--variants", default="base,gemm_conv,contiguous_weights,unfused_group_norm,channels_last")
    args = ap.parse_args()
    bandwidth = copy_bandwidth(1 << 31, torch.device("cuda"))
    print(json.dumps({"copy_bandwidth_GBps": bandwidth / 1e9}), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("act", "diffusion"):
            directory = Path(tmp) / kind
            make_checkpoint(kind, directory, "full")
            for dtype in (torch.float32, torch.bfloat16):
                for variant in args.variants.split(","):
                    if variant in ("gemm_conv", "unfused_group_norm") and kind != "diffusion":
                        continue
                    saved = torch.nn.Conv1d.forward
                    if variant == "gemm_conv":
                        torch.nn.Conv1d.forward = gemm_conv1d
                    try:
                        row = measure(kind, directory, dtype, variant, Path(tmp) / "caps")
                    except Exception as exc:            # report, measure the rest
                        row = {"policy": kind, "dtype": str(dtype), "variant": variant,
                               "error": f"{type(exc).__name__}: {exc}"}
                    finally:
                        torch.nn.Conv1d.forward = saved
                    if "weight_bytes_per_replan" in row:
                        row["weight_floor_ms"] = row["weight_bytes_per_replan"] / bandwidth * 1e3
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"provenance": provenance(torch.device("cuda")),
                                         "copy_bandwidth_GBps": bandwidth / 1e9, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
