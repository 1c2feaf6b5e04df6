"""``benchmarks.groot --smoke`` runs on a CPU: our engine (``numerics: fast``) and LeRobot's GR00T N1.5 (in its
reference process, transformers 4.57.6) over whole episodes at the tiny test sizes, every side's checked episode
judged against LeRobot eager float32 by the bounds ``benchmarks.action_checks.GROOT_BOUNDS`` declares, the
deliberately broken self-test side failing them.

Why a test: the published-size race needs a GPU and minutes, so a change elsewhere could break it unnoticed; the
smoke run keeps it working, and its checks must pass (float32, the same noise), catch the broken form, reuse the
cached reference, and the displacement check must have the power the raw actions lack.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import action_checks, groot


def test_smoke_checks_every_side_and_the_self_test_fails(tmp_path: Path, monkeypatch) -> None:
    out, md, cache = tmp_path / "groot.json", tmp_path / "groot.md", tmp_path / "cache"
    computed = []
    real = groot.lerobot_side

    def counting(*args, **kwargs):
        if kwargs.get("episodes") == 0:
            computed.append(True)
        return real(*args, **kwargs)
    monkeypatch.setattr(groot, "lerobot_side", counting)
    ckpt = tmp_path / "checkpoint"
    assert groot.main(["--smoke", "--build", str(ckpt)]) == 0
    common = ["--smoke", "--checkpoint", str(ckpt), "--json", str(out), "--reference-cache", str(cache)]
    assert groot.main(common + ["--out", str(md)]) == 0
    row = json.loads(out.read_text())["groot|2|float32"]
    ours = row["ours-fast"]
    assert ours["replans"] == 3 and ours["pops"] == 14 and ours["episode_ms"] > 0     # 17 steps, a plan every 8
    assert ours["reinstruct_p50_ms"] > 0 and ours["redraw_p50_ms"] > 0 and ours["capsule"]["state_bytes"] > 0
    assert row["lerobot"]["replans"] == 3
    for side in ("ours-fast", "lerobot"):
        check = row[side]["check"]
        assert check["passed"] and check["policy"] == "groot" and check["bound"]["reference"] == "float32", side
        assert check["errors"]["steps"] == 17
    # the network's part, not the noise's: ours is LeRobot's function within float32 rounding on the CPU
    assert row["ours-fast"]["check"]["errors"]["rms"] < 1e-4
    assert row["ours-fast"]["check"]["actions"]["rms"] < 1e-6
    check = row["selftest-skip-dit-block"]["check"]                   # broken on purpose: caught
    assert check["expected_to_fail"] and check["passed"] and not check["within"]
    assert check["errors"]["rms"] > 10 * check["bound"]["rms"]
    text = md.read_text()
    assert "| groot | 2 | float32 | ours-fast |" in text and "(self-test: must fail)" in text
    assert computed == [True]                         # the float32 reference, computed once ...
    computed.clear()
    assert groot.main(common + ["--sides", "ours-fast"]) == 0
    assert computed == []                             # ... and then read from the cache
    assert json.loads(out.read_text())["groot|2|float32"]["ours-fast"]["check"]["passed"]
    # bf16 (LeRobot's use_bf16 autocast on both sides): its own row, checked against the same float32 reference
    assert groot.main(common + ["--dtypes", "bfloat16", "--out", str(md)]) == 0
    assert computed == []
    bf16 = json.loads(out.read_text())["groot|2|bfloat16"]
    for side in ("ours-fast", "lerobot"):
        check = bf16[side]["check"]
        assert check["passed"] and check["bound"]["reference"] == "float32" and check["errors"]["rms"] > 1e-4, side
    assert bf16["selftest-skip-dit-block"]["check"]["passed"] and not bf16["selftest-skip-dit-block"]["check"]["within"]


def test_the_displacement_check_catches_a_flow_that_moves_nothing_and_a_wrong_side() -> None:
    """Actions that are the noise alone (the network computing nothing) are 2.4 % RMS off the reference's raw
    actions here (0.7 % at the tiny size: a bound on the raw actions barely sees it); on the displacement they
    are 100 % off."""
    baseline = torch.linspace(-1.0, 1.0, 10).view(5, 2)
    ref = baseline + 0.01 * torch.linspace(1.0, 2.0, 10).view(5, 2)
    row = {"ours-fast": {"actions": baseline.clone()}, "lerobot": {"actions": ref.clone()},
           "selftest-skip-dit-block": {"actions": baseline + 0.0105 * torch.linspace(1.0, 2.0, 10).view(5, 2)}}
    failures = groot.check_displacement(row, {"float32": ref}, baseline, chunk=2, dtype="float32")
    assert len(failures) == 1 and failures[0].startswith("ours-fast float32: rms")
    assert row["ours-fast"]["check"]["errors"]["rms"] > 0.99 and row["ours-fast"]["check"]["actions"]["rms"] < 0.03
    assert row["lerobot"]["check"]["passed"]
    assert row["selftest-skip-dit-block"]["check"]["passed"]           # 5 % of the displacement: caught
    assert torch.equal(row["lerobot"]["actions"], ref)                  # the row keeps the raw actions
    missing = groot.check_displacement({"ours-fast": {"actions": ref}}, {"float32": "boom"}, baseline, chunk=2,
                                       dtype="float32")
    assert len(missing) == 1 and "no float32 reference" in missing[0] and "boom" in missing[0]


def test_every_groot_side_has_a_declared_bound_and_pi0s_are_unchanged() -> None:
    for side in groot.SIDES + groot.SELF_TEST_SIDES:
        for dtype in groot.DTYPES:                 # bf16 too: LeRobot's autocast, against the float32 reference
            bound = action_checks.bound_for(side, dtype, "groot")
            assert bound is not None and bound.reference == "float32" and bound.rms > 0 and bound.max > 0, side
        assert action_checks.bound_for(side, "float16", "groot") is None
    assert action_checks.bound_for("selftest-skip-dit-block", "float32", "groot") == \
        action_checks.bound_for("ours-fast", "float32", "groot")
    assert action_checks.bound_for("ours-fast", "bfloat16") is action_checks.BOUNDS[("ours-fast", "bfloat16")]
