"""LeRobot ACT and Diffusion Policy: our captured step vs LeRobot's eager ``select_action``; capsule times.

Same GPU, same weights (LeRobot builds the policy with seeded random weights and
saves it; we load that checkpoint directory), fp32 and bf16. Per-step latency
p50/p99 in milliseconds, replanning steps (a new chunk is predicted) and
queue-pop steps apart:

* LeRobot: ``select_action`` on a batch already on the GPU and normalised
  (its pre/post-processors are not timed); a replanning step is forced by
  ``reset()`` before the call (its queue is then empty); bf16 runs under
  ``torch.autocast`` (its code creates fp32 tensors internally, so casting
  the weights alone fails).
* ours: ``PolicyEngine.step`` with ``cuda_graph=True`` (observation copy into
  the static inputs, normalisation, the whole step, unnormalisation, boundary
  commit and the final synchronisation included). The network runs every
  step by design (the replan-or-pop choice is on the device), so a pop step
  costs what a replanning step costs.
* capsules: ``snapshot`` / ``restore`` of the policy state (device tier) vs a
  device-to-device copy of the same bytes, each timed host-side with a
  synchronisation (median).

    python -m flashrt_ros.benchmarks.policies --out docs/benchmarks/policies.md --png docs/benchmarks/policies.png
    python -m flashrt_ros.benchmarks.policies --smoke        # tiny shapes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402


def make_checkpoint(kind: str, directory: Path, smoke: bool):
    """A LeRobot policy at a realistic size (ALOHA ACT, PushT Diffusion), saved as a checkpoint."""
    from lerobot_reference import lerobot, randomize_, save_checkpoint, image_stats, vector_stats
    lerobot()
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    gen = torch.Generator().manual_seed(1)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig as Config
        from lerobot.policies.act.modeling_act import ACTPolicy as Policy
        from lerobot.policies.act.processor_act import make_act_pre_post_processors as processors
        hw, state, action = ((48, 64), 14, 14) if smoke else ((480, 640), 14, 14)
        extra = dict(chunk_size=100, n_action_steps=100, pretrained_backbone_weights=None)
        if smoke:
            extra.update(dim_model=32, n_heads=4, dim_feedforward=64, chunk_size=10, n_action_steps=10)
        camera = "observation.images.top"
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig as Config
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy as Policy
        from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors as processors
        hw, state, action = (96, 96), 2, 2
        extra = dict(n_obs_steps=2, horizon=16, n_action_steps=8, crop_shape=(84, 84), noise_scheduler_type="DDIM",
                     num_train_timesteps=100, num_inference_steps=10, pretrained_backbone_weights=None)
        if smoke:
            extra.update(down_dims=(16, 32), diffusion_step_embed_dim=16, n_groups=4, kernel_size=3)
        camera = "observation.image"
    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state,)),
              camera: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *hw))}
    config = Config(input_features=inputs, device="cpu",
                    output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action,))},
                    normalization_mapping={"VISUAL": NormalizationMode.MEAN_STD, "STATE": NormalizationMode.MIN_MAX,
                                           "ACTION": NormalizationMode.MIN_MAX}, **extra)
    torch.manual_seed(0)
    policy = Policy(config)
    randomize_(policy, 0)
    stats = {"observation.state": vector_stats("MIN_MAX", state, gen), camera: image_stats("MEAN_STD", gen),
             "action": vector_stats("MIN_MAX", action, gen)}
    save_checkpoint(policy, config, stats, directory, processors)
    obs = {"observation.state": torch.randn(state, generator=gen), camera: torch.rand(3, *hw, generator=gen)}
    return policy.eval(), obs


def time_lerobot(policy, obs: dict, device: torch.device, dtype: torch.dtype, steps: int) -> dict:
    policy = policy.to(device)
    batch = {k: v.unsqueeze(0).to(device) for k, v in obs.items()}
    replan, pop = [], []
    autocast = torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32 and device.type == "cuda")
    with torch.no_grad(), autocast:
        for i in range(steps + 3):
            force = i % 4 == 0
            if force:
                policy.reset()
            t0 = time.perf_counter()
            policy.select_action(dict(batch))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = (time.perf_counter() - t0) * 1e3
            if i >= 3:
                (replan if force else pop).append(dt)
    return {"replan": replan, "pop": pop}


def time_ours(directory: Path, obs: dict, device: torch.device, dtype: torch.dtype, steps: int, tmp: Path) -> tuple:
    policy = load_lerobot_policy(directory, dtype=dtype)
    engine = PolicyEngine(policy, device=device, cuda_graph=device.type == "cuda", directory=str(tmp))
    gpu_obs = {k: v.to(device) for k, v in obs.items()}
    left = getattr(policy, "QUEUE", None)
    replan, pop = [], []
    for i in range(steps + 3):
        empty = True
        if left is not None:
            name = policy.LEFT
            empty = int(engine.arena[name]) == 0          # read between steps (not inside the timed step)
        t0 = time.perf_counter()
        engine.step(gpu_obs)
        dt = (time.perf_counter() - t0) * 1e3
        if i >= 3:
            (replan if empty else pop).append(dt)
    capsule = {"state_bytes": engine.arena.nbytes, **capsule_times(engine, device, engine.arena.nbytes)}
    engine.close()
    return {"replan": replan, "pop": pop}, capsule


def step_row(policy: str, step: str, lerobot_ms: list[float], ours_ms: list[float]) -> dict:
    """One table row: p50 / p99 of LeRobot's and our step latencies and the p50 speed-up."""
    row = {"policy": policy, "step": step}
    for who, xs in (("lerobot", lerobot_ms), ("ours", ours_ms)):
        row[f"{who}_p50"] = percentile(xs, 50) if xs else float("nan")
        row[f"{who}_p99"] = percentile(xs, 99) if xs else float("nan")
    row["speedup_p50"] = row["lerobot_p50"] / row["ours_p50"]
    return row


