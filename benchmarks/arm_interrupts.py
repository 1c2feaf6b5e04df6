"""What capsule restore buys a trained policy after an interrupt: success rates on the MuJoCo arm.

    python -m benchmarks.arm_interrupts --episodes 50 --out docs/benchmarks

For each trained checkpoint (default: the committed ACT and Diffusion Policy in
``flashrt_ros/sim/checkpoints/``) and each cell below, ``--episodes`` seeded
episodes of the reaching task (``flashrt_ros.sim.arm_task``: success = tip within
3 cm of the target, i.e. the tip's 1.5 cm marker overlapping the 2 cm target
sphere, with both joints slower than 0.2 rad/s, within 200 policy steps). Each episode's seed draws the start pose and target (``ArmSim.reset``),
the policy's noise stream (``engine.capsules.reset(seed=...)``, Diffusion only),
the interrupt's start (policy step 10-35) and the operator's pose.

| cell | interrupt (``--interrupt-steps`` control periods) | resume |
| --- | --- | --- |
| uninterrupted | none | - |
| pause + restore | the policy is paused (not stepped); the arm holds its last command | capsule taken at the pause restored |
| pause + reset | same | plain policy reset |
| override + restore | an operator drives the arm toward a random pose; the policy keeps stepping on what it sees, its commands dropped | the policy's capsule restored, physics **not** restored (what a real robot gets) |
| override + reset | same | plain policy reset |
| override + sim restored | same | policy capsule and physics both restored: asserted bit-identical to uninterrupted |

Reported per cell: success rate (Wilson 95 % interval), policy steps to success
(mean, bootstrap 95 % interval, over successes), and the action jump at resume
(max over joints of |first policy command after resume - last command the arm
executed|; for "uninterrupted" the same quantity at the step the interrupt would
have started). The engine and the sim run in-process here (the same
``PolicyEngine`` the node hosts, on the same MuJoCo model, no ROS between them);
``test/test_arm_trained.py`` and ``examples/mujoco_interrupt_resume.py`` drive
the same policy through the node's topics.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from benchmarks.provenance import provenance
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.models.policy_interface import RNG_SEED
from flashrt_ros.models.policy_features import ENV_STATE, STATE
from flashrt_ros.sim.arm import ArmConfig, ArmSim
from flashrt_ros.sim.arm_policy import TRAINED as POLICIES
from flashrt_ros.sim.arm_task import ReachCriterion

CELLS = ("uninterrupted", "pause_restore", "pause_reset", "override_restore", "override_reset",
         "override_sim_restored")
CAPSULE = "interrupt"


@dataclass
class Episode:
    seed: int
    success: bool
    steps_to_success: int | None          # policy steps (interrupt periods not counted)
    interrupted: bool                     # False when the task was done before the interrupt
    jump: float | None                    # action jump at resume (rad)
    distance_m: float = float("nan")      # tip to target when the episode ended (success or time limit)
    actions: list[bytes] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class Interrupt:
    start: int                            # policy step at which it begins
    pose: np.ndarray                      # the operator's goal pose (override)

    @classmethod
    def for_seed(cls, seed: int) -> Interrupt:
        rng = np.random.default_rng([seed, 21])
        return cls(int(rng.integers(10, 36)), rng.uniform(-2.0, 2.0, 2))


class ArmEpisodes:
    """One policy engine and one arm, both in this process; ``run(seed, cell) -> Episode``."""

    def __init__(self, checkpoint: str | Path, criterion: ReachCriterion = ReachCriterion(),
                 interrupt_steps: int = 25, operator_step: float = 0.15) -> None:
        self.engine = PolicyEngine(make_policy(f"lerobot:{checkpoint}"), device="cpu")
        self.sim = ArmSim(ArmConfig(render=False))
        self.criterion, self.interrupt_steps, self.operator_step = criterion, interrupt_steps, operator_step
        self.seeded = RNG_SEED in self.engine.arena

    def close(self) -> None:
        self.engine.close()
        self.sim.close()

    def _observation(self) -> dict[str, torch.Tensor]:
        return arm_observation(self.sim)

    def _policy_reset(self, seed: int) -> None:
        if self.seeded:
            self.engine.capsules.reset(seed=seed)
        else:
            self.engine.capsules.reset()

    def _reached(self) -> bool:
        s = self.sim
        return self.criterion.reached(s.tip_xy(), s.target_xy(), s.joint_velocities())

    def run(self, seed: int, cell: str) -> Episode:
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, not {cell!r}")
        kind, _, resume = cell.partition("_")
        self.sim.reset(seed)
        self._policy_reset(seed)
        plan = Interrupt.for_seed(seed)
        last = self.sim.joint_positions()          # the command the arm holds (reset: ctrl = qpos)
        actions: list[bytes] = []
        jump: float | None = None
        interrupted = False
        for step in range(self.criterion.time_limit_steps):
            if step == plan.start and kind != "uninterrupted":
                interrupted = True
                last = self._interrupt(kind, resume, seed, plan, last)
            action = self.engine.step(self._observation()).numpy().astype(np.float64)
            if step == plan.start:
                jump = float(np.max(np.abs(action - last)))
            actions.append(action.tobytes())
            self.sim.step(action)
            last = action
            if self._reached():
                return Episode(seed, True, step + 1, interrupted, jump, self.sim.distance_to_target(), actions)
        return Episode(seed, False, None, interrupted, jump, self.sim.distance_to_target(), actions)

    def _interrupt(self, kind: str, resume: str, seed: int, plan: Interrupt, last: np.ndarray) -> np.ndarray:
        """The interrupt and the resume; returns the last command the arm executed."""
        self.engine.capsules.snapshot(CAPSULE, overwrite=True)
        physics, before = self.sim.get_state(), last
        for _ in range(self.interrupt_steps):
            if kind == "pause":                    # the arm holds; the policy is not stepped
                command = last
            else:                                  # the operator drives; the policy sees it, its commands dropped
                self.engine.step(self._observation())
                q = self.sim.joint_positions()
                command = q + np.clip(plan.pose - q, -self.operator_step, self.operator_step)
            self.sim.step(command)
            last = command
        if resume == "sim_restored":
            self.sim.set_state(physics)
            self.engine.capsules.restore(CAPSULE)
            return before
        if resume == "restore":
            self.engine.capsules.restore(CAPSULE)
        else:
            self._policy_reset(seed)
        return last


# --- statistics -----------------------------------------------------------------------
def arm_observation(sim: ArmSim) -> dict[str, torch.Tensor]:
    """What the trained arm policies observe: joint positions then velocities, and the target."""
    return {STATE: torch.tensor(np.concatenate([sim.joint_positions(), sim.joint_velocities()]),
                                dtype=torch.float32),
            ENV_STATE: torch.tensor(sim.target_xy(), dtype=torch.float32)}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: Sequence[float], seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """Mean and its 95 % percentile-bootstrap interval (seeded)."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if xs.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, xs.size, (draws, xs.size))].mean(axis=1)
    return (float(xs.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def summarize(episodes: list[Episode]) -> dict:
    n, wins = len(episodes), sum(e.success for e in episodes)
    lo, hi = wilson(wins, n)
    t = bootstrap_mean([e.steps_to_success for e in episodes if e.success])
    j = bootstrap_mean([e.jump for e in episodes if e.jump is not None])
    return {"episodes": n, "interrupted": sum(e.interrupted for e in episodes), "successes": wins,
            "success_rate": wins / n if n else math.nan, "success_ci": [lo, hi],
            "steps_to_success": t[0], "steps_ci": [t[1], t[2]], "jump_rad": j[0], "jump_ci": [j[1], j[2]],
            "final_distance_m_median": float(np.nanmedian([e.distance_m for e in episodes])) if n else math.nan}


# --- the run ------------------------------------------------------------------------------
def evaluate(policy: str, checkpoint: Path, seeds: Sequence[int], cells: Sequence[str],
             interrupt_steps: int) -> dict:
    runner = ArmEpisodes(checkpoint, interrupt_steps=interrupt_steps)
    out: dict = {"checkpoint": str(checkpoint), "cells": {}}
    try:
        per_cell: dict[str, list[Episode]] = {}
        for cell in cells:
            t0 = time.perf_counter()
            per_cell[cell] = [runner.run(s, cell) for s in seeds]
            out["cells"][cell] = summarize(per_cell[cell]) | {"wall_s": round(time.perf_counter() - t0, 1)}
            c = out["cells"][cell]
            print(f"  {policy:9s} {cell:22s} success {c['successes']}/{c['episodes']}  "
                  f"steps {c['steps_to_success']:.1f}  jump {c['jump_rad']:.3f} rad  ({c['wall_s']} s)", flush=True)
        if "override_sim_restored" in per_cell and "uninterrupted" in per_cell:
            same = [a.actions == b.actions and a.success == b.success
                    for a, b in zip(per_cell["uninterrupted"], per_cell["override_sim_restored"])]
            out["sim_restored_bit_identical"] = all(same)
            if not all(same):
                bad = [s for s, ok in zip(seeds, same) if not ok]
                raise AssertionError(f"{policy}: sim-restored episodes differ from uninterrupted for seeds {bad}")
    finally:
        runner.close()
    return out


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} thread), "
            f"Python {platform.python_version()}")


