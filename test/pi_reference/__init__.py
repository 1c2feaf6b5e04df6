"""The π0 / π0.5 test reference: LeRobot 0.4.4 on transformers 4.53.2 with openpi's changes, in its own process.

``run_reference(cases)`` is the test side: it writes the cases to a spec file and
runs ``python -m pi_reference.reference`` with ``.venv/pi-reference`` (transformers
4.53.2, ``requirements-pi-reference.txt``) first on the path; that process imports
``transformers_shim`` before LeRobot. Every case's directory then holds a LeRobot
checkpoint and ``reference_actions.safetensors``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from pi_reference.reference import PUBLISHED, REDUCED, Case

TEST_DIR = Path(__file__).resolve().parents[1]
ROOT = TEST_DIR.parent
PI_REFERENCE_DIR = ROOT / ".venv" / "pi-reference"
LEROBOT_REFERENCE_DIR = ROOT / ".venv" / "lerobot-reference"

__all__ = ["PUBLISHED", "REDUCED", "Case", "reference_env", "run_reference", "run_selfcheck", "reference_record",
           "reference_run"]


def _require_installed() -> None:
    """Skip (saying how to install) unless transformers 4.53.2 is in ``.venv/pi-reference`` and LeRobot is
    in ``.venv/lerobot-reference`` or importable (a GPU machine installs it from wheels)."""
    if not (PI_REFERENCE_DIR / "transformers").is_dir():
        pytest.skip(f"π reference not installed (transformers 4.53.2 expected in {PI_REFERENCE_DIR}): run "
                    f"scripts/install_lerobot_reference.sh")
    if not (LEROBOT_REFERENCE_DIR / "lerobot").is_dir() and importlib.util.find_spec("lerobot") is None:
        pytest.skip(f"LeRobot reference not installed (expected in {LEROBOT_REFERENCE_DIR}): run "
                    f"scripts/install_lerobot_reference.sh")


def reference_env() -> dict[str, str]:
    """The reference process's environment: transformers 4.53.2 ahead of the project's own (and ahead of
    whatever PYTHONPATH already holds, which stays: a GPU machine's LeRobot wheels)."""
    paths = [str(PI_REFERENCE_DIR), str(TEST_DIR), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def run_reference(cases: list[Case], spec_dir: Path, timeout_s: float = 1800.0) -> None:
    """Build every case's checkpoint and LeRobot's actions for it (one process for all cases)."""
    _require_installed()
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = spec_dir / "pi_reference_spec.json"
    spec.write_text(json.dumps({"cases": [asdict(c) for c in cases]}, indent=1))
    proc = subprocess.run([sys.executable, "-m", "pi_reference.reference", str(spec)], env=reference_env(),
                          cwd=str(ROOT), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the π reference process failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                           f"{proc.stderr[-8000:]}")
    print(proc.stdout, end="")


def reference_record(case: Case) -> dict[str, torch.Tensor]:
    """LeRobot's ``actions`` (steps x action), and the ``tokens`` / ``token_lengths`` its preprocessor
    gave each replanning step; for a case with ``rtc`` also ``rtc_chunks``, ``rtc_remaining`` and
    ``rtc_remaining_len`` (``reference.rtc_run``)."""
    from safetensors.torch import load_file
    return load_file(str(Path(case.directory) / "reference_actions.safetensors"))


def reference_run(case: Case) -> dict:
    """The reference's timings for the case (build time, seconds per replan)."""
    return json.loads((Path(case.directory) / "reference_run.json").read_text())


def run_selfcheck(timeout_s: float = 600.0) -> list[str]:
    """Run ``pi_reference.selfcheck`` in the reference process; returns its report lines (raises on failure)."""
    _require_installed()
    proc = subprocess.run([sys.executable, "-m", "pi_reference.selfcheck"], env=reference_env(), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise AssertionError(f"the π reference self-check failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return [line for line in proc.stdout.splitlines() if line.startswith("[selfcheck]")]
