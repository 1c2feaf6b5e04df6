"""LeRobot ACT and Diffusion Policy over whole episodes: our engine vs LeRobot at its fastest, eager and compiled.

What a robot pays: an episode of ``--steps`` (200) control steps from a reset,
same device, same weights (LeRobot builds the policy with seeded random weights
at ALOHA-ACT and PushT-Diffusion sizes and saves it; we load that checkpoint
directory), fp32 and bf16. ``benchmarks.race`` races one precision: our engine
against every LeRobot mode of it (eager; ``torch.compile`` / its own
``compile_model`` with reduce-overhead and default; bf16 under autocast),
warmed up until compiling stops, sides alternating, the same host observations
and the same injected noise on both sides, the first chunk checked against
LeRobot eager fp32 (exit status 1 when ours is above the tolerance).

Timed per step on each side (host observation in, action on the host out):

* LeRobot: its pre-processor (batch dim, to the device, normalisation),
  ``select_action`` under ``torch.inference_mode()`` (and ``torch.autocast`` for
  bf16), its post-processor (unnormalisation, to the CPU): what ``lerobot_eval``
  runs per step.
* ours: ``PolicyEngine.step`` under ``torch.inference_mode()`` (validation, copy
  into the static inputs, the replan or pop graph with normalisation and
  unnormalisation inside, boundary commit with its rollback record, the
  synchronisation), then the action to the host. bf16 casts the networks.

Flags (both sides, recorded): ``lerobot_eval``'s cudnn.benchmark and TF32.
Every JSON carries ``benchmarks.provenance``.

    python -m benchmarks.policies --out docs/benchmarks/lerobot_policies_h200.md \
        --json docs/benchmarks/lerobot_policies_h200.json --time-budget-s 420      # the device race
    python -m benchmarks.policies --size cpu --steps 48 --episodes 3              # this CPU, smaller shapes
    python -m benchmarks.policies --size smoke                                    # tiny shapes: checks it runs
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the LeRobot reference helpers (a checkout's test/)

from benchmarks.lerobot_side import MODE_KEYS, LeRobotSide, Mode  # noqa: E402
from benchmarks.provenance import git_state, provenance, summary_line  # noqa: E402
from benchmarks.race import (RaceSettings, apply_eval_flags, eval_flags_restored, failures, race,  # noqa: E402
                             reference_chunk)
from benchmarks.race_report import TIMED, report  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402

PRECISIONS = {"float32": "fp32", "bfloat16": "bf16", "fp32": "fp32", "bf16": "bf16"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
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


def observation_variants(obs: dict, device: torch.device, n: int = 4) -> list[dict]:
    """``n`` slightly perturbed copies of ``obs`` on ``device`` (images stay in [0, 1])."""
    gen = torch.Generator().manual_seed(5)
    return [{k: ((v + 0.01 * torch.randn(v.shape, generator=gen)).clamp(0, 1) if v.dim() == 3 else
                 v + 0.1 * torch.randn(v.shape, generator=gen)).to(device) for k, v in obs.items()}
            for _ in range(n)]


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


def machine(device: torch.device) -> str:
    """One line naming the machine (kept for older callers; the JSON has ``provenance``)."""
    return summary_line(provenance(device))


def plan_noise(kind: str, ours: torch.nn.Module, seed: int, device: torch.device) -> Callable[[int], Any]:
    """Plan ``p``'s initial noise as our engine draws it for an episode seeded ``seed`` (cached on the device),
    in the shape LeRobot's ``select_action(noise=...)`` takes; ACT draws none."""
    if kind == "act":
        return lambda plan: None
    if kind == "diffusion":
        if any(step.sigma > 0 for step in ours.steps):
            raise ValueError("the race injects only the initial noise: use DDIM (DDPM adds noise at each step)")

        @functools.lru_cache(maxsize=None)
        def diffusion(plan: int) -> torch.Tensor:
            t = lambda x: torch.tensor(x, device=device)           # noqa: E731
            return ours.noise(t(seed), t(plan), 0).unsqueeze(0)
        return diffusion
    from flashrt_ros.ops.counter_rng import normal
    c = ours.cfg

    @functools.lru_cache(maxsize=None)
    def smolvla(plan: int) -> torch.Tensor:
        n = c.chunk_size * c.max_action_dim
        return normal(torch.tensor(seed, device=device), torch.tensor(plan, device=device), n).view(
            1, c.chunk_size, c.max_action_dim)
    return smolvla


