"""π0 / π0.5 over whole episodes at the published sizes: our engine (captured) vs LeRobot eager and LeRobot compiled.

Same GPU, same weights, same observations: LeRobot 0.4.4 builds ``PI0Policy`` /
``PI05Policy`` at the published sizes (PaliGemma 3B: SigLIP So400m/14 at 224 px
and Gemma 2B; a Gemma 300M expert; chunk 50, 10 flow steps; seeded random
weights, no hub) and saves it (``test/pi_reference``: LeRobot needs openpi's
patched transformers 4.53.2, so every LeRobot side runs in a process of its own,
one after the other on the same GPU; ours runs in this process). 2 or 3 cameras
at 224 x 224, an 8-D state and a 7-D action.

* LeRobot eager: ``select_action``'s queue logic around ``predict_action_chunk`` on
  batches its preprocessor made (not timed), in LeRobot's own ``dtype``
  (``"bfloat16"`` casts the model as LeRobot does), our noise passed in;
* LeRobot compiled: the same with its ``compile_model`` (``torch.compile`` of
  ``sample_actions``, mode ``--compile-mode``, default ``reduce-overhead``), warmed
  up until an episode compiles nothing (as the race); the first episode, compile
  included, is reported apart;
* ours-fast / ours-fp8 / ours-exact: ``PolicyEngine.step`` with ``cuda_graph=True`` (replan,
  pop, redraw and replan-from-context graphs), the networks in the same dtype, in
  each numerics (``docs/policies.md``); ``--profile`` adds the replan's kernel
  table and stage times (``benchmarks.pi_profile``).

Each side: warm-up, then ``--episodes`` timed episodes of ``--steps`` steps (200: 4
replans, 196 pops) from a reset, every step timed up to a synchronisation; replans
and pops apart (p50 / p99); device memory. **Every side checked, in every invocation**
(``benchmarks.action_checks``): its checked episode (our counter stream's noise, seed 0)
against LeRobot eager in float32 arithmetic (TF32 off) on the weights the side
computes with (the checkpoint's, or LeRobot's bf16 cast widened back for bf16
sides), by relative RMS and max over the episode, within a bound declared per
(side, dtype) before the run; the references come from a cache keyed by the
checkpoint's content hash, computed when absent. Self-test sides
(``selftest-skip-layer``, ``selftest-zero-head``: ours-fast deliberately broken)
must fail ours-fast's bound. The run exits 1 when a side fails its check, a
self-test passes, a side fails to run or a reference is missing. Ours
also: a fork's new noise draw (``redraw``), a re-instruction from a fork
(``reinstruct``: language model + expert, no vision tower) against a cold replan,
and the capsule times. The JSON and markdown are rewritten after every side (a run
cut short keeps what finished).

A whole run at the published size takes minutes (the checkpoint alone is ~13 GB
of fp32 written once; a compiled LeRobot's first episode takes minutes), so it can
be split: ``--build DIR`` writes the checkpoint once, ``--checkpoint DIR`` reuses
it, ``--sides`` picks the sides, and every run merges its rows into ``--json``
and rewrites ``--out`` from all rows so far:

    python -m benchmarks.pi0 --kind pi0 --cameras 2 --build /tmp/pi0_2cam
    python -m benchmarks.pi0 --checkpoint /tmp/pi0_2cam --sides ours-fast,ours-exact,lerobot --profile \\
        --json docs/benchmarks/pi0_h100.json --out docs/benchmarks/pi0_h100.md
    python -m benchmarks.pi0 --checkpoint /tmp/pi0_2cam --sides compiled \\
        --json docs/benchmarks/pi0_h100.json --out docs/benchmarks/pi0_h100.md
    python -m benchmarks.pi0 --smoke       # reduced sizes, CPU allowed: checks the script runs
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the π reference helpers (a checkout's test/)

from benchmarks.policies import capsule_times, machine  # noqa: E402
from benchmarks.race import summarize  # noqa: E402
from benchmarks.race_rows import choose_sides, engine_cells, load_rows, print_row, report, write_rows  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.engine.vla import reinstruct, set_instruction  # noqa: E402
from flashrt_ros.models.lerobot import load_lerobot_policy  # noqa: E402

TASK = "pick up the red cube and put it in the box"
OTHER_TASK = "open the drawer"
SIDES = ("ours-fast", "ours-fp8", "ours-exact", "lerobot", "compiled")
#: deliberately broken forms of ours-fast (``benchmarks.pi0_selftests``): each must fail ours-fast's bound
SELF_TEST_SIDES = ("selftest-skip-layer", "selftest-zero-head")


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
                 tmp: Path, episodes: int | None = None, widen: bool = False) -> dict:
    """One LeRobot side in the reference process: ``summarize`` of its episodes, its checked actions, its peak.
    ``episodes=0``: only the checked episode (a reference of the checks); ``widen``: loaded in ``dtype`` and run
    in float32 (the bf16-weights reference)."""
    from pi_reference import reference_env
    from safetensors.torch import load_file
    name = f"lerobot{' compiled' if compiled else ''} {dtype}{' widened' if widen else ''}"
    out = tmp / f"{name.replace(' ', '_')}.json"
    n = args.episodes if episodes is None else episodes
    spec = dict(name=name, directory=str(directory), kind=kind, dtype=dtype, compile_model=compiled,
                compile_mode=args.compile_mode, device=device, observations=str(obs_file), task=TASK,
                steps=args.steps, episodes=n, warmup=args.warmup if n else 0, check_steps=args.check_steps,
                out=str(out), no_tf32=True, compile_warmup_max=6, widen_to_float32=widen)
    spec_file = tmp / f"{name.replace(' ', '_')}_spec.json"
    spec_file.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pi_reference.bench", str(spec_file)], env=reference_env(),
                          cwd=str(ROOT), capture_output=True, text=True, timeout=args.timeout)
    print(proc.stdout[-2000:], end="", flush=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    raw = json.loads(out.read_text())
    result = summarize(raw["runs"], ()) if raw["runs"] else {}
    return {**result, "peak_gib": raw["peak_bytes"] / 2**30, "first_episode_ms": raw["first_episode_ms"],
            "warmup": raw.get("warmup"), "process_s": time.perf_counter() - t0,
            "actions": load_file(str(out.with_suffix(".safetensors")))["actions"]}


def engine_side(load: Callable[[], torch.nn.Module], obs: list[dict], args, device: torch.device, tmp: Path,
                selftest: str = "", **engine_kwargs) -> tuple[dict, torch.nn.Module, list[dict]]:
    """Our engine on the policy ``load()`` makes (π0 / π0.5 here, GR00T in ``benchmarks.groot``): episodes, the
    checked episode (seed 0), fork draw, re-instruction vs cold replan, capsules, device memory at each stage of
    the set-up. ``selftest``: a deliberately broken form, only its checked episode. Returns the result, the
    policy and the observations on ``device`` (for a profile after the engine is closed)."""
    gib = 2 ** 30
    memory = {}
    if device.type == "cuda":
        gc.collect()                                # the previous side's engine and graphs, if unreferenced
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        memory["start_gib"] = torch.cuda.memory_allocated() / gib      # > 0: the figures below include it
    t0 = time.perf_counter()
    policy = load()
    load_s = time.perf_counter() - t0
    policy.set_default_instruction(TASK)            # every episode (reset) starts with it
    if device.type == "cuda":
        policy.to(device)
        memory["weights_gib"] = torch.cuda.memory_allocated() / gib
    t0 = time.perf_counter()
    engine = PolicyEngine(policy, device=device, cuda_graph=device.type == "cuda", directory=str(tmp),
                          **engine_kwargs)
    capture_s = time.perf_counter() - t0
    if device.type == "cuda":
        memory.update(engine_gib=torch.cuda.memory_allocated() / gib, engine_peak_gib=torch.cuda.max_memory_allocated()
                      / gib)
    ours_obs = [{k: v.to(device) for k, v in o.items()} for o in obs]

    def checked() -> torch.Tensor:
        engine.capsules.reset(seed=0)
        return torch.stack([engine.step(ours_obs[i % len(ours_obs)]).cpu() for i in range(args.check_steps)])
    try:
        if selftest:
            return {"actions": checked(), "selftest": selftest}, policy, ours_obs
        runs = [our_episode(engine, ours_obs, args.steps) for _ in range(args.warmup + args.episodes)]
        result = summarize(runs[args.warmup:], ())
        result["actions"] = checked()
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
        if device.type == "cuda":
            memory["peak_gib"] = torch.cuda.max_memory_allocated() / gib
        result.update(redraw_p50_ms=percentile(redraw, 50), cold_replan_p50_ms=percentile(cold, 50),
                      reinstruct_p50_ms=percentile(fork, 50), peak_gib=memory.get("peak_gib", 0.0), memory=memory,
                      load_s=load_s, capture_s=capture_s,
                      capsule=capsule_times(engine, device, engine.arena.live_nbytes()))
    finally:
        engine.close()
    return result, policy, ours_obs


def our_side(directory: Path, dtype: torch.dtype, numerics: str, obs: list[dict], args, device: torch.device,
             tmp: Path, selftest: str = "") -> dict:
    """``engine_side`` for a π checkpoint in ``dtype`` and ``numerics``, and (``--profile``) the replan's kernels
    and stage times. ``selftest``: a deliberately broken form (``benchmarks.pi0_selftests``)."""
    def load() -> torch.nn.Module:
        policy = load_lerobot_policy(directory, dtype=dtype, numerics=numerics)
        if numerics != "exact":
            policy.fast.attention = args.attention
        if selftest:
            from benchmarks.pi0_selftests import break_policy
            break_policy(policy, selftest)
        return policy
    result, policy, ours_obs = engine_side(load, obs, args, device, tmp, selftest, device_budget_bytes=4 << 30)
    if args.profile and device.type == "cuda" and not selftest:
        from benchmarks.pi_profile import kernel_table, stage_times
        result["kernels"] = kernel_table(policy, ours_obs[0])
        result["stages"] = stage_times(policy, ours_obs[0])
        print(f"[pi0] ours {numerics} {dtype}: {result['kernels']['kernels']} kernels, "
              f"{result['kernels']['device_ms']:.2f} ms of device time; stages {result['stages']}", flush=True)
    return result


def references(directory: Path, case: dict, dtypes: list[str], args, obs_file: Path, device: str,
               tmp: Path) -> dict[str, torch.Tensor | str]:
    """The references the sides of ``dtypes`` are judged against (``benchmarks.action_checks``): from the cache
    when this checkpoint and case ran before, else LeRobot eager float32 now (and cached). A reference that could
    not be computed is its error text."""
    from benchmarks.action_checks import BF16_REFERENCE_ROPE, BF16_WEIGHTS_REFERENCE, FLOAT32_REFERENCE, ReferenceCache
    cache = ReferenceCache(args.reference_cache)
    needed = {FLOAT32_REFERENCE} | ({BF16_WEIGHTS_REFERENCE} if "bfloat16" in dtypes else set())
    out: dict[str, torch.Tensor | str] = {}
    for kind in sorted(needed):
        spec = {"reference": kind, "kind": case["kind"], "cameras": case["cameras"], "task": TASK, "seed": 0,
                "observations": "write_observations(seed=3, n=4)", "check_steps": args.check_steps,
                **({"rope": BF16_REFERENCE_ROPE} if kind == BF16_WEIGHTS_REFERENCE else {})}
        key = cache.key(directory, spec)
        actions = cache.load(key)
        if actions is None:
            widen = kind == BF16_WEIGHTS_REFERENCE
            side = lerobot_side(directory, case["kind"], "bfloat16" if widen else "float32", False, args, obs_file,
                                device, tmp, episodes=0, widen=widen)
            if "error" in side:
                out[kind] = side["error"][-1000:]
                continue
            actions = side["actions"]
            cache.store(key, actions, spec)
            print(f"[pi0] {kind} reference computed and cached ({cache.root}/{key})", flush=True)
        else:
            print(f"[pi0] {kind} reference from the cache ({cache.root}/{key})", flush=True)
        out[kind] = actions
    return out


def check_row(row: dict, dtype_name: str, refs: dict, chunk: int, policy: str = "pi0") -> list[str]:
    """Judge every side of the row (``benchmarks.action_checks.judge``, ``policy``'s bounds); returns the
    failures."""
    from benchmarks.action_checks import judge
    tensors = {k: v for k, v in refs.items() if isinstance(v, torch.Tensor)}
    failures = []
    for side, s in row.items():
        if side == "reference":
            continue
        if "error" in s:
            s["check"] = {"passed": False, "why": "the side failed to run"}
            failures.append(f"{side} {dtype_name} failed: {s['error'][-300:]}")
            continue
        actions = s.get("actions") if isinstance(s.get("actions"), torch.Tensor) else None
        s["check"] = judge(side, dtype_name, actions, tensors, chunk, policy)
        if not s["check"]["passed"]:
            missing = [f"{k}: {v[-200:]}" for k, v in refs.items() if isinstance(v, str)]
            failures.append(f"{side} {dtype_name}: {s['check']['why']}" + (f" ({'; '.join(missing)})" if missing
                                                                          else ""))
    return failures


def markdown(rows: dict, machine_name: str, failures: list[str]) -> str:
    nan = float("nan")
    lines = ["# π0 / π0.5 over whole episodes: our engine (captured) vs LeRobot eager and LeRobot compiled", "",
             f"Machine: {machine_name}. Times in ms: median episode (from a reset), replan and pop "
             "p50 / p99; peak device memory in GiB. Check (`benchmarks/action_checks.py`, bounds declared before "
             "the run): the checked episode's relative RMS / relative max against LeRobot eager in float32 "
             "arithmetic (TF32 off) on the weights the side computes with (`float32`, or `bfloat16-weights` for "
             "bf16 sides), then against the float32 reference; a self-test side must FAIL its bound.", "",
             "| policy | cameras | dtype | side | episode | replan p50 / p99 | pop p50 / p99 | peak GiB | "
             "check rms / max (bound) | vs float32 rms | verdict | replan speed-up of ours-fast |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        kind, cameras, dtype = key.split("|")
        fast = r.get("ours-fast", {})
        for side in SIDES + SELF_TEST_SIDES:
            s = r.get(side)
            if s is None:
                continue
            c = s.get("check", {})
            verdict = ("PASS" if c.get("passed") else "FAIL") + (" (self-test: must fail)" if side in SELF_TEST_SIDES
                                                                  else "")
            if "error" in s:
                lines.append(f"| {kind} | {cameras} | {dtype} | {side} | failed: {s['error'][-200:]!r} ||||||| FAIL ||")
                continue
            e, b = c.get("errors", {}), c.get("bound", {})
            checked = (f"{e.get('rms', nan):.2e} / {e.get('max', nan):.2e} ({b.get('rms', nan):.2g} / "
                       f"{b.get('max', nan):.2g} vs {b.get('reference', '?')})" if e else c.get("why", "not checked"))
            vs32 = c.get("vs_float32", e).get("rms", nan) if e else nan
            if "replan_p50_ms" not in s:
                lines.append(f"| {kind} | {cameras} | {dtype} | {side} | | | | | {checked} | {vs32:.2e} | {verdict} "
                             "| |")
                continue
            speed = (f"{s['replan_p50_ms'] / fast['replan_p50_ms']:.2f}x" if fast.get("replan_p50_ms")
                     and side != "ours-fast" else "-")
            lines.append(f"| {kind} | {cameras} | {dtype} | {side} | {s['episode_ms']:.1f} | "
                         f"{s['replan_p50_ms']:.2f} / {s['replan_p99_ms']:.2f} | {s['pop_p50_ms']:.3f} / "
                         f"{s['pop_p99_ms']:.3f} | {s.get('peak_gib', nan):.2f} | {checked} | {vs32:.2e} | {verdict} "
                         f"| {speed} |")
    lines += ["", "| policy | cameras | dtype | ours | redraw p50 | cold replan p50 | re-instruct (fork) p50 | "
              "snapshot / restore ms | weights / engine / peak GiB | load s / capture s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(rows.items()):
        kind, cameras, dtype = key.split("|")
        for side in ("ours-fast", "ours-fp8", "ours-exact"):
            o = r.get(side)
            if not o or "error" in o:
                continue
            lines.append(f"| {kind} | {cameras} | {dtype} | {side} | {engine_cells(o)} |")
    profiled = [(k, side, r[side]) for k, r in sorted(rows.items()) for side in ("ours-fast", "ours-fp8", "ours-exact")
                if isinstance(r.get(side), dict) and "kernels" in r[side]]
    if profiled:
        lines += ["", "## One replan taken apart (graphs off for the kernel count; each stage captured on its own "
                  "for its time)", "", "| row | side | kernels | summed device ms | vision ms | prefix ms | "
                  "denoise ms (10 steps) | one expert step + set-up ms |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for key, side, o in profiled:
            st = o.get("stages", {})
            lines.append(f"| {key} | {side} | {o['kernels']['kernels']} | {o['kernels']['device_ms']:.2f} | "
                         f"{st.get('vision_ms', nan):.2f} | {st.get('prefix_ms', nan):.2f} | "
                         f"{st.get('denoise_ms', nan):.2f} | {st.get('expert_step_ms', nan):.2f} |")
        for key, side, o in profiled:
            lines += ["", f"Top kernels, {key} {side}:", "", "| kernel | count | ms |", "| --- | --- | --- |"]
            lines += [f"| `{t['name']}` | {t['count']} | {t['ms']:.3f} |" for t in o["kernels"]["top"]]
    if failures:
        lines += ["", "## Checks failed", ""] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("pi0", "pi05"), default="pi0")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--build", type=Path, help="write the checkpoint here and stop")
    ap.add_argument("--checkpoint", type=Path, help="a checkpoint --build wrote (else one is built in a temp dir)")
    ap.add_argument("--sides", help=f"any of {SIDES + SELF_TEST_SIDES} (default: all; --smoke: all but "
                    "compiled)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--steps", type=int, default=200, help="control steps per episode (chunks of 50)")
    ap.add_argument("--episodes", type=int, default=5, help="timed episodes per side")
    ap.add_argument("--warmup", type=int, default=1, help="untimed episodes per side first (compiled: until "
                    "compiling stops, at least 2)")
    ap.add_argument("--check-steps", type=int, default=100, help="steps of the checked episode (seed 0)")
    ap.add_argument("--draws", type=int, default=10, help="timed redraws and re-instructions")
    ap.add_argument("--compile-mode", default="reduce-overhead", help="LeRobot's compile_mode")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per LeRobot process")
    ap.add_argument("--attention", choices=("sdpa", "kernel"), default="sdpa",
                    help="ours-fast's attention (models.lerobot.pi0.pi0_fast.ATTENTIONS)")
    ap.add_argument("--profile", action="store_true", help="kernel table and stage times of our replans (GPU)")
    ap.add_argument("--reference-cache", type=Path, help="where references are kept (default: "
                    "$XDG_CACHE_HOME/flashrt/references); a reference is computed only when absent")
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
        return 0
    sides = choose_sides(args.sides, SIDES + SELF_TEST_SIDES, args.smoke)
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
            build(directory, args.kind, args.cameras, args.smoke)
        case = json.loads((directory / "bench_case.json").read_text())
        if case["smoke"]:
            name += " (smoke: reduced sizes)"
        obs_file = tmp / "observations.safetensors"
        obs = write_observations(directory, obs_file)
        chunk = json.loads((directory / "config.json").read_text()).get("n_action_steps", 50)
        dtypes = [d for d in args.dtypes.split(",") if device.type == "cuda" or d == "float32"]   # bf16: the GPU
        refs = references(directory, case, dtypes, args, obs_file, str(device), tmp)
        for dtype_name in dtypes:
            key = f"{case['kind']}|{case['cameras']}|{dtype_name}"
            row = rows.setdefault(key, {})           # a split run adds its sides to the row
            row.pop("reference", None)               # (older files kept the reference as a side)
            for side in sides:
                if side == "ours-fp8" and dtype_name != "bfloat16":
                    continue                                    # float8 weights run on bf16 activations
                if side.startswith("ours-") or side in SELF_TEST_SIDES:
                    numerics = side[len("ours-"):] if side.startswith("ours-") else "fast"
                    try:
                        row[side] = our_side(directory, getattr(torch, dtype_name), numerics, obs, args, device,
                                             tmp / "caps", selftest="" if side.startswith("ours-") else side)
                    except Exception as exc:                    # recorded and reported; the run goes on
                        import traceback
                        row[side] = {"error": traceback.format_exc()[-3000:]}
                        print(f"[pi0] {side} {dtype_name} failed: {exc!r}", flush=True)
                else:
                    row[side] = lerobot_side(directory, case["kind"], dtype_name, side == "compiled", args, obs_file,
                                             str(device), tmp)
                check_row({side: row[side]}, dtype_name, refs, chunk)      # the verdict in every partial write
                write()
            failures += check_row(row, dtype_name, refs, chunk)
            print_row(key, row)
            write()
    return report(markdown(rows, name, failures), failures, "pi0")

if __name__ == "__main__":
    sys.exit(main())
