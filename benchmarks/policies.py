"""LeRobot ACT and Diffusion Policy over whole episodes: our engine vs LeRobot's eager ``select_action``.

What a robot pays: an episode of ``--steps`` (200) control steps from a reset,
each step timed host-side up to a synchronisation, ours and LeRobot's episodes
alternating in one run, same device, same weights (LeRobot builds the policy
with seeded random weights at ALOHA-ACT and PushT-Diffusion sizes and saves it;
we load that checkpoint directory), fp32 and bf16. Reported per policy and
dtype: the median episode time, replanning steps (a new chunk is predicted) and
queue pops apart (p50 / p99), and the fraction of steps over a 20 ms (50 Hz) period.

* LeRobot: ``select_action`` on a batch already on the device and normalised
  (its pre/post-processors are not timed); bf16 runs under ``torch.autocast``
  (its code creates fp32 tensors internally, so casting the weights alone fails).
* ours: ``PolicyEngine.step`` (observation copy into the static inputs,
  normalisation, the step, unnormalisation, boundary commit with its rollback
  record, the final synchronisation), with CUDA graphs on a GPU; bf16 casts the
  networks (``cast_networks``). The replan-or-pop choice is made on the host.
* capsules: ``snapshot`` / ``restore`` of the policy state (device tier) vs a
  device-to-device copy of the same bytes, each timed host-side with a
  synchronisation (median).

    python -m benchmarks.policies --out docs/benchmarks/lerobot_policies_h200.md \
        --png docs/benchmarks/lerobot_policies_h200.png --json docs/benchmarks/lerobot_policies_h200.json
    python -m benchmarks.policies --size cpu --episodes 2   # this CPU, a smaller UNet and camera
    python -m benchmarks.policies --size smoke              # tiny shapes: checks the script runs
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402


PERIOD_MS = 20.0          # a 50 Hz controller's step period


def make_checkpoint(kind: str, directory: Path, size: str, cameras: tuple[str, ...] = (),
                    hw: tuple[int, int] | None = None, joints: int | None = None, **overrides):
    """A LeRobot policy at a realistic size (ALOHA ACT, PushT Diffusion), saved as a checkpoint.

    ``size``: "smoke" (tiny), "cpu" (a CPU-sized camera / UNet) or "full".
    ``cameras``, ``hw``, ``joints`` (state and action size) and ``overrides`` (config fields)
    change the default shape, e.g. the two-camera ACT of ``robot_rate``."""
    from lerobot_reference import lerobot, randomize_, save_checkpoint, image_stats, vector_stats
    lerobot()
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    gen = torch.Generator().manual_seed(1)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig as Config
        from lerobot.policies.act.modeling_act import ACTPolicy as Policy
        from lerobot.policies.act.processor_act import make_act_pre_post_processors as processors
        default_hw, state, action = {"smoke": (48, 64), "cpu": (240, 320)}.get(size, (480, 640)), 14, 14
        extra = dict(chunk_size=100, n_action_steps=100, pretrained_backbone_weights=None)
        if size == "smoke":
            extra.update(dim_model=32, n_heads=4, dim_feedforward=64, chunk_size=10, n_action_steps=10)
        camera = "observation.images.top"
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig as Config
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy as Policy
        from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors as processors
        default_hw, state, action = (96, 96), 2, 2
        extra = dict(n_obs_steps=2, horizon=16, n_action_steps=8, crop_shape=(84, 84), noise_scheduler_type="DDIM",
                     num_train_timesteps=100, num_inference_steps=10, pretrained_backbone_weights=None)
        if size == "smoke":
            extra.update(down_dims=(16, 32), diffusion_step_embed_dim=16, n_groups=4, kernel_size=3)
        elif size == "cpu":
            extra.update(down_dims=(128, 256, 512))
        camera = "observation.image"
    hw = hw or default_hw
    state, action = (joints, joints) if joints else (state, action)
    extra.update(overrides)
    cameras = cameras or (camera,)
    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state,)),
              **{c: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *hw)) for c in cameras}}
    config = Config(input_features=inputs, device="cpu",
                    output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action,))},
                    normalization_mapping={"VISUAL": NormalizationMode.MEAN_STD, "STATE": NormalizationMode.MIN_MAX,
                                           "ACTION": NormalizationMode.MIN_MAX}, **extra)
    torch.manual_seed(0)
    policy = Policy(config)
    randomize_(policy, 0)
    stats = {"observation.state": vector_stats("MIN_MAX", state, gen),
             **{c: image_stats("MEAN_STD", gen) for c in cameras}, "action": vector_stats("MIN_MAX", action, gen)}
    save_checkpoint(policy, config, stats, directory, processors)
    obs = {"observation.state": torch.randn(state, generator=gen),
           **{c: torch.rand(3, *hw, generator=gen) for c in cameras}}
    return policy.eval(), obs


def lerobot_will_replan(policy) -> bool:
    """Whether LeRobot's next ``select_action`` predicts a chunk (its action queue is empty)."""
    queue = getattr(policy, "_action_queue", None)
    if queue is None:
        queue = policy._queues["action"]
    return len(queue) == 0


