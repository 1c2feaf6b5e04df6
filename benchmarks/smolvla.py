"""SmolVLA over whole episodes: our engine (captured replan-or-pop) vs LeRobot eager and compiled; fork draw; capsules.

Same GPU, same weights: LeRobot 0.4.4 builds ``SmolVLAPolicy`` at the published
SmolVLM2-500M sizes (16 VLM layers, expert of 0.75 width, chunk 50, 10 flow
steps; seeded random weights, no hub) over a local VLM directory
(``test/smolvla_reference.py``) and saves it; we load that checkpoint. Three
cameras at 256x256 (padded to 512 as SmolVLA does), a 6-D state and action
(SO-100's), a 48-token instruction budget. fp32 and bf16.

* episodes: ``benchmarks.race`` (as for ACT and Diffusion Policy): episodes of
  ``--steps`` (200: 4 replans, 196 pops) from a reset, every side alternating,
  each step timed from the host observation to the action on the host; every
  side's first timed episode checked against LeRobot eager fp32 with the same
  injected noise (``select_action(noise=...)`` gets our stream's draw): its first
  chunk and the whole episode, relative to the largest reference action, within
  the race's tolerance (fp32 1e-3, or 2e-2 with TF32; bf16 1e-1; ``--tol-fp32``,
  ``--tol-bf16``); the run exits with status 1 when a side of ours is beyond it.
* LeRobot: its pre-processor each step (tokenises the task, normalises, to the
  device), ``select_action`` under ``torch.inference_mode()``, its
  post-processor. Modes: eager; ``compile_model`` (its own switch, with
  ``--compile-mode``, default reduce-overhead; LeRobot's config default is
  max-autotune, which compiles for minutes); bf16 under autocast; bf16 VLM
  weights (how LeRobot loads a pretrained SmolVLA), each also compiled.
* ours, in both numerics (``--numerics``, default ``fast,exact``; each its own
  side, ``ours-fast`` / ``ours-exact``, the first the headline's): ``PolicyEngine.step``
  with ``cuda_graph=True``, the instruction as the policy's default: the engine
  decides replan or pop on the host and replays the replan graph (prefill +
  10-step denoise + queue refill + pop) or the pop graph (observation copy
  skipped, boundary commit and the final synchronisation included).
* fork draw: ``PolicyEngine.redraw`` (a new noise seed denoised over the stored
  prefix KV, the VLM not run again: its own graph), each side of ours.
* capsules: ``snapshot`` / ``restore`` of the whole VLA state (live prefix KV of
  every layer, queue, noise, instruction) vs a device-to-device copy of the
  same live bytes (median).

    python -m benchmarks.smolvla --out docs/benchmarks/smolvla_h200.md --json docs/benchmarks/smolvla_h200.json \
        --time-budget-s 420
    python -m benchmarks.smolvla --smoke       # CI sizes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from benchmarks.policies import (add_race_args, observation_variants, publish, race_policy,  # noqa: E402
                                 settings_from)
from benchmarks.provenance import git_state  # noqa: E402
from benchmarks.race import apply_eval_flags, eval_flags_restored  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402

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


def redraw_times(draws: int, device: torch.device) -> Callable[[PolicyEngine], dict]:
    """Ours only: ``draws`` fork draws (``redraw``: a new seed denoised over the stored prefix), median ms."""
    def measure(engine: PolicyEngine) -> dict:
        times = []
        for i in range(draws):
            t0 = time.perf_counter()
            engine.redraw(i + 1)
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        return {"redraw_p50_ms": percentile(times, 50), "redraws": draws}
    return measure


@eval_flags_restored()
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode (chunks of 50)")
    ap.add_argument("--episodes", type=int, default=10, help="timed episodes per side")
    ap.add_argument("--draws", type=int, default=20, help="timed fork draws (redraw)")
    ap.add_argument("--smoke", action="store_true", help="CI sizes, few steps (CPU allowed)")
    ap.add_argument("--numerics", default="fast,exact", help="our sides, one per numerics (the first: the headline's)")
    add_race_args(ap)
    ap.add_argument("--out", type=Path, help="markdown report")
    ap.add_argument("--json", type=Path, help="raw numbers with provenance")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    steps, episodes, replans, draws = ((8, 2, 3, 2) if args.smoke
                                       else (args.steps, args.episodes, args.replans, args.draws))
    git_state()                                    # the code that runs: read before anything else
    flags = apply_eval_flags(device)
    s = settings_from(args, steps, episodes, replans)
    s.check_steps = steps                          # the whole episode checked, not only its first chunk
    numerics = tuple(n for n in args.numerics.split(",") if n)
    if not numerics or set(numerics) - {"fast", "exact"}:
        sys.exit(f"--numerics {args.numerics!r}: a comma-separated list of fast, exact")
    precisions = [{"float32": "fp32", "bfloat16": "bf16"}.get(d, d) for d in args.dtypes.split(",")]
    s.jobs_total = len(precisions)
    inputs = torch.device("cpu") if args.inputs == "host" else device
    command = " ".join(["python -m benchmarks.smolvla", *(sys.argv[1:] if argv is None else argv)])
    title = "SmolVLA over whole episodes: our engine vs LeRobot eager and compiled"
    size = "CI sizes (smoke)" if args.smoke else "published SmolVLM2-500M sizes, 3 cameras 256x256"
    results: dict[str, dict] = {}

    def partial(name: str, result: dict) -> None:
        results[name] = result
        publish(args, title, size, results, s, device, flags, command, fork_lines, final=False)

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "smolvla"
        policy, config, obs = make_checkpoint(directory, args.smoke)
        observations = observation_variants(obs, inputs)
        race_policy("smolvla", policy, directory, observations, precisions, device, s, Path(tmp),
                    extra={"task": TASK}, prepare=lambda ours: ours.set_default_instruction(TASK),
                    after=redraw_times(draws, device), device_budget_bytes=4 << 30, live_capsule_bytes=True,
                    on_result=partial, numerics=numerics)
    failed = publish(args, title, size, results, s, device, flags, command, fork_lines)
    if failed:
        print("CHECK FAILED: " + "; ".join(failed), flush=True)
        return 1
    return 0


def fork_lines(results: dict[str, dict]) -> str:
    """Ours only: the fork draw beside the replan, each side of ours."""
    text = ("\n## Fork draw (ours)\n\n| policy | side | new noise draw over the stored prefix (redraw), p50 ms "
            "| replan p50 ms |\n| --- | --- | --- | --- |\n")
    for name, r in results.items():
        for side in r.get("ours_sides", ["ours"]):
            v = r["sides"].get(side)
            if v is not None and "redraw_p50_ms" in v:
                text += f"| {name} | {side} | {v['redraw_p50_ms']:.3f} | {v['replan_p50_ms']:.3f} |\n"
    return text


if __name__ == "__main__":
    sys.exit(main())