LABELS = {"uninterrupted": "uninterrupted", "pause_restore": "pause + restore", "pause_reset": "pause + reset",
          "override_restore": "override + restore (policy only)", "override_reset": "override + reset",
          "override_sim_restored": "override + sim restored"}


def render_markdown(result: dict) -> str:
    lines = ["| policy | cell | success | 95 % CI | steps to success (mean, 95 % CI) | "
             "action jump at resume [rad] (mean, 95 % CI) | final tip distance (median) |",
             "|---|---|---|---|---|---|---|"]
    for policy, r in result["policies"].items():
        for cell, c in r["cells"].items():
            lines.append(f"| {policy} | {LABELS[cell]} | {c['successes']}/{c['episodes']} "
                         f"({100 * c['success_rate']:.0f} %) | {100 * c['success_ci'][0]:.0f}-"
                         f"{100 * c['success_ci'][1]:.0f} % | {c['steps_to_success']:.1f} "
                         f"({c['steps_ci'][0]:.1f}-{c['steps_ci'][1]:.1f}) | {c['jump_rad']:.3f} "
                         f"({c['jump_ci'][0]:.3f}-{c['jump_ci'][1]:.3f}) | "
                         f"{100 * c['final_distance_m_median']:.1f} cm |")
    return "\n".join(lines)