def lerobot_episode(policy, batches: list[dict], device: torch.device, dtype: torch.dtype, steps: int) -> dict:
    """One episode from ``reset()``: per-step ms and whether each step replanned."""
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    times, replans = [], []
    with torch.no_grad(), autocast:
        t_start = time.perf_counter()
        policy.reset()
        for i in range(steps):
            replans.append(lerobot_will_replan(policy))
            t0 = time.perf_counter()
            policy.select_action(dict(batches[i % len(batches)]))
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        total = (time.perf_counter() - t_start) * 1e3
    return {"episode_ms": total, "times": times, "replans": replans}


def our_episode(engine: PolicyEngine, observations: list[dict], steps: int) -> dict:
    times, replans = [], []
    t_start = time.perf_counter()
    engine.capsules.reset()
    for i in range(steps):
        replan = engine.next_step_replans()          # host mirror: no device read
        replans.append(True if replan is None else replan)
        t0 = time.perf_counter()
        engine.step(observations[i % len(observations)])
        times.append((time.perf_counter() - t0) * 1e3)
    total = (time.perf_counter() - t_start) * 1e3
    return {"episode_ms": total, "times": times, "replans": replans}


def capsule_times(engine: PolicyEngine, device: torch.device, copy_bytes: int | None = None) -> dict:
    """Median ``snapshot`` / ``restore`` of the live state vs one device copy of ``copy_bytes``
    (default: the whole arena; SmolVLA passes its live bytes, a capsule copies only the live KV rows)."""
    snap, rest, floor = [], [], []
    engine.capsules.snapshot("bench", overwrite=True)
    src = engine.arena.block[: engine.arena.nbytes if copy_bytes is None else copy_bytes]
    dst = torch.empty_like(src)
    for _ in range(50):
        t0 = time.perf_counter()
        engine.capsules.snapshot("bench", overwrite=True)
        snap.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        engine.capsules.restore("bench")
        rest.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        floor.append((time.perf_counter() - t0) * 1e3)
    return {"state_bytes": engine.arena.nbytes, "live_bytes": engine.arena.live_nbytes(), "copy_bytes": src.numel(),
            "snapshot_ms": percentile(snap, 50), "restore_ms": percentile(rest, 50),
            "copy_floor_ms": percentile(floor, 50)}


def summarize(episodes: list[dict]) -> dict:
    """Median episode time, replan / pop percentiles and the share of steps over the 20 ms period."""
    times = [t for e in episodes for t in e["times"]]
    replan = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if r]
    pop = [t for e in episodes for t, r in zip(e["times"], e["replans"]) if not r]
    def pct(xs: list[float], q: float) -> float:
        return percentile(xs, q) if xs else float("nan")
    return {"episode_ms": percentile([e["episode_ms"] for e in episodes], 50),
            "episodes": [round(e["episode_ms"], 3) for e in episodes],
            "replan_p50_ms": pct(replan, 50), "replan_p99_ms": pct(replan, 99), "replans": len(replan),
            "pop_p50_ms": pct(pop, 50), "pop_p99_ms": pct(pop, 99), "pops": len(pop),
            "over_period": sum(t > PERIOD_MS for t in times) / max(len(times), 1)}


