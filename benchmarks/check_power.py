"""How far rounding moves a π0 / π0.5 chunk, and how far a broken network does: the measurements the bf16 bounds of
``benchmarks.action_checks`` rest on. Published size, float32 and bf16, our engine (LeRobot only as a reference).

One replan (10 flow steps, one chunk) from the same observation and noise for:

* A ``exact`` float32 (the function);
* B ``exact`` float32 on the weights rounded to bf16 (what a bf16 side computes with: the reference of bf16 sides);
* C ``exact`` bf16, D ``fast`` bf16 (the sides the bounds judge);
* the ``fast`` bf16 forms deliberately broken: the expert's middle layer skipped; head 0 of that layer's
  attention output zeroed; head 0 of the language model's middle layer zeroed;
* E ``fp8``: ``fast`` with the language model's and the expert's products on float8 weights (the widened weights
  on a CPU: the function a GPU computes).

Each against A and B: relative RMS ``||x - ref|| / ||ref||`` and relative max ``max|x - ref| / max|ref|``. A
bound for bf16 sides sits above C / D against B and below E-G. Takes ~4 minutes and ~15 GB of memory on 2 cores:
    python -m benchmarks.check_power [--kind pi0|pi05] [--json OUT.json] [--smoke]

``--checkpoint DIR`` measures the race's own checkpoint (``benchmarks.pi0 --build DIR``: LeRobot's classes and
initialisation) instead of this script's N(0, 0.02) draw: how far rounding moves a network depends on its weights,
so a bound measured on one draw need not hold on another. Then B rounds exactly what the bf16 cast rounds (what
LeRobot keeps in float32 stays float32, as in the race's bf16-weights reference), and every row is the race's
checked episode cut to ``--check-steps`` (default one chunk): the same observations, noise and instruction, the
actions the robot gets. ``--references`` adds LeRobot eager float32 on the checkpoint's weights and on its bf16
weights (exact RoPE frequencies) as two more columns, from the race's cache (``--reference-cache``; computed when
absent, in LeRobot's process): a row's distance from them is the race's check. ``--device cuda`` runs every row
on the GPU with TF32 off, where the race runs:
    python -m benchmarks.check_power --checkpoint /tmp/pi0_2cam --references --device cuda --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.pi0_replan import TASK, build, observation
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction


class Drawn:
    """This script's own draw: N(0, 0.02) weights, one synthetic observation, a row is the action queue after one
    replan from a reset (seed 0)."""

    def __init__(self, kind: str, smoke: bool) -> None:
        self.kind, self.smoke = kind, smoke
        self.obs = None

    def load(self, device: str):
        policy = build(self.kind, 2, "cpu", self.smoke)
        self.obs = observation(policy.cfg, device)
        return policy

    @staticmethod
    def round_weights(policy) -> None:
        for p in policy.parameters():
            if p.dtype == torch.float32:
                p.copy_(p.bfloat16().float())

    def row(self, policy, device: str) -> torch.Tensor:
        engine = PolicyEngine(policy, device=device, cuda_graph=False)
        try:
            set_instruction(engine, TASK)
            engine.capsules.reset(seed=0)
            engine.step(self.obs)
            return engine.arena[policy.QUEUE].float().cpu().clone()
        finally:
            engine.close()


class Race:
    """The race's checkpoint and checked episode (``benchmarks.pi0``): its observations, its instruction, noise
    seed 0, the first ``steps`` actions the engine returns."""

    def __init__(self, directory: Path, steps: int) -> None:
        from benchmarks.pi0 import write_observations
        self.directory, self.steps = directory, steps
        self._tmp = tempfile.TemporaryDirectory(prefix="check_power_")      # removed with the object
        self.tmp = Path(self._tmp.name)
        self.obs_file = self.tmp / "observations.safetensors"
        self.raw_obs = write_observations(directory, self.obs_file)

    def load(self, device: str):
        from benchmarks.pi0 import TASK as RACE_TASK
        from flashrt_ros.models.lerobot import load_lerobot_policy
        policy = load_lerobot_policy(self.directory, dtype=torch.float32, numerics="exact")
        policy.set_default_instruction(RACE_TASK)
        return policy

    @staticmethod
    def round_weights(policy) -> None:
        policy.cast(torch.bfloat16)          # what the bf16 cast rounds, widened back
        policy.cast(torch.float32)

    def row(self, policy, device: str) -> torch.Tensor:
        obs = [{k: v.to(device) for k, v in o.items()} for o in self.raw_obs]
        engine = PolicyEngine(policy, device=device, cuda_graph=False)
        try:
            engine.capsules.reset(seed=0)
            return torch.stack([engine.step(obs[i % len(obs)]).float().cpu() for i in range(self.steps)])
        finally:
            engine.close()

    def references(self, cache: Path | None) -> dict[str, torch.Tensor | str]:
        """The race's references for this checkpoint and episode length (``benchmarks.pi0.references``)."""
        from benchmarks.pi0 import references
        case = json.loads((self.directory / "bench_case.json").read_text())
        args = SimpleNamespace(check_steps=self.steps, reference_cache=cache, steps=200, episodes=0, warmup=0,
                               compile_mode="reduce-overhead", timeout=7200.0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return references(self.directory, case, ["bfloat16"], args, self.obs_file, device, self.tmp)


def broken_forms(policy):
    """(name, apply) of the deliberately broken ``fast`` forms (``benchmarks.pi0``'s self-tests do the first two
    the same way); ``apply`` returns the undo."""
    from benchmarks.pi0_selftests import break_policy
    for name in ("selftest-skip-layer", "selftest-zero-head", "selftest-zero-vlm-head"):
        yield name, (lambda n=name: break_policy(policy, n))


def rel(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    x, ref = x.double(), ref.double()
    n = min(len(x), len(ref))
    x, ref = x[:n], ref[:n]
    return {"rms": float((x - ref).norm() / ref.norm()), "max": float((x - ref).abs().max() / ref.abs().max())}


def measure(subject: Drawn | Race, device: str, with_references: bool, cache: Path | None) -> dict:
    t0 = time.perf_counter()
    refs: dict[str, torch.Tensor] = {}
    if with_references:                     # first: LeRobot's process needs the memory ours will take
        for name, ref in subject.references(cache).items():
            if isinstance(ref, str):
                raise SystemExit(f"the {name} reference could not be computed: {ref}")
            refs[f"LeRobot {name}"] = ref

    def loaded():
        policy = subject.load(device)
        return policy.to(device) if device == "cuda" else policy
    policy = loaded()
    rows = {"A exact float32": subject.row(policy, device)}
    with torch.no_grad():
        subject.round_weights(policy)
    rows["B exact float32, bf16-rounded weights"] = subject.row(policy, device)
    policy.cast(torch.bfloat16)
    rows["C exact bf16"] = subject.row(policy, device)
    policy.use_numerics("fast")
    policy.fast.attention = "kernel"
    rows["D fast bf16"] = subject.row(policy, device)
    for name, apply in broken_forms(policy):
        undo = apply()
        rows[f"{name} (fast bf16)"] = subject.row(policy, device)
        undo()
    del policy
    fp8 = loaded()                          # the same weights, then float8 products
    fp8.cast(torch.bfloat16)
    fp8.use_numerics("fp8")
    fp8.fast.attention = "kernel"
    rows["E fp8 (float8 weights; the prefix's activations quantised too)"] = subject.row(fp8, device)
    columns = {"A": rows["A exact float32"], "B": rows["B exact float32, bf16-rounded weights"], **refs}
    table = {name: {f"vs_{c}": rel(x, ref) for c, ref in columns.items()} for name, x in rows.items()}
    for c, ref in refs.items():              # the references against each other
        table[c] = {f"vs_{d}": rel(ref, other) for d, other in columns.items()}
    return {"kind": getattr(subject, "kind", "checkpoint"), "smoke": getattr(subject, "smoke", False),
            "checkpoint": str(subject.directory) if isinstance(subject, Race) else "N(0, 0.02) draw",
            "steps": subject.steps if isinstance(subject, Race) else "one chunk (the queue)",
            "device": device, "threads": torch.get_num_threads(), "seconds": time.perf_counter() - t0,
            "rows": table}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("pi0", "pi05"), default="pi0", help="(without --checkpoint)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; without --checkpoint)")
    ap.add_argument("--checkpoint", type=Path, help="the race's checkpoint (benchmarks.pi0 --build DIR)")
    ap.add_argument("--check-steps", type=int, help="with --checkpoint: actions per row (default: one chunk)")
    ap.add_argument("--references", action="store_true", help="with --checkpoint: LeRobot's two references too")
    ap.add_argument("--reference-cache", type=Path, help="where the race keeps its references")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA GPU here")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if args.checkpoint is None and (args.references or args.check_steps):
        sys.exit("--references and --check-steps measure the race's checkpoint: give --checkpoint")
    if args.checkpoint is not None:
        config = json.loads((args.checkpoint / "config.json").read_text())
        subject: Drawn | Race = Race(args.checkpoint, args.check_steps or config.get("n_action_steps", 50))
    else:
        subject = Drawn(args.kind, args.smoke)
    result = measure(subject, args.device, args.references, args.reference_cache)
    for name, r in result["rows"].items():
        print(f"{name:64s} " + "   ".join(f"{c}: rms {v['rms']:.2e} max {v['max']:.2e}" for c, v in r.items()))
    if args.json:
        from benchmarks.provenance import provenance
        args.json.write_text(json.dumps({**result, "provenance": provenance(torch.device(args.device))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
