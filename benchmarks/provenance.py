"""Where a benchmark number came from: the code, the packages, the machine and the flags, for every JSON we write.

Why: a number without its commit, its torch / CUDA / cuDNN / LeRobot versions,
the GPU and driver, the CPU and the backend flags cannot be compared with the
next run, nor reproduced. Every benchmark that writes JSON puts
``provenance(device)`` under the key ``"provenance"``.

The commit comes from the environment when set (``FLASHRT_COMMIT=<sha> FLASHRT_DIRTY=0|1``:
the device machine gets a copy of the working tree, whose ``.git`` may be missing or stale),
else from ``git`` in the checkout, "dirty" when a file outside ``docs/`` (where results go) is
changed or untracked.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchvision", "triton", "lerobot", "transformers", "diffusers", "numpy", "flashrt_ros",
            "flash-linear-attention", "fla-core")


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@functools.lru_cache(maxsize=None)
def git_state() -> dict[str, Any]:
    """``{"commit", "dirty", "source"}``: ``FLASHRT_COMMIT`` when set, else from git, else unknown.

    Why the environment first: a device copy of the working tree can carry a stale ``.git`` (kept from
    an earlier copy), whose HEAD is not the code that ran; whoever sets ``FLASHRT_COMMIT`` knows.
    Read once per process: a benchmark calls it when it starts, so the record names the code that
    ran, not edits made to the checkout while it ran."""
    env_commit = os.environ.get("FLASHRT_COMMIT")
    if env_commit:
        dirty = os.environ.get("FLASHRT_DIRTY")
        return {"commit": env_commit, "dirty": None if dirty is None else dirty not in ("0", "false", ""),
                "source": "environment (FLASHRT_COMMIT)"}
    commit = _run(["git", "rev-parse", "HEAD"])
    if commit:
        # changed or untracked files outside docs/ (docs/ holds results, often written by the run itself)
        status = _run(["git", "status", "--porcelain", "--", ".", ":(exclude)docs"])
        return {"commit": commit, "dirty": bool(status) if status is not None else None, "source": "git"}
    return {"commit": "unknown", "dirty": None, "source": "no git and no FLASHRT_COMMIT"}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed version of each distribution ("not installed" when absent)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with the logical CPU count."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical CPUs)"


def gpu_info(device: torch.device) -> dict[str, Any] | None:
    """Name, memory, capability and driver of the CUDA device (None on a CPU run)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    driver = _run(["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "driver": driver or "unknown (nvidia-smi not found)"}


def backend_flags() -> dict[str, Any]:
    """The global torch flags that change what a kernel computes or how it is chosen."""
    return {"cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "torch.num_threads": torch.get_num_threads()}


def provenance(device: torch.device | str, flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything needed to place a benchmark JSON: code, packages, machine, flags (``flags``: the benchmark's own)."""
    device = torch.device(device)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "git": dict(git_state()),
        "packages": package_versions(),
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "gpu": gpu_info(device),
        "cpu": cpu_model(),
        "host": platform.node(),
        "load_average": list(load) if load else None,
        "flags": {**backend_flags(), **(flags or {})},
    }


def summary_line(p: dict[str, Any]) -> str:
    """One markdown line of ``provenance()``: the machine named, the commit and the versions that matter."""
    g = p["git"]
    dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}[g["dirty"]]
    pk = p["packages"]
    gpu = p["gpu"]
    where = (f"{gpu['name']} ({gpu['memory_gib']} GiB, driver {gpu['driver']})" if gpu else "CPU only") \
        + f", CPU {p['cpu']}"
    return (f"{where}; commit {g['commit'][:12]}{dirty}; torch {pk['torch']}, CUDA {p['cuda']}, cuDNN {p['cudnn']}, "
            f"LeRobot {pk['lerobot']}, transformers {pk['transformers']}, diffusers {pk['diffusers']}")