def step_table(rows: list[dict]) -> list[str]:
    """Markdown lines of ``step_row`` rows."""
    lines = ["| policy | step | LeRobot p50 | LeRobot p99 | ours p50 | ours p99 | speed-up (p50) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['step']} | {r['lerobot_p50']:.3f} | {r['lerobot_p99']:.3f} | "
                     f"{r['ours_p50']:.3f} | {r['ours_p99']:.3f} | {r['speedup_p50']:.1f}x |")
    return lines


def capsule_times(engine, device: torch.device, copy_bytes: int, reps: int = 50) -> dict:
    """Median ``snapshot`` / ``restore`` of the engine's state vs one device copy of ``copy_bytes`` (ms)."""
    snap, rest, floor = [], [], []
    engine.capsules.snapshot("bench", overwrite=True)
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.capsules.snapshot("bench", overwrite=True)
        snap.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        engine.capsules.restore("bench")
        rest.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        floor.append((time.perf_counter() - t0) * 1e3)
    return {"snapshot_ms": percentile(snap, 50), "restore_ms": percentile(rest, 50),
            "copy_floor_ms": percentile(floor, 50)}


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs), torch {torch.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, few steps (CPU allowed)")
    ap.add_argument("--out", type=Path, help="markdown table")
    ap.add_argument("--png", type=Path, help="bar chart of p50 latencies")
    ap.add_argument("--json", type=Path, help="raw numbers")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    steps = 12 if args.smoke else args.steps
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cuda" else [])
    rows, capsules = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("act", "diffusion"):
            directory = Path(tmp) / kind
            policy, obs = make_checkpoint(kind, directory, args.smoke)
            for dtype in dtypes:
                name = f"{kind} {str(dtype).removeprefix('torch.')}"
                try:
                    ref = time_lerobot(policy, obs, device, dtype, steps)
                except Exception as exc:           # report, keep measuring the other rows
                    print(f"{name}: LeRobot failed: {type(exc).__name__}: {exc}", flush=True)
                    ref = {"replan": [], "pop": []}
                try:
                    ours, capsule = time_ours(directory, obs, device, dtype, steps, Path(tmp) / f"caps_{kind}_{dtype}")
                except Exception as exc:
                    print(f"{name}: ours failed: {type(exc).__name__}: {exc}", flush=True)
                    continue
                capsules[name] = capsule
                for phase in ("replan", "pop"):
                    if not ours[phase] and not ref[phase]:
                        continue
                    row = step_row(name, phase, ref[phase], ours[phase])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                print(json.dumps({name: capsule}), flush=True)
    lines = ["# LeRobot policies: our captured step vs LeRobot eager select_action", "",
             f"Machine: {machine(device)}. {steps} steps per row set; latency in ms.", "", *step_table(rows)]
    lines += ["", "| policy | state bytes | snapshot ms | restore ms | copy floor ms |", "| --- | --- | --- | --- | --- |"]
    for name, c in capsules.items():
        lines.append(f"| {name} | {c['state_bytes']} | {c['snapshot_ms']:.4f} | {c['restore_ms']:.4f} | "
                     f"{c['copy_floor_ms']:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(device), "rows": rows, "capsules": capsules}, indent=1))
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{r['policy']}\n{r['step']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["lerobot_p50"] for r in rows], 0.4, label="LeRobot select_action (eager)")
        ax.bar([i + 0.2 for i in x], [r["ours_p50"] for r in rows], 0.4, label="ours (CUDA graph)")
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("p50 step latency (ms)")
        ax.set_title(machine(device), fontsize=8)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
