"""One π0 / π0.5 replan at the published size in our engine alone: the ``fast`` forms side by side, checked
against each other, with stage times and kernel counts. No LeRobot, no checkpoint: the policy is built on the
GPU with seeded random weights of the published architecture (the race against LeRobot is ``benchmarks.pi0``).

Why: a kernel change must show what it does to the whole replan in minutes of device time, before the
race spends ten. Forms (each a captured engine, same weights, same observation, same noise):

* ``baseline``: the expert's products through cuBLAS plus the row kernels, one-pass attention (the
  18.4 ms form of ``docs/benchmarks/pi0_fast.md``);
* ``split``: the same with the expert's attention split over keys (``ops.triton.prefix_attention``);
* ``rows``: split attention and the fused few-row products (``ops.triton.rows_matmul``);
* ``merged``: ``rows`` with split-K for the expert's ``o`` and ``down`` products (64 column tiles alone leave
  half an H100 idle) and the attention's slices merged by its own last program (no second kernel), both
  written and CPU-checked on 2026-12-07 and off by default until this form measures them.

Every form's chunk is compared with ``baseline``'s (bf16 against bf16: rounding only) and printed. Run:
    python -m benchmarks.pi0_replan [--kind pi0|pi05] [--cameras 2] [--json OUT.json] [--profile]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # tiny_pi's builder and the stand-in tokenizer

from benchmarks.timing import sync  # noqa: E402
from flashrt_ros.engine.policy_engine import PolicyEngine  # noqa: E402
from flashrt_ros.engine.stats import percentile  # noqa: E402
from flashrt_ros.engine.vla import set_instruction  # noqa: E402
from flashrt_ros.ops import rows_matmul  # noqa: E402
from flashrt_ros.ops.triton import prefix_attention as attention_kernels  # noqa: E402

TASK = "pick up the red cube and put it in the box"
FORMS = ("baseline", "split", "rows", "merged")
#: ``merged``'s launch shapes: split-K of 4 for the residual products, the expert's split attention merged in-kernel
MERGED_RESIDUAL = (16, 128, 4, 4, 4)
MERGED_ATTENTION = (16, 64, 128, 4, 2, 1)


def build(kind: str, cameras: int, device: str, smoke: bool):
    """Our policy at the published sizes (``smoke``: tiny), weights drawn on ``device`` and cast to bf16."""
    from tiny_pi import tiny_config
    from flashrt_ros.models.lerobot.pi0.configuration_pi0 import PALIGEMMA_TOKENIZER
    from flashrt_ros.models.lerobot.pi0.modeling_pi0 import PI0Policy
    from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
    from tiny_pi import tokenizer_file
    names = tuple(f"observation.images.cam{i}" for i in range(cameras))
    if smoke:
        cfg = tiny_config(kind == "pi05", cameras=names)
    else:
        from flashrt_ros.models.lerobot.pi0.configuration_pi0 import PI0Config
        cfg = PI0Config(pi05=kind == "pi05", state_dim=8, env_state_dim=0, action_dim=7, cameras=names,
                        image_shape=(3, 224, 224))
    torch.manual_seed(0)
    with torch.device(device):
        policy = PI0Policy(cfg, tokenizer=TokenizerSettings(PALIGEMMA_TOKENIZER), tokenizer_file=tokenizer_file())
        with torch.no_grad():
            for p in policy.parameters():
                p.normal_(0.0, 0.02)
    policy = policy.eval().requires_grad_(False)
    policy.cast(torch.bfloat16 if device == "cuda" else torch.float32)
    policy.to(device)                     # the RoPE frequencies and tables are plain tensors, made on the CPU
    return policy


def observation(cfg, device: str) -> dict:
    g = torch.Generator().manual_seed(3)
    obs = {"observation.state": torch.randn(cfg.state_dim, generator=g)}
    for cam in cfg.cameras:
        obs[cam] = torch.rand(cfg.image_shape, generator=g)
    return {k: v.to(device) for k, v in obs.items()}


@contextlib.contextmanager
def form(name: str):
    """The switches of one form (graphs keep what they were captured with)."""
    from flashrt_ros.ops.triton import rows_matmul as row_kernels
    one_pass = attention_kernels.attention_config
    residual = row_kernels.DEFAULT_CONFIGS["residual"]
    if name == "baseline":
        attention_kernels.attention_config = (
            lambda rows, keys, dtype=None: (64, 64, 8, 2) if rows > 2048 else (16, 64, 4, 2))
    if name == "merged":
        attention_kernels.attention_config = (
            lambda rows, keys, dtype=torch.bfloat16: one_pass(rows, keys, dtype) if rows > 2048 or
            dtype == torch.float32 else MERGED_ATTENTION)
        row_kernels.DEFAULT_CONFIGS["residual"] = MERGED_RESIDUAL
    try:
        with rows_matmul.few_row_kernels(name in ("rows", "merged")):
            yield
    finally:
        attention_kernels.attention_config = one_pass
        row_kernels.DEFAULT_CONFIGS["residual"] = residual


def replan_times(engine: PolicyEngine, obs: dict, device: torch.device, reps: int) -> tuple[list[float], torch.Tensor]:
    """Replans from a reset (each a fresh chunk): wall ms up to a sync; the first chunk (the action queue)."""
    times = []
    first = None
    for i in range(reps + 2):
        engine.capsules.reset(seed=0)
        sync(device)
        t0 = time.perf_counter()
        engine.step(obs)
        sync(device)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
        if first is None:
            first = engine.arena[engine.policy.QUEUE].float().cpu()
    return times, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("pi0", "pi05"), default="pi0")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="stage times and kernel table of each form")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, CPU allowed")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("needs a CUDA GPU (use --smoke to check the script on CPU)")
    t0 = time.perf_counter()
    policy = build(args.kind, args.cameras, device.type, args.smoke)
    policy.use_numerics("fast")
    policy.fast.attention = "kernel"
    obs = observation(policy.cfg, device.type)
    result: dict = {"kind": args.kind, "cameras": args.cameras, "build_s": time.perf_counter() - t0,
                    "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "forms": {}}
    chunks = {}
    for name in args.forms.split(","):
        with form(name):
            engine = PolicyEngine(policy, device=device, cuda_graph=device.type == "cuda")
            set_instruction(engine, TASK)
            try:
                times, chunks[name] = replan_times(engine, obs, device, args.reps)
            finally:
                engine.close()
            row = {"replan_p50_ms": percentile(times, 50), "replan_p99_ms": percentile(times, 99)}
            if args.profile and device.type == "cuda":
                from benchmarks.pi_profile import kernel_table, stage_times
                row["stages"] = stage_times(policy, obs)
                row["kernels"] = kernel_table(policy, obs)
        base = chunks.get("baseline")
        if base is not None:
            row["max_rel_vs_baseline"] = float((chunks[name] - base).abs().max() / base.abs().max())
        result["forms"][name] = row
        print(f"[pi0_replan] {name}: {json.dumps(row)[:1500]}", flush=True)
        if args.json:
            from benchmarks.provenance import provenance
            args.json.write_text(json.dumps({**result, "provenance": provenance(device)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
