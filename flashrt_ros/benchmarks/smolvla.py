"""SmolVLA: our captured plan / pop steps vs LeRobot's eager ``select_action``; episode; capsule restore.

Same GPU, same weights: LeRobot 0.4.4 builds ``SmolVLAPolicy`` at the published
SmolVLM2-500M sizes (16 VLM layers, expert of 0.75 width, chunk 50, 10 flow
steps; seeded random weights, no hub) over a local VLM directory
(``test/smolvla_reference.py``) and saves it; we load that checkpoint. Three
cameras at 256x256 (padded to 512 as SmolVLA does), a 6-D state and action
(SO-100's), a 48-token instruction budget. fp32 and bf16.

* LeRobot: ``select_action`` on a batch already on the GPU, tokenised and
  normalised (its pre/post-processors are not timed); ``reset()`` before a call
  forces a replanning step; bf16 under ``torch.autocast``.
* ours: ``PlanPopSteps`` over a ``PolicyEngine`` with ``cuda_graph=True``: the
  plan (prefill + 10-step denoise + queue refill) and the pop are two graphs,
  the host reads the queue count (observation copy, boundary commit and the
  final synchronisation included).
* episode: 200 steps from reset (4 plans, 196 pops), wall time, side by side.
* fork draw: ``PlanPopSteps.resample`` (a new noise seed denoised over the stored
  prefix KV, the VLM not run again), ours only.
* capsules: ``snapshot`` / ``restore`` of the whole VLA state (live prefix KV of
  every layer, queue, noise, instruction) vs a device-to-device copy of the
  same live bytes (median).

    python -m flashrt_ros.benchmarks.smolvla --out docs/benchmarks/smolvla_h200.md --json docs/benchmarks/smolvla_h200.json
    python -m flashrt_ros.benchmarks.smolvla --smoke       # CI sizes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from flashrt_ros.benchmarks.policies import capsule_times, machine, step_row, step_table  # noqa: E402
from flashrt_ros.benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.engine.vla import PlanPopSteps, set_instruction  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402

TASK = "pick up the red cube and put it in the box"


def make_checkpoint(directory: Path, smoke: bool):
    """LeRobot's SmolVLA at the published (or, ``smoke``, CI) size, saved; returns (policy, config, obs)."""
    from smolvla_reference import PUBLISHED, SMOLVLA_TINY, TINY, make_smolvla_checkpoint, write_vlm_directory
    vlm = write_vlm_directory(directory.parent / "vlm", TINY if smoke else PUBLISHED, allow_standin=True)
    if smoke:
        case = dict(cameras=2, hw=(24, 40), state=6, env=0, action=6, norm="MEAN_STD", cfg={})
        overrides = {}
    else:
        case = dict(cameras=3, hw=(256, 256), state=6, env=0, action=6, norm="MEAN_STD", cfg={})
        overrides = {k: v for k, v in SMOLVLA_TINY.items() if k in ("load_vlm_weights", "device")}
        overrides.update(num_vlm_layers=16, chunk_size=50, n_action_steps=50, num_steps=10, max_state_dim=32,
                         max_action_dim=32, resize_imgs_with_padding=(512, 512), tokenizer_max_length=48)
    _, policy, config = make_smolvla_checkpoint(directory, case, vlm, **overrides)
    from lerobot_reference import case_features, observations
    return policy.eval(), config, observations(case_features(case), 1, seed=3)[0]


def lerobot_batch(config, directory: Path, obs: dict, device: torch.device) -> dict:
    from lerobot_reference import processors
    pre, _ = processors(config, directory)
    batch = pre({**{k: v.clone() for k, v in obs.items()}, "task": TASK})
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def time_lerobot(policy, batch: dict, device: torch.device, dtype: torch.dtype, steps: int, samples: int) -> dict:
    policy = policy.to(device)
    autocast = torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32 and device.type == "cuda")
    replan, pop = [], []
    with torch.no_grad(), autocast:
        for i in range(3 + 2 * samples):
            force = i % 2 == 0
            if force:
                policy.reset()
            t0 = time.perf_counter()
            policy.select_action(dict(batch))
            sync(device)
            dt = (time.perf_counter() - t0) * 1e3
            if i >= 3:
                (replan if force else pop).append(dt)
        policy.reset()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            policy.select_action(dict(batch))
        sync(device)
        episode = (time.perf_counter() - t0) * 1e3
    return {"replan": replan, "pop": pop, "episode_ms": episode}


