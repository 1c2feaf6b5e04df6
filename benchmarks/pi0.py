"""π0 / π0.5 over whole episodes at the published sizes: our engine (captured) vs LeRobot eager and LeRobot compiled.

Same GPU, same weights, same observations: LeRobot 0.4.4 builds ``PI0Policy`` /
``PI05Policy`` at the published sizes (PaliGemma 3B: SigLIP So400m/14 at 224 px
and Gemma 2B; a Gemma 300M expert; chunk 50, 10 flow steps; seeded random
weights, no hub) and saves it (``test/pi_reference``: LeRobot needs openpi's
patched transformers 4.53.2, so every LeRobot side runs in a process of its own,
one after the other on the same GPU; ours runs in this process). 2 or 3 cameras
at 224 x 224, an 8-D state and a 7-D action.

* LeRobot eager: ``select_action`` on batches its preprocessor made (not timed),
  in LeRobot's own ``dtype`` (``"bfloat16"`` casts the model as LeRobot does);
* LeRobot compiled: the same with its ``compile_model`` (``torch.compile`` of
  ``sample_actions``, mode ``--compile-mode``, LeRobot's default
  ``max-autotune``); the first (warm-up) episode includes compilation and is
  reported apart;
* ours: ``PolicyEngine.step`` with ``cuda_graph=True`` (replan, pop, redraw and
  replan-from-context graphs), the networks in the same dtype.

Each side: ``--warmup`` untimed then ``--episodes`` timed episodes of
``--steps`` steps (200: 4 replans, 196 pops) from a reset, every step timed up to
a synchronisation; replans and pops apart (p50 / p99); peak device memory.
**Outputs checked in the same run**: one more episode per side whose noise is
our counter stream's (seed 0); the max relative difference of our actions from
each LeRobot side's is reported (fp32: TF32 off on both sides, agreement to
~1e-3 expected; bf16: two different bf16 computations, reported only). Ours
also: a fork's new noise draw (``redraw``), a re-instruction from a fork
(``reinstruct``: language model + expert, no vision tower) against a cold replan,
and the capsule times.

A whole run at the published size takes minutes (the checkpoint alone is ~13 GB
of fp32 written once; LeRobot's ``max-autotune`` compile is slow), so it can be
split: ``--build DIR`` writes the checkpoint once, ``--checkpoint DIR`` reuses
it, ``--sides`` picks the sides, and every run merges its rows into ``--json``
and rewrites ``--out`` from all rows so far:

    python -m benchmarks.pi0 --kind pi0 --cameras 2 --build /tmp/pi0_2cam
    python -m benchmarks.pi0 --checkpoint /tmp/pi0_2cam --sides ours,lerobot \\
        --json docs/benchmarks/pi0_h100.json --out docs/benchmarks/pi0_h100.md
    python -m benchmarks.pi0 --checkpoint /tmp/pi0_2cam --sides compiled \\
        --json docs/benchmarks/pi0_h100.json --out docs/benchmarks/pi0_h100.md
    python -m benchmarks.pi0 --smoke       # reduced sizes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the π reference helpers (a checkout's test/)

from benchmarks.policies import capsule_times, machine  # noqa: E402
from benchmarks.race import summarize  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.engine.vla import reinstruct, set_instruction  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402

TASK = "pick up the red cube and put it in the box"
OTHER_TASK = "open the drawer"
SIDES = ("ours", "lerobot", "compiled")


def our_episode(engine: PolicyEngine, observations: list[dict], steps: int) -> dict:
    """One episode from a reset: per-step ms (up to the step's synchronisation, as the LeRobot side in
    ``test/pi_reference/bench.py`` times its ``select_action``) and whether each step replanned."""
    times, replans = [], []
    t_start = time.perf_counter()
    engine.capsules.reset()
    for i in range(steps):
        replan = engine.next_step_replans()          # host mirror: no device read
        replans.append(True if replan is None else replan)
        t0 = time.perf_counter()
        engine.step(observations[i % len(observations)])
        times.append((time.perf_counter() - t0) * 1e3)
    return {"episode_ms": (time.perf_counter() - t_start) * 1e3, "times": times, "replans": replans}


def build(directory: Path, kind: str, cameras: int, smoke: bool) -> None:
    """LeRobot's policy at the published (``smoke``: reduced) sizes, written as a checkpoint (its process)."""
    from pi_reference import PUBLISHED, REDUCED, Case, run_reference
    case = Case(str(directory), kind=kind, cameras=cameras, hw=(56, 56) if smoke else (224, 224),
                resolution=56 if smoke else 224, state=8, action=7, norm="MEAN_STD" if kind == "pi0" else "QUANTILES",
                cfg=dict(chunk_size=6, n_action_steps=6) if smoke else {}, sizes=REDUCED if smoke else PUBLISHED,
                steps=0, task=TASK)
    run_reference([case], directory.parent, timeout_s=3600)
    (directory / "bench_case.json").write_text(json.dumps({"kind": kind, "cameras": cameras, "smoke": smoke}))


