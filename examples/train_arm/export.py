"""Copy a finished LeRobot training run's last checkpoint into the repository, weights in fp16, with its log.

    .venv-train/bin/python examples/train_arm/export.py --run /tmp/arm_train/act --log /tmp/arm_train/act.log \
        --wall-s 812.3 --out flashrt_ros/sim/checkpoints/arm_act -- <the training flags>

The directory stays in LeRobot 0.4.4's own format (``checkpoints/last/pretrained_model/``:
``config.json``, ``model.safetensors``, ``train_config.json``, the policy pre/post-processor
JSON and their statistics). Only the weights change: float32 -> float16 (same keys, same
safetensors format; LeRobot's ``from_pretrained`` and our loader both cast them back on load).
``training_log.json`` beside them records what produced them: the loss at every logged step,
the wall time, the machine and the package versions, and the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
from importlib.metadata import version
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LOG_LINE = re.compile(r"step:(\S+) .*?loss:(\S+) .*?lr:(\S+) updt_s:(\S+) data_s:(\S+)")


def _count(text: str) -> int:
    """LeRobot logs steps as 100, 1K, 1.5K ..."""
    m = re.fullmatch(r"([\d.]+)([KMB]?)", text)
    scale = {"": 1, "K": 1_000, "M": 1_000_000, "B": 1_000_000_000}[m.group(2)]
    return int(round(float(m.group(1)) * scale))


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "lerobot": version("lerobot"), "threads": torch.get_num_threads(),
            "note": "shared 2-core development VM; other jobs ran beside the training"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="the --output_dir of lerobot-train")
    ap.add_argument("--log", type=Path, required=True, help="lerobot-train's console log")
    ap.add_argument("--wall-s", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("flags", nargs="*", help="the training flags (after --)")
    args = ap.parse_args()
    src = args.run / "checkpoints" / "last" / "pretrained_model"
    if not (src / "model.safetensors").is_file():
        raise SystemExit(f"no finished checkpoint in {src}")
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name != "model.safetensors":
            shutil.copy2(f, args.out / f.name)
    weights = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              str(args.out / "model.safetensors"), metadata={"format": "pt"})
    curve = []
    for line in args.log.read_text(errors="replace").splitlines():
        m = LOG_LINE.search(line)
        if m:
            curve.append({"step": _count(m.group(1)), "loss": float(m.group(2)), "lr": float(m.group(3)),
                          "update_s": float(m.group(4)), "data_s": float(m.group(5))})
    train_cfg = json.loads((src / "train_config.json").read_text())
    log = {
        "policy": json.loads((src / "config.json").read_text())["type"],
        "steps": train_cfg["steps"], "batch_size": train_cfg["batch_size"], "seed": train_cfg["seed"],
        "parameters": sum(v.numel() for v in weights.values()),
        "final_loss": curve[-1]["loss"] if curve else None,
        "wall_time_s": round(args.wall_s, 1),
        "mean_update_s": round(sum(c["update_s"] for c in curve) / max(1, len(curve)), 4),
        "mean_data_s": round(sum(c["data_s"] for c in curve) / max(1, len(curve)), 4),
        "machine": machine(),
        "dataset": {"repo_id": train_cfg["dataset"]["repo_id"], "recorded_by": "examples/train_arm/record.py",
                    "episodes": 300, "frames_per_episode": 150, "fps": 50, "first_seed": 100000},
        "command": ["lerobot-train (examples/train_arm/lerobot_train_cpu.py)", *args.flags],
        "loss_curve": curve,
    }
    (args.out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"exported {src} -> {args.out} ({size / 1e6:.2f} MB, final loss {log['final_loss']})")


if __name__ == "__main__":
    main()
