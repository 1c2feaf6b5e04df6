"""SmolVLA over whole episodes: our engine (host replan-or-pop, captured) vs LeRobot eager ``select_action``; fork draw; capsules.

Same GPU, same weights: LeRobot 0.4.4 builds ``SmolVLAPolicy`` at the published
SmolVLM2-500M sizes (16 VLM layers, expert of 0.75 width, chunk 50, 10 flow
steps; seeded random weights, no hub) over a local VLM directory
(``test/smolvla_reference.py``) and saves it; we load that checkpoint. Three
cameras at 256x256 (padded to 512 as SmolVLA does), a 6-D state and action
(SO-100's), a 48-token instruction budget. fp32 and bf16.

* episodes: ``policies.alternate``, as for ACT and Diffusion Policy: episodes
  of ``--steps`` (200: 4 replans, 196 pops) from a reset, LeRobot's and ours
  alternating, each step timed host-side up to a synchronisation; replanning
  steps and pops apart (p50 / p99).
* LeRobot: ``select_action`` on batches its preprocessor made (tokenised,
  normalised; not timed), already on the GPU; bf16 under ``torch.autocast``.
* ours: ``PolicyEngine.step`` with ``cuda_graph=True``, the instruction as the
  policy's default: the engine decides replan or pop on the host and replays
  the replan graph (prefill + 10-step denoise + queue refill + pop) or the pop
  graph (observation copy skipped, boundary commit and the final
  synchronisation included).
* fork draw: ``PolicyEngine.redraw`` (a new noise seed denoised over the stored
  prefix KV, the VLM not run again: its own graph), ours only.
* capsules: ``snapshot`` / ``restore`` of the whole VLA state (live prefix KV of
  every layer, queue, noise, instruction) vs a device-to-device copy of the
  same live bytes (median).

    python -m benchmarks.smolvla --out docs/benchmarks/smolvla_h200.md --json docs/benchmarks/smolvla_h200.json
    python -m benchmarks.smolvla --smoke       # CI sizes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from benchmarks.policies import (alternate, capsule_times, machine, observation_variants,  # noqa: E402
                                             table_lines, table_rows)
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
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


def lerobot_batches(config, directory: Path, observations: list[dict], device: torch.device) -> list[dict]:
    """LeRobot's batches of ``observations``: its preprocessor (tokenise ``TASK``, normalise), on ``device``."""
    from lerobot_reference import processors
    pre, _ = processors(config, directory)
    batches = []
    for obs in observations:
        batch = pre({**{k: v.cpu().clone() for k, v in obs.items()}, "task": TASK})
        batches.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    return batches


def measure(policy, batches: list[dict], ours_obs: list[dict], directory: Path, device: torch.device,
            dtype: torch.dtype, steps: int, episodes: int, warmup: int, draws: int, tmp: Path) -> dict:
    """``alternate`` episodes, then ours alone: the fork draw (``redraw``) and the capsule times."""
    ours = load_lerobot_policy(directory, dtype=dtype)
    ours.set_default_instruction(TASK)                 # every episode (reset) starts with it
    engine = PolicyEngine(ours, device=device, cuda_graph=device.type == "cuda", directory=str(tmp),
                          device_budget_bytes=4 << 30)
    ref = policy.to(device)
    try:
        result = alternate(f"smolvla {dtype}", ref, batches, engine, ours_obs, device, dtype, steps, episodes,
                           warmup)
        redraw = []
        for i in range(draws):
            t0 = time.perf_counter()
            engine.redraw(i + 1)
            sync(device)
            redraw.append((time.perf_counter() - t0) * 1e3)
        result["redraw_p50_ms"] = percentile(redraw, 50)
        # the live state (prefix KV up to prefix_len in every layer) vs a copy of those bytes
        result["capsule"] = capsule_times(engine, device, engine.arena.live_nbytes())
    finally:
        engine.close()
        ref.to("cpu")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode (chunks of 50)")
    ap.add_argument("--episodes", type=int, default=5, help="timed episodes per side")
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first")
    ap.add_argument("--draws", type=int, default=20, help="timed fork draws (redraw)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--smoke", action="store_true", help="CI sizes, few steps (CPU allowed)")
    ap.add_argument("--out", type=Path, help="markdown table")
    ap.add_argument("--json", type=Path, help="raw numbers")
    args = ap.parse_args()
    nan = float("nan")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    steps, episodes, draws = (8, 1, 2) if args.smoke else (args.steps, args.episodes, args.draws)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    if device.type != "cuda":
        dtypes = [torch.float32]                       # LeRobot's bf16 autocast is a CUDA path
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "smolvla"
        policy, config, obs = make_checkpoint(directory, args.smoke)
        ours_obs = observation_variants(obs, device)
        batches = lerobot_batches(config, directory, ours_obs, device)
        for dtype in dtypes:
            name = f"smolvla {str(dtype).removeprefix('torch.')}"
            results[name] = measure(policy, batches, ours_obs, directory, device, dtype, steps, episodes,
                                    args.warmup, draws, Path(tmp) / f"caps_{dtype}")
            print(json.dumps({name: results[name]}), flush=True)
    rows = table_rows(results)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (nan, nan, nan)
    lines = ["# SmolVLA over whole episodes: our engine (host replan-or-pop, captured) vs LeRobot eager select_action",
             "", f"Machine: {machine(device)}. {'CI sizes (smoke)' if args.smoke else 'published SmolVLM2-500M sizes'}; "
             f"{steps} steps per episode from a reset, median of {episodes} episodes per side (after {args.warmup} "
             f"warm-up each), sides alternating; times in ms; load average at the end {load[0]:.2f}.", "",
             *table_lines(rows, results), "",
             "| policy | ours: new noise draw from the stored prefix (fork, redraw), p50 ms | ours: replan p50 ms |",
             "| --- | --- | --- |"]
    for row, r in zip(rows, results.values()):
        lines.append(f"| {row['policy']} | {r['redraw_p50_ms']:.3f} | {row['ours_replan_p50_ms']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(device), "steps": steps, "episodes": episodes,
                                         "load_average": load, "rows": rows, "results": results}, indent=1))


if __name__ == "__main__":
    main()