def write_observations(directory: Path, path: Path, n: int = 4) -> list[dict]:
    """``n`` observations (images in [0, 1]) for both sides, saved for LeRobot's process."""
    from safetensors.torch import save_file
    features = json.loads((directory / "config.json").read_text())["input_features"]
    gen = torch.Generator().manual_seed(3)
    obs = [{k: (torch.rand if len(f["shape"]) == 3 else torch.randn)(tuple(f["shape"]), generator=gen)
            for k, f in features.items() if not k.startswith("observation.images.empty_camera_")}
           for _ in range(n)]
    save_file({**{f"{i}/{k}": v.contiguous() for i, o in enumerate(obs) for k, v in o.items()},
               "n": torch.tensor(n)}, str(path))
    return obs


def lerobot_side(directory: Path, kind: str, dtype: str, compiled: bool, args, obs_file: Path, device: str,
                 tmp: Path) -> dict:
    """One LeRobot side in the reference process: ``summarize`` of its episodes, its checked actions, its peak."""
    from pi_reference import reference_env
    from safetensors.torch import load_file
    name = f"lerobot{' compiled' if compiled else ''} {dtype}"
    out = tmp / f"{name.replace(' ', '_')}.json"
    spec = dict(name=name, directory=str(directory), kind=kind, dtype=dtype, compile_model=compiled,
                compile_mode=args.compile_mode, device=device, observations=str(obs_file), task=TASK,
                steps=args.steps, episodes=args.episodes, warmup=args.warmup + (1 if compiled else 0),
                check_steps=args.check_steps, out=str(out), no_tf32=True)
    spec_file = tmp / f"{name.replace(' ', '_')}_spec.json"
    spec_file.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "pi_reference.bench", str(spec_file)], env=reference_env(),
                          cwd=str(ROOT), capture_output=True, text=True, timeout=args.timeout)
    print(proc.stdout[-2000:], end="", flush=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    raw = json.loads(out.read_text())
    return {**summarize(raw["runs"], ()), "peak_gib": raw["peak_bytes"] / 2**30, "first_episode_ms": raw["first_episode_ms"],
            "actions": load_file(str(out.with_suffix(".safetensors")))["actions"]}


def our_side(directory: Path, dtype: torch.dtype, obs: list[dict], args, device: torch.device, tmp: Path) -> dict:
    """Our engine: episodes, the checked episode (seed 0), fork draw, re-instruction vs cold replan, capsules."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    policy = load_lerobot_policy(directory, dtype=dtype)
    policy.set_default_instruction(TASK)            # every episode (reset) starts with it
    engine = PolicyEngine(policy, device=device, cuda_graph=device.type == "cuda", directory=str(tmp),
                          device_budget_bytes=4 << 30)
    ours_obs = [{k: v.to(device) for k, v in o.items()} for o in obs]
    try:
        runs = [our_episode(engine, ours_obs, args.steps) for _ in range(args.warmup + args.episodes)]
        result = summarize(runs[args.warmup:], ())
        engine.capsules.reset(seed=0)
        result["actions"] = torch.stack([engine.step(ours_obs[i % len(ours_obs)]).cpu()
                                         for i in range(args.check_steps)])
        redraw, cold, fork = [], [], []
        for i in range(args.draws):
            t0 = time.perf_counter()
            engine.redraw(i + 1)
            sync(device)
            redraw.append((time.perf_counter() - t0) * 1e3)
        for i in range(args.draws):
            engine.capsules.reset(seed=0)
            set_instruction(engine, OTHER_TASK)
            t0 = time.perf_counter()
            engine.step(ours_obs[0])                 # a cold replan with the other instruction
            cold.append((time.perf_counter() - t0) * 1e3)
            engine.capsules.reset(seed=0)
            engine.step(ours_obs[0])                 # the default instruction's plan: the fork's source
            engine.capsules.snapshot("scene", overwrite=True)
            engine.capsules.fork("scene", f"branch{i}")
            engine.capsules.restore(f"branch{i}")
            t0 = time.perf_counter()
            reinstruct(engine, OTHER_TASK)
            sync(device)
            fork.append((time.perf_counter() - t0) * 1e3)
        result.update(redraw_p50_ms=percentile(redraw, 50), cold_replan_p50_ms=percentile(cold, 50),
                      reinstruct_p50_ms=percentile(fork, 50),
                      peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0,
                      capsule=capsule_times(engine, device, engine.arena.live_nbytes()))
    finally:
        engine.close()
    return result


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def markdown(rows: dict, machine_name: str) -> str:
    nan = float("nan")
    lines = ["# π0 / π0.5 over whole episodes: our engine (captured) vs LeRobot eager and LeRobot compiled", "",
             f"Machine: {machine_name}. Times in ms: median episode (from a reset), replan and pop p50 / p99; peak "
             "device memory in GiB; Δ: max relative difference of the checked episode's actions from ours.", "",
             "| policy | cameras | dtype | side | episode | replan p50 / p99 | pop p50 / p99 | peak GiB | Δ vs ours | "
             "episode speed-up of ours |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        kind, cameras, dtype = key.split("|")
        ours = r.get("ours", {})
        for side in SIDES:
            s = r.get(side)
            if s is None:
                continue
            if "error" in s:
                lines.append(f"| {kind} | {cameras} | {dtype} | {side} | failed: {s['error'][-200:]!r} |||||")
                continue
            speed = (f"{s['episode_ms'] / ours['episode_ms']:.2f}x" if ours.get("episode_ms") and side != "ours"
                     else "-")
            lines.append(f"| {kind} | {cameras} | {dtype} | {side} | {s['episode_ms']:.1f} | "
                         f"{s['replan_p50_ms']:.2f} / {s['replan_p99_ms']:.2f} | {s['pop_p50_ms']:.3f} / "
                         f"{s['pop_p99_ms']:.3f} | {s.get('peak_gib', nan):.2f} | {s.get('err_vs_ours', nan):.2e} | "
                         f"{speed} |")
    lines += ["", "| policy | cameras | dtype | ours: redraw p50 | cold replan p50 | re-instruct (fork) p50 | "
              "re-instruct speed-up | snapshot / restore ms | LeRobot compiled first episode ms |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        o = r.get("ours")
        if not o or "error" in o:
            continue
        kind, cameras, dtype = key.split("|")
        first = r.get("compiled", {}).get("first_episode_ms", nan)
        lines.append(f"| {kind} | {cameras} | {dtype} | {o['redraw_p50_ms']:.2f} | {o['cold_replan_p50_ms']:.2f} | "
                     f"{o['reinstruct_p50_ms']:.2f} | {o['cold_replan_p50_ms'] / o['reinstruct_p50_ms']:.2f}x | "
                     f"{o['capsule']['snapshot_ms']:.3f} / {o['capsule']['restore_ms']:.3f} | {first:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("pi0", "pi05"), default="pi0")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--build", type=Path, help="write the checkpoint here and stop")
    ap.add_argument("--checkpoint", type=Path, help="a checkpoint --build wrote (else one is built in a temp dir)")
    ap.add_argument("--sides", help=f"any of {SIDES} (default: all; --smoke: ours,lerobot)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode (chunks of 50)")
    ap.add_argument("--episodes", type=int, default=5, help="timed episodes per side")
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first")
    ap.add_argument("--check-steps", type=int, default=100, help="steps of the checked episode (seed 0)")
    ap.add_argument("--draws", type=int, default=10, help="timed redraws and re-instructions")
    ap.add_argument("--compile-mode", default="max-autotune", help="LeRobot's compile_mode")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per LeRobot process")
    ap.add_argument("--smoke", action="store_true", help="reduced sizes, few steps (CPU allowed)")
    ap.add_argument("--out", type=Path, help="markdown table (all rows in --json)")
    ap.add_argument("--json", type=Path, help="rows, merged with what the file already holds")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    if args.smoke:
        args.steps, args.episodes, args.warmup, args.check_steps, args.draws = 12, 1, 0, 12, 2
    if args.build:
        build(args.build, args.kind, args.cameras, args.smoke)
        return
    sides = [s for s in (args.sides or ("ours,lerobot" if args.smoke else ",".join(SIDES))).split(",") if s]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        directory = args.checkpoint or tmp / "checkpoint"
        if args.checkpoint is None:
            build(directory, args.kind, args.cameras, args.smoke)
        case = json.loads((directory / "bench_case.json").read_text())
        obs = write_observations(directory, tmp / "observations.safetensors")
        rows = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
        for dtype_name in args.dtypes.split(","):
            if device.type != "cuda" and dtype_name != "float32":
                continue                                        # bf16 is the GPU path
            key = f"{case['kind']}|{case['cameras']}|{dtype_name}"
            row = rows.setdefault(key, {})
            if "ours" in sides:
                row["ours"] = our_side(directory, getattr(torch, dtype_name), obs, args, device, tmp / "caps")
            for side, compiled in (("lerobot", False), ("compiled", True)):
                if side in sides:
                    row[side] = lerobot_side(directory, case["kind"], dtype_name, compiled, args,
                                             tmp / "observations.safetensors", str(device), tmp)
            ours_actions = row.get("ours", {}).get("actions")
            for side in SIDES:
                s = row.get(side, {})
                if isinstance(s.get("actions"), torch.Tensor):
                    if isinstance(ours_actions, torch.Tensor) and side != "ours":
                        s["err_vs_ours"] = rel_err(ours_actions, s["actions"])
                    s["actions"] = s["actions"].tolist()
                elif isinstance(s.get("actions"), list) and isinstance(ours_actions, torch.Tensor) and side != "ours":
                    s["err_vs_ours"] = rel_err(ours_actions, torch.tensor(s["actions"]))
            if isinstance(ours_actions, torch.Tensor):
                row["ours"]["actions"] = ours_actions.tolist()
            print(json.dumps({key: {k: {m: v for m, v in s.items() if m != "actions"} for k, s in row.items()}},
                             default=str), flush=True)
    name = machine(device) + (" (smoke: reduced sizes)" if case["smoke"] else "")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    text = markdown(rows, name)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({**rows}, indent=1, default=str))
    print(f"load average at the end: {load}")


if __name__ == "__main__":
    main()
