"""GR00T N1.5 over whole episodes at the published size: our engine (captured) vs LeRobot eager and LeRobot compiled.

Same GPU, same weights, same observations: LeRobot 0.4.4 builds ``GR00TN15`` / ``GrootPolicy`` at the sizes of
nvidia/GR00T-N1.5-3B (SigLIP So400m/14 at 224 px, Qwen3-1.7B cut at layer 12, a 16-block DiT, horizon 16, 4
flow steps; seeded random weights, no hub, the Eagle assets a stand-in: ``test/groot_reference``) and saves it.
LeRobot's GR00T needs transformers 4.57.6, so every LeRobot side runs in a process of its own
(``groot_reference.bench``), one after the other on the same GPU; ours runs in this process. 2 cameras at
224 x 224 (``--smoke``: the tiny test sizes, ``Case``'s frames, a replan every 8 steps), a 6-D state and a
5-D action; the task string below; float32 (TF32 off), and with ``--dtypes bfloat16`` bf16 as LeRobot's ``use_bf16``
runs it (autocast over the float32 weights) on every side, ours included (``GrootPolicy.cast``), in a row of its own
checked against the same float32 reference with ``GROOT_BOUNDS``' bf16 bound.

* LeRobot eager: ``select_action`` on batches its preprocessor made (not timed), ``use_bf16`` set by the row,
  the Eagle attention ``sdpa`` (flash-attn is not installed), replan ``p`` given our counter stream's noise
  (``ops.counter_rng.normal(0, p)``, shape (1, horizon, max_action_dim)) in place of its ``torch.randn``;
* LeRobot compiled: the same with ``torch.compile`` (``--compile-mode``, default ``reduce-overhead``) of the Eagle
  backbone and the DiT (GR00T has no ``compile_model`` switch; ``groot_reference.bench`` says what is compiled
  and why), warmed up until an episode compiles nothing; the first episode, compile included, reported apart;
* ours-fast: ``PolicyEngine.step`` with ``cuda_graph=True`` on a GPU (replan, pop, redraw and replan-from-context
  graphs), ``numerics: fast`` (fixed shapes, no host read; ``models/lerobot/groot/modeling_groot.py``).

Each side: warm-up, then ``--episodes`` timed episodes of ``--steps`` steps from a reset (GR00T replans every
``n_action_steps``, 16 by default: 200 steps = 13 replans), every step timed up to a synchronisation; replans
and pops apart (p50 / p99); device memory. **Every side checked, in every invocation** (``benchmarks.action_checks``,
``GROOT_BOUNDS``): its checked episode (seed 0) against LeRobot eager float32 (TF32 off) on the same checkpoint,
observations and noise, by relative RMS and max of the flow displacement (the actions less what the noise alone
gives: ``check_displacement`` says why), within a bound declared before the run; the reference comes
from a cache keyed by the checkpoint's content hash, computed when absent. The self-test side
``selftest-skip-dit-block`` (ours-fast with the DiT's middle block skipped) must fail ours-fast's bound. The run
exits 1 when a side fails its check, the self-test passes, a side fails to run or the reference is missing.
Ours also: a fork's new noise draw (``redraw``: the action head only), a re-instruction from a fork
(``reinstruct``: language model + action head, no SigLIP) against a cold replan, and the capsule times.

    python -m benchmarks.groot --build /tmp/groot_2cam
    python -m benchmarks.groot --checkpoint /tmp/groot_2cam --sides ours-fast,selftest-skip-dit-block,lerobot \\
        --json docs/benchmarks/groot_h100.json --out docs/benchmarks/groot_h100.md
    python -m benchmarks.groot --checkpoint /tmp/groot_2cam --sides compiled --json J --out M
    python -m benchmarks.groot --checkpoint /tmp/groot_2cam --dtypes bfloat16 --json J --out M
    python -m benchmarks.groot --smoke       # tiny sizes, CPU allowed: checks the script runs (test_bench_groot.py)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the GR00T reference helpers (a checkout's test/)

from benchmarks.pi0 import TASK, check_row, engine_side, write_observations  # noqa: E402
from benchmarks.policies import machine  # noqa: E402
from benchmarks.race import summarize  # noqa: E402
from benchmarks.race_rows import choose_sides, engine_cells, load_rows, print_row, report, write_rows  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402

POLICY = "groot"                                  # benchmarks.action_checks.POLICY_BOUNDS
SIDES = ("ours-fast", "lerobot", "compiled")
#: deliberately broken forms of ours-fast (``break_policy``): each must fail ours-fast's bound
SELF_TEST_SIDES = ("selftest-skip-dit-block",)
DTYPES = ("float32", "bfloat16")               # bfloat16: LeRobot's use_bf16 (autocast over float32 weights)


def break_policy(policy, form: str):
    """``form`` applied to a ``fast`` GR00T (its DiT's middle block's ``forward`` shadowed on the instance by the
    identity, so graphs captured afterwards run the broken form); returns the undo. Benchmark-only."""
    if form != "selftest-skip-dit-block":
        raise ValueError(f"unknown self-test {form!r}: one of {SELF_TEST_SIDES}")
    blocks = policy._groot_model.action_head.model.transformer_blocks
    block = blocks[len(blocks) // 2]
    object.__setattr__(block, "forward", lambda x, *args, **kwargs: x)
    return lambda: object.__delattr__(block, "forward")


def build(directory: Path, smoke: bool, threads: int = 1) -> None:
    """LeRobot's GR00T at the published (``smoke``: tiny) sizes, written as a checkpoint (its process); no episode."""
    from groot_reference import PUBLISHED, TINY, Case, run_reference
    case = Case(str(directory), sizes=TINY if smoke else PUBLISHED, cameras=2,
                hw=Case.hw if smoke else (224, 224), n_action_steps=8 if smoke else 16, attn="sdpa", steps=0,
                task=TASK)
    run_reference([case], directory.parent, timeout_s=3600, threads=threads)
    (directory / "bench_case.json").write_text(json.dumps({"kind": POLICY, "cameras": 2, "smoke": smoke}))