def observation_variants(obs: dict, device: torch.device, n: int = 4) -> list[dict]:
    """``n`` slightly perturbed copies of ``obs`` on ``device`` (images stay in [0, 1])."""
    gen = torch.Generator().manual_seed(5)
    return [{k: ((v + 0.01 * torch.randn(v.shape, generator=gen)).clamp(0, 1) if v.dim() == 3 else
                 v + 0.1 * torch.randn(v.shape, generator=gen)).to(device) for k, v in obs.items()}
            for _ in range(n)]


def alternate(name: str, ref, batches: list[dict], engine: PolicyEngine, ours_obs: list[dict],
              device: torch.device, dtype: torch.dtype, steps: int, episodes: int, warmup: int = 1) -> dict:
    """Alternating episodes, LeRobot then ours (``warmup`` of each first, not counted): ``summarize``
    of each side, and the error of a side that failed (the other keeps measuring)."""
    runs: dict[str, list[dict]] = {"lerobot": [], "ours": []}
    errors: dict[str, str] = {}
    for i in range(episodes + warmup):
        for who in ("lerobot", "ours"):
            if who in errors:
                continue
            try:
                e = (lerobot_episode(ref, batches, device, dtype, steps) if who == "lerobot"
                     else our_episode(engine, ours_obs, steps))
            except Exception as exc:           # report, keep measuring the other side
                errors[who] = f"{type(exc).__name__}: {exc}"
                print(f"{name}: {who} failed: {errors[who]}", flush=True)
                continue
            if i >= warmup:
                runs[who].append(e)
    return {**{who: summarize(eps) for who, eps in runs.items() if eps}, "errors": errors}


def compare(kind: str, policy, obs: dict, directory: Path, device: torch.device, dtype: torch.dtype,
            steps: int, episodes: int, tmp: Path, warmup: int = 1) -> dict:
    """``alternate`` over our engine of the checkpoint and LeRobot's policy; the capsule times."""
    ours_obs = observation_variants(obs, device)
    batches = [{k: v.unsqueeze(0) for k, v in o.items()} for o in ours_obs]
    ref = policy.to(device)
    engine = PolicyEngine(load_lerobot_policy(directory, dtype=dtype), device=device,
                          cuda_graph=device.type == "cuda", directory=str(tmp))
    try:
        result = alternate(f"{kind} {dtype}", ref, batches, engine, ours_obs, device, dtype, steps, episodes, warmup)
        result["capsule"] = capsule_times(engine, device)
    finally:
        engine.close()
        ref.to("cpu")
    return result


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU only ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs), torch {torch.__version__}"


def table_rows(results: dict[str, dict]) -> list[dict]:
    """One flat row per ``alternate`` result: episode times, speed-up, replan / pop percentiles."""
    nan = float("nan")
    rows = []
    for name, r in results.items():
        lr, ours = r.get("lerobot", {}), r.get("ours", {})
        rows.append({"policy": name, "episode_lerobot_ms": lr.get("episode_ms", nan),
                     "episode_ours_ms": ours.get("episode_ms", nan),
                     "speedup": lr.get("episode_ms", nan) / ours.get("episode_ms", nan),
                     **{f"{who}_{k}": d.get(k, nan) for who, d in (("lerobot", lr), ("ours", ours))
                        for k in ("replan_p50_ms", "replan_p99_ms", "pop_p50_ms", "pop_p99_ms", "over_period")},
                     "errors": r.get("errors", {})})
    return rows


