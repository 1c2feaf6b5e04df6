"""``benchmarks.pi0 --smoke`` runs on a CPU: our engine (both numerics) and LeRobot's π0 (in its reference process)
over whole episodes at reduced sizes, every side's checked episode judged against LeRobot eager float32 by the
bounds ``benchmarks.action_checks`` declares, the deliberately broken self-test sides failing them.

Why a test: the benchmark is run rarely (published sizes need a GPU and minutes), so a change elsewhere
can break it unnoticed; the smoke run keeps it working, and its checks must pass (fp32, same noise), catch the
broken forms, reuse the cached reference, and fail when a side's actions are wrong or a reference is missing.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import action_checks, pi0


def test_smoke_checks_every_side_and_the_self_tests_fail(tmp_path: Path, monkeypatch) -> None:
    out, md, cache = tmp_path / "pi0.json", tmp_path / "pi0.md", tmp_path / "cache"
    computed = []
    real = pi0.lerobot_side

    def counting(*args, **kwargs):
        if kwargs.get("episodes") == 0:
            computed.append(kwargs.get("widen"))
        return real(*args, **kwargs)
    monkeypatch.setattr(pi0, "lerobot_side", counting)
    ckpt = tmp_path / "checkpoint"
    assert pi0.main(["--smoke", "--build", str(ckpt)]) == 0
    common = ["--smoke", "--checkpoint", str(ckpt), "--json", str(out), "--reference-cache", str(cache)]
    assert pi0.main(common + ["--out", str(md)]) == 0
    row = json.loads(out.read_text())["pi0|2|float32"]
    for side in ("ours-fast", "ours-exact"):
        ours = row[side]
        assert ours["replans"] > 0 and ours["pops"] > 0 and ours["episode_ms"] > 0
        assert ours["reinstruct_p50_ms"] > 0 and ours["capsule"]["state_bytes"] > 0
    for side in ("ours-fast", "ours-exact", "lerobot"):
        assert row[side]["check"]["passed"] and row[side]["check"]["bound"]["reference"] == "float32", side
    # exact: LeRobot's arithmetic (test_lerobot_pi0's bound: two processes may split CPU matmuls differently)
    assert row["ours-exact"]["check"]["errors"]["max"] <= 1e-5
    for side in pi0.SELF_TEST_SIDES:                 # broken on purpose: caught by ours-fast's bound
        check = row[side]["check"]
        assert check["expected_to_fail"] and check["passed"] and not check["within"], side
        assert check["errors"]["rms"] > check["bound"]["rms"]
    text = md.read_text()
    assert "| pi0 | 2 | float32 | ours-fast |" in text and "(self-test: must fail)" in text
    assert computed == [False]                        # the float32 reference, computed once ...
    computed.clear()
    assert pi0.main(common + ["--sides", "ours-fast"]) == 0
    assert computed == []                             # ... and then read from the cache
    assert json.loads(out.read_text())["pi0|2|float32"]["ours-fast"]["check"]["passed"]


def test_a_side_beyond_its_bound_a_passing_self_test_and_a_missing_reference_fail() -> None:
    ref = torch.linspace(1.0, 2.0, 8).view(4, 2)
    refs = {"float32": ref}
    row = {"ours-fast": {"actions": ref * 1.01}, "lerobot": {"actions": ref.clone()},
           "selftest-zero-head": {"actions": ref.clone()}}
    failures = pi0.check_row(row, "float32", refs, chunk=2)
    assert len(failures) == 2
    assert failures[0].startswith("ours-fast float32: rms")
    assert "no power" in failures[1]
    assert row["lerobot"]["check"]["passed"]
    missing = pi0.check_row({"ours-fast": {"actions": ref}}, "bfloat16", {"float32": ref, "bfloat16-weights": "boom"},
                            chunk=2)
    assert len(missing) == 1 and "no bfloat16-weights reference" in missing[0] and "boom" in missing[0]


def test_every_side_has_a_declared_bound_and_bf16_sides_use_their_own_weights() -> None:
    for side in pi0.SIDES + pi0.SELF_TEST_SIDES:
        for dtype in ("float32", "bfloat16"):
            bound = action_checks.bound_for(side, dtype)
            if side == "ours-fp8":               # bf16 activations only; its float8 weights are not a bf16 cast
                assert (bound is None) == (dtype == "float32") and (bound is None or bound.reference == "float32")
                continue
            assert bound is not None and bound.rms > 0 and bound.max > 0, (side, dtype)
            assert bound.reference == ("float32" if dtype == "float32" else "bfloat16-weights")


def test_the_bf16_weights_reference_rounds_the_weights_and_keeps_the_rope_frequencies_exact(tmp_path: Path) -> None:
    """LeRobot's bf16 cast also rounds the RoPE ``inv_freq`` buffers; the reference of bf16 sides widens the
    rounded weights back but computes with exact frequencies, as our bf16 does (``pi_reference.bench.exact_rope``:
    with rounded ones our bf16 sides measured 8.5e-2 against it at the published size)."""
    import subprocess
    import sys

    from pi_reference import reference_env
    ckpt = tmp_path / "checkpoint"
    assert pi0.main(["--smoke", "--build", str(ckpt)]) == 0
    probe = f"""
import torch
from pathlib import Path
from pi_reference.reference import _install
_install()
from pi_reference.bench import exact_rope, load_policy
policy, _ = load_policy(Path({str(ckpt)!r}), "pi0", "bfloat16", False, "default", "cpu")
ropes = [m for m in policy.modules() if hasattr(m, "original_inv_freq")]
assert len(ropes) == 2 and all(m.inv_freq.dtype == torch.bfloat16 for m in ropes)   # LeRobot's cast rounds them
policy.to(torch.float32)
exact_rope(policy)
for m in ropes:                                       # Gemma's default RoPE, theta 10000
    d = 2 * m.inv_freq.numel()
    exact = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    assert torch.equal(m.inv_freq, exact), "inv_freq not exact"
lm = policy.model.paligemma_with_expert.paligemma.model.language_model.layers[0].mlp.up_proj.weight
assert lm.dtype == torch.float32 and torch.equal(lm, lm.bfloat16().float()), "the weights are not the rounded ones"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", probe], env=reference_env(), cwd=str(Path(__file__).parents[1]),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr[-3000:]