def write_noise(directory: Path, path: Path, steps: int) -> torch.Tensor:
    """Our counter stream's noise for every replan an episode of ``steps`` makes (seed 0), for LeRobot's process;
    returns it, (plans, 1, horizon, max_action_dim)."""
    from safetensors.torch import save_file

    from flashrt_ros.ops.counter_rng import normal
    cfg = json.loads((directory / "config.json").read_text())
    sizes = json.loads((directory / "groot_sizes.json").read_text())["sizes"]
    h, m = sizes["action_horizon"], cfg["max_action_dim"]
    plans = -(-steps // cfg["n_action_steps"])
    noise = torch.stack([normal(torch.tensor(0), torch.tensor(p), h * m).view(1, h, m) for p in range(plans)])
    save_file({"noise": noise.contiguous()}, str(path))
    return noise


def noise_actions(directory: Path, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """The episode's actions if the flow moved nothing: step ``i`` pops row ``horizon - n + i % n`` of plan
    ``i // n``'s noise (the queue keeps the chunk's last ``n_action_steps`` rows), unnormalised (min-max, affine)
    with the checkpoint's action statistics. (steps, action)."""
    from safetensors.torch import load_file

    from flashrt_ros.models.lerobot.groot.processor_groot import unnormalize_action
    n = json.loads((directory / "config.json").read_text())["n_action_steps"]
    st = load_file(str(directory / "policy_postprocessor_step_0_groot_action_unpack_unnormalize_v1.safetensors"))
    h = noise.shape[2]
    rows = torch.stack([noise[i // n, 0, h - n + i % n] for i in range(steps)])
    return unnormalize_action(rows, st["action.min"].float(), st["action.max"].float())


def check_displacement(row: dict, refs: dict, baseline: torch.Tensor, chunk: int, dtype: str) -> list[str]:
    """``benchmarks.pi0.check_row`` (``GROOT_BOUNDS``) on every side's flow displacement, its actions less
    ``baseline`` (``noise_actions``), against the reference's; the raw actions' errors kept beside
    (``check["actions"]``). Why: with seeded random weights the flow moves GR00T's actions by about 1 % of
    the noise it starts from (tiny size, CPU: the whole velocity zeroed changed the actions by 7e-3 RMS), so
    errors relative to the actions would let a network that computes nothing pass a 1e-3 bound; relative to
    the displacement, the part the network computes, they cannot."""
    from benchmarks.action_checks import errors
    shifted = {k: (v - baseline[:len(v)] if isinstance(v, torch.Tensor) else v) for k, v in refs.items()}
    view = {}
    for side, s in row.items():
        a = s.get("actions")
        view[side] = {**s, "actions": a - baseline[:len(a)]} if isinstance(a, torch.Tensor) else s
    failures = check_row(view, dtype, shifted, chunk, POLICY)
    for side, s in view.items():
        if "check" in s:
            row[side]["check"] = s["check"]
            a, ref = row[side].get("actions"), refs.get("float32")
            if isinstance(a, torch.Tensor) and isinstance(ref, torch.Tensor):
                row[side]["check"]["actions"] = errors(a, ref, chunk)
    return failures


def lerobot_side(directory: Path, compiled: bool, args, obs_file: Path, noise_file: Path, device: str, tmp: Path,
                 episodes: int | None = None, dtype: str = "float32") -> dict:
    """One LeRobot side in the GR00T reference process: ``summarize`` of its episodes, its checked actions, its
    peak. ``episodes=0``: only the checked episode (the reference of the checks)."""
    from groot_reference import reference_env
    from safetensors.torch import load_file
    name = f"lerobot{' compiled' if compiled else ''} {dtype}"
    out = tmp / f"{name.replace(' ', '_')}.json"
    n = args.episodes if episodes is None else episodes
    spec = dict(name=name, directory=str(directory), compile_model=compiled, compile_mode=args.compile_mode,
                device=device, observations=str(obs_file), noise=str(noise_file), task=TASK, steps=args.steps,
                episodes=n, warmup=args.warmup if n else 0, check_steps=args.check_steps, out=str(out),
                no_tf32=True, compile_warmup_max=6, attn="sdpa", threads=args.threads, use_bf16=dtype == "bfloat16")
    spec_file = tmp / f"{name.replace(' ', '_')}_spec.json"
    spec_file.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "groot_reference.bench", str(spec_file)],
                          env=reference_env(tmp / "groot_reference_home"), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=args.timeout)
    print(proc.stdout[-2000:], end="", flush=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    raw = json.loads(out.read_text())
    result = summarize(raw["runs"], ()) if raw["runs"] else {}
    return {**result, "peak_gib": raw["peak_bytes"] / 2**30, "first_episode_ms": raw["first_episode_ms"],
            "warmup": raw.get("warmup"), "load_s": raw.get("load_s"), "compiled": raw.get("compiled"),
            "process_s": time.perf_counter() - t0,
            "actions": load_file(str(out.with_suffix(".safetensors")))["actions"]}


def our_side(directory: Path, obs: list[dict], args, device: torch.device, tmp: Path, selftest: str = "",
             dtype: str = "float32") -> dict:
    """``benchmarks.pi0.engine_side`` for the checkpoint in ``numerics: fast`` and ``dtype`` (bfloat16: LeRobot's
    autocast, ``GrootPolicy.cast``). ``selftest``: a deliberately broken form (``break_policy``), only its checked
    episode."""
    def load() -> torch.nn.Module:
        policy = load_lerobot_policy(directory, dtype=getattr(torch, dtype), numerics="fast")
        if selftest:
            break_policy(policy, selftest)
        return policy
    return engine_side(load, obs, args, device, tmp, selftest)[0]


def references(directory: Path, args, obs_file: Path, noise_file: Path, device: str, tmp: Path) -> dict:
    """The float32 reference (LeRobot eager, TF32 off) from the cache when this checkpoint and case ran before,
    else computed now (and cached); its error text when it could not be computed."""
    from benchmarks.action_checks import FLOAT32_REFERENCE, ReferenceCache
    cache = ReferenceCache(args.reference_cache)
    spec = {"reference": FLOAT32_REFERENCE, "kind": POLICY, "task": TASK, "seed": 0, "device": device,
            "observations": "write_observations(seed=3, n=4)", "noise": "counter_rng.normal(0, plan)",
            "check_steps": args.check_steps, "attn": "sdpa"}
    key = cache.key(directory, spec)
    actions = cache.load(key)
    if actions is not None:
        print(f"[groot] {FLOAT32_REFERENCE} reference from the cache ({cache.root}/{key})", flush=True)
        return {FLOAT32_REFERENCE: actions}
    side = lerobot_side(directory, False, args, obs_file, noise_file, device, tmp, episodes=0)
    if "error" in side:
        return {FLOAT32_REFERENCE: side["error"][-1000:]}
    cache.store(key, side["actions"], spec)
    print(f"[groot] {FLOAT32_REFERENCE} reference computed and cached ({cache.root}/{key})", flush=True)
    return {FLOAT32_REFERENCE: side["actions"]}


def markdown(rows: dict, machine_name: str, failures: list[str]) -> str:
    nan = float("nan")
    lines = ["# GR00T N1.5 over whole episodes: our engine (captured) vs LeRobot eager and LeRobot compiled", "",
             f"Machine: {machine_name}. float32 (TF32 off) or bf16 (LeRobot's use_bf16 autocast). Times in ms: "
             "median episode (from a reset), replan and pop p50 / p99; peak device memory in GiB. Check "
             "(`benchmarks/action_checks.py`, `GROOT_BOUNDS`, declared before the run): the checked episode's flow "
             "displacement (its actions less what the noise alone gives, `benchmarks.groot.check_displacement`), "
             "relative RMS / relative max against LeRobot eager float32's on the same checkpoint, observations "
             "and noise; the raw actions' relative RMS beside it; a self-test side must FAIL its bound.", "",
             "| policy | cameras | dtype | side | episode | replan p50 / p99 | pop p50 / p99 | peak GiB | "
             "check: displacement rms / max (bound) | actions rms | verdict | replan speed-up of ours-fast |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        kind, cameras, dtype = key.split("|")
        fast = r.get("ours-fast", {})
        for side in SIDES + SELF_TEST_SIDES:
            s = r.get(side)
            if s is None:
                continue
            if "error" in s:
                lines.append(f"| {kind} | {cameras} | {dtype} | {side} | failed: {s['error'][-200:]!r} "
                             "||||||| FAIL ||")
                continue
            c = s.get("check", {})
            verdict = ("PASS" if c.get("passed") else "FAIL") + (" (self-test: must fail)" if side in SELF_TEST_SIDES
                                                                  else "")
            e, b = c.get("errors", {}), c.get("bound", {})
            checked = (f"{e.get('rms', nan):.2e} / {e.get('max', nan):.2e} ({b.get('rms', nan):.2g} / "
                       f"{b.get('max', nan):.2g})" if e else c.get("why", "not checked"))
            raw = c.get("actions", {}).get("rms", nan)
            if "replan_p50_ms" not in s:
                lines.append(f"| {kind} | {cameras} | {dtype} | {side} | | | | | {checked} | {raw:.2e} | {verdict} | |")
                continue
            speed = (f"{s['replan_p50_ms'] / fast['replan_p50_ms']:.2f}x" if fast.get("replan_p50_ms")
                     and side != "ours-fast" else "-")
            lines.append(f"| {kind} | {cameras} | {dtype} | {side} | {s['episode_ms']:.1f} | "
                         f"{s['replan_p50_ms']:.2f} / {s['replan_p99_ms']:.2f} | {s['pop_p50_ms']:.3f} / "
                         f"{s['pop_p99_ms']:.3f} | {s.get('peak_gib', nan):.2f} | {checked} | {raw:.2e} | {verdict} "
                         f"| {speed} |")
    lines += ["", "| policy | cameras | dtype | ours | redraw p50 | cold replan p50 | re-instruct (fork) p50 | "
              "snapshot / restore ms | weights / engine / peak GiB | load s / capture s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        kind, cameras, dtype = key.split("|")
        o = r.get("ours-fast")
        if not o or "error" in o:
            continue
        lines.append(f"| {kind} | {cameras} | {dtype} | ours-fast | {engine_cells(o)} |")
    if failures:
        lines += ["", "## Checks failed", ""] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write the checkpoint here and stop")
    ap.add_argument("--checkpoint", type=Path, help="a checkpoint --build wrote (else one is built in a temp dir)")
    ap.add_argument("--sides", help=f"any of {SIDES + SELF_TEST_SIDES} (default: all; --smoke: all but compiled)")
    ap.add_argument("--dtypes", default="float32", help=f"comma-separated, of {DTYPES} (bfloat16: LeRobot's use_bf16 "
                    "autocast on both sides, checked against the float32 reference)")
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode (a replan every "
                    "n_action_steps)")
    ap.add_argument("--episodes", type=int, default=5, help="timed episodes per side")
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first (compiled: until "
                    "compiling stops, at least 2)")
    ap.add_argument("--check-steps", type=int, default=100, help="steps of the checked episode (seed 0)")
    ap.add_argument("--draws", type=int, default=10, help="timed redraws and re-instructions")
    ap.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode of LeRobot compiled")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per LeRobot process")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the LeRobot processes and of the "
                    "build (0: torch's default; the build: 1 unless given)")
    ap.add_argument("--reference-cache", type=Path, help="where references are kept (default: "
                    "$XDG_CACHE_HOME/flashrt/references); a reference is computed only when absent")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few steps (CPU allowed)")
    ap.add_argument("--out", type=Path, help="markdown table (all rows in --json)")
    ap.add_argument("--json", type=Path, help="rows, merged with what the file already holds")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    if args.smoke:
        args.steps, args.episodes, args.warmup, args.check_steps, args.draws = 17, 1, 0, 17, 2   # 3 replans of 8
    if args.build:
        build(args.build, args.smoke, args.threads or 1)
        return 0
    if device.type == "cuda":                      # float32 means float32 on both sides (the LeRobot ones: spec)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sides = choose_sides(args.sides, SIDES + SELF_TEST_SIDES, args.smoke)
    dtypes = args.dtypes.split(",")
    if any(d not in DTYPES for d in dtypes):
        sys.exit(f"--dtypes {args.dtypes}: each of {DTYPES}")
    failures: list[str] = []
    rows = load_rows(args.json)
    name = machine(device)

    def write() -> None:
        """Everything so far (a run cut short keeps the sides that finished)."""
        write_rows(rows, markdown(rows, name, failures), args.out, args.json, device)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        directory = args.checkpoint or tmp / "checkpoint"
        if args.checkpoint is None:
            build(directory, args.smoke, args.threads or 1)
        case = json.loads((directory / "bench_case.json").read_text())
        if case["smoke"]:
            name += " (smoke: tiny sizes)"
        obs_file, noise_file = tmp / "observations.safetensors", tmp / "noise.safetensors"
        obs = write_observations(directory, obs_file)
        noise = write_noise(directory, noise_file, max(args.steps, args.check_steps))
        baseline = noise_actions(directory, noise, args.check_steps)
        chunk = json.loads((directory / "config.json").read_text()).get("n_action_steps", 16)
        refs = references(directory, args, obs_file, noise_file, str(device), tmp)
        for dtype in dtypes:
            key = f"{POLICY}|{case['cameras']}|{dtype}"
            row = rows.setdefault(key, {})               # a split run adds its sides to the row
            for side in sides:
                if side.startswith("ours-") or side in SELF_TEST_SIDES:
                    try:
                        row[side] = our_side(directory, obs, args, device, tmp / "caps",
                                             selftest="" if side.startswith("ours-") else side, dtype=dtype)
                    except Exception as exc:                    # recorded and reported; the run goes on
                        import traceback
                        row[side] = {"error": traceback.format_exc()[-3000:]}
                        print(f"[groot] {side} {dtype} failed: {exc!r}", flush=True)
                else:
                    row[side] = lerobot_side(directory, side == "compiled", args, obs_file, noise_file, str(device),
                                             tmp, dtype=dtype)
                check_displacement({side: row[side]}, refs, baseline, chunk, dtype)   # the verdict in every write
                write()
            failures += check_displacement(row, refs, baseline, chunk, dtype)
            print_row(key, row)
            write()
    return report(markdown(rows, name, failures), failures, "groot")


if __name__ == "__main__":
    sys.exit(main())
