"""Our triton kernels compile for an H100 (sm_90) on a machine without a GPU, and fit its shared memory.

Why: the interpreter checks what a kernel computes, not whether the compiler takes it: a form the compiler
refuses, or a tile that asks for more than an H100's 227 KiB of shared memory (π0's float32 rows did, found
only on the device on 2026-12-07), would otherwise wait for a device session. ``triton.compile`` runs the
whole pipeline to a cubin here (triton's wheel carries ptxas), for the launch shapes the wrappers pick; the
cases (``benchmarks.kernel_resources``) run in one process without the interpreter (that module says why).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from benchmarks.kernel_resources import CASES, H100_SHARED  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kernel_resources", "--json"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"the compile process failed ({proc.returncode}): {proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_compiles_for_sm90_and_fits_an_h100s_shared_memory(case, compiled):
    result = compiled[case]
    if "ptxas" in result.get("error", "") and "not found" in result.get("error", ""):
        pytest.skip(f"no ptxas here: {result['error'][:200]}")
    assert "error" not in result, result["error"]
    assert result["shared"] <= H100_SHARED, result["shared"]