def write_png(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = list(result["policies"])
    cells = [c for c in CELLS if any(c in r["cells"] for r in result["policies"].values())]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    width = 0.8 / len(policies)
    x = np.arange(len(cells))
    for i, policy in enumerate(policies):
        cs = result["policies"][policy]["cells"]
        for ax, key, ci in ((axes[0], "success_rate", "success_ci"), (axes[1], "steps_to_success", "steps_ci"),
                            (axes[2], "jump_rad", "jump_ci")):
            v = np.array([cs[c][key] for c in cells], dtype=float)
            lo = np.array([cs[c][ci][0] for c in cells], dtype=float)
            hi = np.array([cs[c][ci][1] for c in cells], dtype=float)
            ax.bar(x + (i - (len(policies) - 1) / 2) * width, v, width, label=policy,
                   yerr=np.nan_to_num(np.vstack([v - lo, hi - v])), capsize=3)
    for ax, title in zip(axes, ("success rate (Wilson 95 % CI)", "policy steps to success (mean, 95 % CI)",
                                "action jump at resume [rad] (mean, 95 % CI)")):
        ax.set_xticks(x)
        ax.set_xticklabels([LABELS[c] for c in cells], rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend()
    fig.suptitle(f"MuJoCo arm reaching, {result['episodes']} seeded episodes per cell "
                 f"(seeds {result['seeds'][0]}-{result['seeds'][-1]}), interrupt {result['interrupt_steps']} steps",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--policies", default="act,diffusion", help=f"comma list of {sorted(POLICIES)}")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--interrupt-steps", type=int, default=25, help="control periods (20 ms) per interrupt")
    ap.add_argument("--out", type=Path, default=None, help="write arm_interrupts.{json,md,png} here")
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="render these saved arm_interrupts.json files as one result (runs nothing)")
    args = ap.parse_args(argv)
    if args.combine:
        parts = [json.loads(p.read_text()) for p in args.combine]
        result = parts[0] | {"policies": {k: v for p in parts for k, v in p["policies"].items()},
                             "wall_s": sum(p["wall_s"] for p in parts),
                             "provenance": {"combined_from": [p.get("provenance") for p in parts],
                                            "rendered_by": provenance("cpu")}}
    else:
        torch.set_num_threads(1)      # a shared 2-core machine: one thread is faster (see examples/train_arm)
        seeds = list(range(args.first_seed, args.first_seed + args.episodes))
        cells = [c for c in args.cells.split(",") if c]
        t0 = time.perf_counter()
        result = {"episodes": args.episodes, "seeds": seeds, "interrupt_steps": args.interrupt_steps,
                  "criterion": asdict(ReachCriterion()), "machine": machine(), "provenance": provenance("cpu"),
                  "policies": {}}
        for name in [p for p in args.policies.split(",") if p]:
            result["policies"][name] = evaluate(name, POLICIES[name], seeds, cells, args.interrupt_steps)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
    table = render_markdown(result)
    print(table)
    print(f"machine: {result['machine']}; {result['wall_s']} s")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "arm_interrupts.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "arm_interrupts_table.md").write_text(table + "\n")
        write_png(result, args.out / "arm_interrupts.png")
        print(f"wrote {args.out}/arm_interrupts.{{json,png}}, arm_interrupts_table.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