def time_ours(directory: Path, obs: dict, device: torch.device, dtype: torch.dtype, steps: int, samples: int,
              tmp: Path) -> dict:
    policy = load_lerobot_policy(directory, dtype=dtype)
    engine = PolicyEngine(policy, device=device, directory=str(tmp), device_budget_bytes=4 << 30)
    set_instruction(engine, TASK)
    stepper = PlanPopSteps(engine, cuda_graph=device.type == "cuda")
    gpu_obs = {k: v.to(device) for k, v in obs.items()}
    replan, pop = [], []
    for i in range(3 + 2 * samples):
        if i % 2 == 0:
            set_instruction(engine, TASK)                  # empties the queue: the next step plans
        t0 = time.perf_counter()
        _, planned = stepper.step(gpu_obs)
        dt = (time.perf_counter() - t0) * 1e3
        if i >= 3:
            (replan if planned else pop).append(dt)
    engine.capsules.reset()
    set_instruction(engine, TASK)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        stepper.step(gpu_obs)
    sync(device)
    episode = (time.perf_counter() - t0) * 1e3
    # a fork's new noise draw: the denoising loop alone over the stored prefix (vs a full replan)
    resample = []
    for i in range(samples):
        t0 = time.perf_counter()
        stepper.resample(i + 1)
        sync(device)
        resample.append((time.perf_counter() - t0) * 1e3)
    # capsules mid-chunk: the live state (prefix KV up to prefix_len in every layer) vs a copy of those bytes
    live = engine.arena.live_nbytes()
    capsule = {"arena_bytes": engine.arena.nbytes, "live_bytes": live, **capsule_times(engine, device, live)}
    engine.close()
    return {"replan": replan, "pop": pop, "episode_ms": episode, "capsule": capsule,
            "resample_ms": percentile(resample, 50)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="episode length (steps from reset)")
    ap.add_argument("--samples", type=int, default=40, help="timed replanning steps and pop steps, each")
    ap.add_argument("--smoke", action="store_true", help="CI sizes, few steps (CPU allowed)")
    ap.add_argument("--out", type=Path, help="markdown table")
    ap.add_argument("--json", type=Path, help="raw numbers")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    steps, samples = (8, 4) if args.smoke else (args.steps, args.samples)
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cuda" else [])
    rows, capsules, episodes = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "smolvla"
        policy, config, obs = make_checkpoint(directory, args.smoke)
        batch = lerobot_batch(config, directory, obs, device)
        for dtype in dtypes:
            name = f"smolvla {str(dtype).removeprefix('torch.')}"
            try:
                ref = time_lerobot(policy, batch, device, dtype, steps, samples)
            except Exception as exc:                       # report, keep measuring ours
                print(f"{name}: LeRobot failed: {type(exc).__name__}: {exc}", flush=True)
                ref = {"replan": [], "pop": [], "episode_ms": float("nan")}
            ours = time_ours(directory, obs, device, dtype, steps, samples, Path(tmp) / f"caps_{dtype}")
            capsules[name] = ours["capsule"]
            episodes[name] = {"lerobot_ms": ref["episode_ms"], "ours_ms": ours["episode_ms"],
                              "resample_ms": ours["resample_ms"]}
            for phase in ("replan", "pop"):
                row = step_row(name, phase, ref[phase], ours[phase])
                rows.append(row)
                print(json.dumps(row), flush=True)
            print(json.dumps({name: {"episode": episodes[name], "capsule": ours["capsule"]}}), flush=True)
    lines = ["# SmolVLA: captured plan/pop vs LeRobot eager select_action", "",
             f"Machine: {machine(device)}. {'CI sizes (smoke)' if args.smoke else 'published SmolVLM2-500M sizes'}; "
             f"{samples} samples per step row; latency in ms.", "", *step_table(rows)]
    lines += ["", f"| policy | episode of {steps} steps, LeRobot ms | ours ms | speed-up | ours: new noise draw "
              "from the stored prefix (fork), p50 ms |", "| --- | --- | --- | --- | --- |"]
    for name, e in episodes.items():
        lines.append(f"| {name} | {e['lerobot_ms']:.1f} | {e['ours_ms']:.1f} | {e['lerobot_ms'] / e['ours_ms']:.1f}x | "
                     f"{e['resample_ms']:.3f} |")
    lines += ["", "| policy | arena bytes | live bytes | snapshot ms | restore ms | copy floor ms (live bytes) |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name, c in capsules.items():
        lines.append(f"| {name} | {c['arena_bytes']} | {c['live_bytes']} | {c['snapshot_ms']:.4f} | "
                     f"{c['restore_ms']:.4f} | {c['copy_floor_ms']:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(device), "rows": rows, "episodes": episodes,
                                         "capsules": capsules}, indent=1))


if __name__ == "__main__":
    main()