def table_lines(rows: list[dict], results: dict[str, dict]) -> list[str]:
    """Markdown: the episode table of ``table_rows``, the failures, the capsule table."""
    lines = ["| policy | episode LeRobot | episode ours | speed-up | replan p50 / p99 LeRobot | replan p50 / p99 ours "
             "| pop p50 / p99 LeRobot | pop p50 / p99 ours | steps > 20 ms LeRobot / ours |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['episode_lerobot_ms']:.1f} | {r['episode_ours_ms']:.1f} | {r['speedup']:.2f}x | "
            f"{r['lerobot_replan_p50_ms']:.3f} / {r['lerobot_replan_p99_ms']:.3f} | "
            f"{r['ours_replan_p50_ms']:.3f} / {r['ours_replan_p99_ms']:.3f} | "
            f"{r['lerobot_pop_p50_ms']:.3f} / {r['lerobot_pop_p99_ms']:.3f} | "
            f"{r['ours_pop_p50_ms']:.3f} / {r['ours_pop_p99_ms']:.3f} | "
            f"{100 * r['lerobot_over_period']:.1f} % / {100 * r['ours_over_period']:.1f} % |")
    failures = [f"{r['policy']}: {who} failed: {err}" for r in rows for who, err in r["errors"].items()]
    if failures:
        lines += [""] + [f"- {f}" for f in failures]
    lines += ["", "| policy | state bytes | live bytes | snapshot ms | restore ms | copy floor ms | bytes copied |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        c = r["capsule"]
        lines.append(f"| {name} | {c['state_bytes']} | {c['live_bytes']} | {c['snapshot_ms']:.4f} | "
                     f"{c['restore_ms']:.4f} | {c['copy_floor_ms']:.4f} | {c['copy_bytes']} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode")
    ap.add_argument("--episodes", type=int, default=3, help="timed episodes per side (after one warm-up)")
    ap.add_argument("--size", choices=("full", "cpu", "smoke"), default="full",
                    help="full: ALOHA ACT 480x640, PushT Diffusion; cpu: ACT 240x320, UNet (128, 256, 512); "
                         "smoke: tiny shapes")
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--policies", default="act,diffusion")
    ap.add_argument("--out", type=Path, help="markdown table")
    ap.add_argument("--png", type=Path, help="bar chart of episode times")
    ap.add_argument("--json", type=Path, help="raw numbers")
    args = ap.parse_args()
    nan = float("nan")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and args.size == "full":
        sys.exit("the full size needs a CUDA GPU (use --size cpu or --size smoke on a CPU)")
    steps = 12 if args.size == "smoke" else args.steps
    episodes = 1 if args.size == "smoke" else args.episodes
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.policies.split(","):
            directory = Path(tmp) / kind
            policy, obs = make_checkpoint(kind, directory, args.size)
            for dtype in dtypes:
                name = f"{kind} {str(dtype).removeprefix('torch.')}"
                results[name] = compare(kind, policy, obs, directory, device, dtype, steps, episodes,
                                        Path(tmp) / f"caps_{kind}_{dtype}", args.warmup)
                print(json.dumps({name: results[name]}), flush=True)
    rows = table_rows(results)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (nan, nan, nan)
    lines = ["# LeRobot policies over whole episodes: our engine vs LeRobot eager select_action", "",
             f"Machine: {machine(device)}. Size: {args.size}. {steps} steps per episode from a reset, median of "
             f"{episodes} episodes per side (after {args.warmup} warm-up each), sides alternating; times in ms; load average "
             f"at the end {load[0]:.2f}.", "", *table_lines(rows, results)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(device), "size": args.size, "steps": steps,
                                         "episodes": episodes, "load_average": load, "rows": rows,
                                         "results": results}, indent=1))
    if args.png:
        plot(rows, machine(device), steps, args.png)


def plot(rows: list[dict], title: str, steps: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    x = range(len(rows))
    labels = [r["policy"] for r in rows]
    ax1.bar([i - 0.2 for i in x], [r["episode_lerobot_ms"] for r in rows], 0.4, label="LeRobot select_action (eager)")
    ax1.bar([i + 0.2 for i in x], [r["episode_ours_ms"] for r in rows], 0.4, label="ours (PolicyEngine)")
    ax1.set_xticks(list(x), labels, fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel(f"episode time, {steps} steps from reset (ms)")
    ax1.legend(fontsize=8)
    width = 0.2
    for j, (key, label) in enumerate((("lerobot_replan_p50_ms", "LeRobot replan"), ("ours_replan_p50_ms", "ours replan"),
                                      ("lerobot_pop_p50_ms", "LeRobot pop"), ("ours_pop_p50_ms", "ours pop"))):
        ax2.bar([i + (j - 1.5) * width for i in x], [r[key] for r in rows], width, label=label)
    ax2.axhline(PERIOD_MS, color="grey", linestyle="--", linewidth=0.8)
    ax2.set_xticks(list(x), labels, fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("p50 step latency (ms); dashed: 20 ms")
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