def race_policy(kind: str, policy, directory: Path, observations: list[dict], precisions: Sequence[str],
                device: torch.device, s: RaceSettings, tmp: Path, extra: dict[str, Any] | None = None,
                prepare: Callable[[torch.nn.Module], None] | None = None,
                after: Callable[[PolicyEngine], dict] | None = None, device_budget_bytes: int = 64 << 20,
                live_capsule_bytes: bool = False,
                on_result: Callable[[str, dict], None] | None = None,
                numerics: Sequence[str] = ("exact",)) -> dict[str, dict]:
    """Race every precision of one policy: our engine (built per precision) against LeRobot's modes.

    ``prepare``: called on our policy before the engine is built (SmolVLA's
    instruction); ``after``: extra measurements on our engine, into its side's row
    (SmolVLA's redraw); ``on_result``: called with each finished race (the caller writes
    partial results, so a run cut short by a timeout still leaves its finished races);
    ``numerics``: one engine per numerics, each its own side (``ours-<numerics>`` when
    several, the first the headline's), each checked."""
    out: dict[str, dict] = {}
    policy = policy.eval().to(device)
    reference_side = LeRobotSide(kind, Mode("eager", "fp32", None, False, False), policy, directory, device, extra)
    chunk = min(policy.config.n_action_steps, s.steps)
    reference = None
    for precision in precisions:
        name = f"{kind} {precision}"
        engines: dict[str, PolicyEngine] = {}
        build_s: dict[str, float] = {}
        try:
            for n in numerics:
                side = "ours" if len(numerics) == 1 else f"ours-{n}"
                t0 = time.perf_counter()
                ours = load_lerobot_policy(directory, dtype=DTYPES[precision], numerics=n)
                if prepare is not None:
                    prepare(ours)
                engines[side] = PolicyEngine(ours, device=device, cuda_graph=device.type == "cuda",
                                             directory=str(tmp / f"caps_{kind}_{precision}_{n}"),
                                             device_budget_bytes=device_budget_bytes)
                build_s[side] = time.perf_counter() - t0
            first = next(iter(engines.values()))
            noise = plan_noise(kind, first.policy, s.seed, device)
            if reference is None:
                reference = reference_chunk(reference_side, observations, s.check_steps or chunk, noise, s.seed)
            result = race(kind, precision, policy, directory, engines, observations, noise, reference, device, s,
                          extra, chunk)
            result["ours_build_s"] = build_s if len(numerics) > 1 else build_s["ours"]
            result["capsule"] = capsule_times(first, device, first.arena.live_nbytes() if live_capsule_bytes
                                              else None)
            for side, engine in engines.items():
                if after is not None and side in result["sides"]:
                    result["sides"][side].update(after(engine))
        finally:
            for engine in engines.values():
                engine.close()
            engines.clear()
            ours = first = engine = None               # the device memory goes before the next precision's
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out[name] = result
        s.jobs_done += 1
        print(json.dumps({name: {k: v for k, v in result.items() if k != "sides"}}, default=str), flush=True)
        if on_result is not None:
            on_result(name, result)
    policy.to("cpu")
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode")
    ap.add_argument("--episodes", type=int, default=10, help="timed episodes per side")
    ap.add_argument("--size", choices=("full", "cpu", "smoke"), default="full",
                    help="full: ALOHA ACT 480x640, PushT Diffusion; cpu: ACT 240x320, UNet (128, 256, 512); "
                         "smoke: tiny shapes (12 steps, 2 episodes)")
    add_race_args(ap)
    ap.add_argument("--policies", default="act,diffusion")
    ap.add_argument("--out", type=Path, help="markdown report")
    ap.add_argument("--png", type=Path, help="bar chart of episode times")
    ap.add_argument("--json", type=Path, help="raw numbers with provenance")
    return ap.parse_args(argv)


def add_race_args(ap: argparse.ArgumentParser) -> None:
    """The options ``benchmarks.policies`` and ``benchmarks.smolvla`` share."""
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first (eager sides)")
    ap.add_argument("--compile-warmup-max", type=int, default=6,
                    help="at most this many warm-up episodes for a compiled LeRobot mode")
    ap.add_argument("--replans", type=int, default=50, help="replanning steps per side at least")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="precisions raced: float32, bfloat16")
    ap.add_argument("--lerobot-modes", default=None,
                    help=f"LeRobot modes to race (default: all of the precision): {', '.join(MODE_KEYS)}")
    ap.add_argument("--compile-mode", default="reduce-overhead",
                    help="torch.compile mode of the 'compiled' modes (LeRobot's compile_mode)")
    ap.add_argument("--inputs", choices=("host", "device"), default="host",
                    help="where observations start: host (what a robot hands over) or already on the device")
    ap.add_argument("--seed", type=int, default=7, help="the episodes' noise seed")
    ap.add_argument("--tol-fp32", type=float, default=None, help="first-chunk tolerance, fp32 (relative)")
    ap.add_argument("--tol-bf16", type=float, default=None, help="first-chunk tolerance, bf16 (relative)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads for both sides (default: torch's choice; on a shared 2-core machine 1 "
                         "keeps a descheduled thread from stalling every parallel op)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="wall-clock budget: compiled / optional LeRobot modes that would not fit are skipped (noted)")


def settings_from(args: argparse.Namespace, steps: int, episodes: int, replans: int) -> RaceSettings:
    """The race's settings from the shared options (``--threads`` applies here, before anything runs)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return RaceSettings(steps=steps, episodes=episodes, warmup=args.warmup,
                        compile_warmup_max=args.compile_warmup_max, replans=replans, seed=args.seed,
                        compile_mode=args.compile_mode,
                        lerobot_modes=tuple(args.lerobot_modes.split(",")) if args.lerobot_modes else None,
                        tolerances={"fp32": args.tol_fp32, "bf16": args.tol_bf16}, budget_s=args.time_budget_s)


def publish(args: argparse.Namespace, title: str, what: str, results: dict[str, dict], s: RaceSettings,
            device: torch.device, flags: dict, command: str, tail: Callable[[dict[str, dict]], str] | None = None,
            final: bool = True) -> list[str]:
    """Write the markdown (``--out``) and the JSON (``--json``) of ``results``; returns the check's failures.

    Called after every race with ``final=False`` (the page says how many races are done),
    then once at the end."""
    prov = provenance(device, flags)
    text = report(title, what, results, s, prov, command, args.inputs)
    if not final:
        text = text.replace("\n\n", f"\n\n**Partial: {len(results)} of {s.jobs_total} races done.**\n\n", 1)
    if tail is not None:
        text += tail(results)
    failed = failures(results)
    if failed:
        text += "\n## Check failed\n\n" + "\n".join(f"- {f}" for f in failed) + "\n"
    if final:
        print(text, flush=True)
    if args.out:
        args.out.write_text(text)
    if args.json:
        record = {"provenance": prov, "command": command, "size": what, "inputs": args.inputs, "timed": TIMED,
                  "settings": vars(s), "complete": final, "results": results, "failures": failed}
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    if final and getattr(args, "png", None) is not None and results:
        plot(results, summary_line(prov), s.steps, args.png)
    return failed


@eval_flags_restored()
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and args.size == "full":
        sys.exit("the full size needs a CUDA GPU (use --size cpu or --size smoke on a CPU)")
    smoke = args.size == "smoke"
    steps, episodes, replans = (12, 2, 4) if smoke else (args.steps, args.episodes, args.replans)
    git_state()                                    # the code that runs: read before anything else
    flags = apply_eval_flags(device)
    s = settings_from(args, steps, episodes, replans)
    precisions = [PRECISIONS[d] for d in args.dtypes.split(",")]
    kinds = args.policies.split(",")
    s.jobs_total = len(kinds) * len(precisions)
    inputs = torch.device("cpu") if args.inputs == "host" else device
    command = " ".join(["python -m benchmarks.policies", *(sys.argv[1:] if argv is None else argv)])
    title = "LeRobot ACT / Diffusion Policy over whole episodes: our engine vs LeRobot eager and compiled"
    results: dict[str, dict] = {}

    def partial(name: str, result: dict) -> None:
        results[name] = result
        publish(args, title, f"Size: {args.size}", results, s, device, flags, command, final=False)

    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            directory = Path(tmp) / kind
            policy, obs = make_checkpoint(kind, directory, args.size)
            observations = observation_variants(obs, inputs)
            race_policy(kind, policy, directory, observations, precisions, device, s, Path(tmp), on_result=partial)
    failed = publish(args, title, f"Size: {args.size}", results, s, device, flags, command)
    if failed:
        print("CHECK FAILED: " + "; ".join(failed), flush=True)
        return 1
    return 0


def plot(results: dict[str, dict], title: str, steps: int, path: Path) -> None:
    """Median episode per side (log scale), one group per policy and precision."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results)
    sides = list(dict.fromkeys(side for r in results.values() for side in r["sides"]))
    fig, ax = plt.subplots(figsize=(max(8, 2 * len(names)), 4.5))
    width = 0.8 / max(len(sides), 1)
    for j, side in enumerate(sides):
        xs = [i + (j - (len(sides) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [results[n]["sides"].get(side, {}).get("episode_ms", float("nan")) for n in names], width,
               label=side)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(f"median episode, {steps} steps from reset (ms)")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
