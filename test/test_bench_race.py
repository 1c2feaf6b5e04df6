"""The policy race (``benchmarks.policies`` / ``benchmarks.race``): it runs on the CPU at smoke size, checks
outputs inside the run, fails above the tolerance, records flags and provenance; its helpers (LeRobot modes,
compile counting, bootstrap interval) do what they say. Behaviour only: no timing is asserted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import lerobot_side, spread
from benchmarks.race import failures, first_chunk_error


def _flags() -> tuple[bool, bool, bool]:
    return (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def _run_policies(tmp_path: Path, *extra: str) -> tuple[int, dict, str]:
    """Run the race in this process; it must leave ``lerobot_eval``'s flags as it found them (off here),
    or every test after it would run with TF32 and cudnn.benchmark on."""
    from lerobot_reference import lerobot
    lerobot()                                     # skips without the LeRobot reference
    from benchmarks import policies
    out, js = tmp_path / "race.md", tmp_path / "race.json"
    found = _flags()
    torch.backends.cudnn.benchmark = torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        code = policies.main(["--size", "smoke", "--out", str(out), "--json", str(js), *extra])
        assert _flags() == (False, False, False), "the run left TF32 / cudnn.benchmark on for the rest of the process"
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = found
    return code, json.loads(js.read_text()), out.read_text()


def test_smoke_race_checks_both_precisions_and_records_spread_flags_and_provenance(tmp_path: Path) -> None:
    code, result, text = _run_policies(tmp_path, "--policies", "act,diffusion", "--dtypes", "float32,bfloat16",
                                       "--lerobot-modes", "eager,autocast")
    assert code == 0, result["failures"]
    assert set(result["results"]) == {"act fp32", "act bf16", "diffusion fp32", "diffusion bf16"}
    for name, r in result["results"].items():
        expected = "LeRobot eager" if name.endswith("fp32") else "LeRobot autocast"
        assert set(r["sides"]) == {"ours", expected}, name
        ours = r["sides"]["ours"]
        assert ours["first_chunk"]["passed"] and ours["first_chunk"]["max_rel"] <= r["tolerance_rel"]
        assert r["tolerance_rel"] == (1e-3 if name.endswith("fp32") else 1e-1)     # CPU: no TF32
        assert ours["replans"] >= result["settings"]["replans"] and ours["pops"] > 0
        assert set(ours["over_period"]) == {"20ms", "33ms"}
        assert ours["episode"]["min"] <= ours["episode"]["median"] <= ours["episode"]["max"]
        assert len(ours["episodes_ms"]) == result["settings"]["episodes"]
        sp = r["sides"][expected]["speedup"]
        assert sp["low"] <= sp["ratio"] <= sp["high"]
        assert r["headline"]["fastest"] == expected and r["headline"]["compiled"] is None
    # the LeRobot eager fp32 side is the reference itself: its first chunk is bit-identical to it
    assert result["results"]["act fp32"]["sides"]["LeRobot eager"]["first_chunk"]["max_abs"] == 0.0
    prov = result["provenance"]
    assert prov["flags"]["cudnn.benchmark"] is True and prov["flags"]["cuda.matmul.allow_tf32"] is True
    assert prov["flags"]["inference_mode"] == "every step of both sides"
    assert prov["git"]["commit"] and prov["packages"]["lerobot"] == "0.4.4" and prov["cpu"]
    assert "pre-processor" in result["timed"]["lerobot"] and "PolicyEngine.step" in result["timed"]["ours"]
    assert text.index("## Headline") < text.index("## Every side") and "CPU only" in text
    assert result["complete"] is True and "Partial" not in text


def test_a_first_chunk_above_the_tolerance_fails_the_run(tmp_path: Path) -> None:
    code, result, text = _run_policies(tmp_path, "--policies", "act", "--dtypes", "float32",
                                       "--lerobot-modes", "eager", "--tol-fp32", "-1")
    assert code == 1
    assert any("act fp32: ours: actions differ" in f for f in result["failures"]), result["failures"]
    assert "## Check failed" in text and "**FAIL**" in text


def test_a_side_that_fails_is_reported_and_ours_failing_fails_the_run(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import race

    def broken(self, obs, noise):
        raise RuntimeError("engine broke")
    monkeypatch.setattr(race.OurSide, "step", broken)
    code, result, text = _run_policies(tmp_path, "--policies", "act", "--dtypes", "float32",
                                       "--lerobot-modes", "eager")
    r = result["results"]["act fp32"]
    assert code == 1 and "ours" not in r["sides"] and "LeRobot eager" in r["sides"]
    assert r["errors"]["ours"] == "RuntimeError: engine broke"
    assert result["failures"] == ["act fp32: ours did not run (RuntimeError: engine broke)"]


def test_failures_name_a_side_that_did_not_run() -> None:
    ok = {"sides": {"ours": {"first_chunk": {"passed": True, "max_rel": 0.0}}}, "errors": {}, "tolerance_rel": 1e-3}
    missing = {"sides": {}, "errors": {"ours": "RuntimeError: boom"}, "tolerance_rel": 1e-3}
    assert failures({"a": ok}) == []
    assert failures({"b": missing}) == ["b: ours did not run (RuntimeError: boom)"]


def test_a_lerobot_side_beyond_the_tolerance_fails_the_run() -> None:
    """A LeRobot mode whose actions are off (a compiled graph gone wrong) is no baseline to be faster than."""
    good = {"passed": True, "max_rel": 0.0}
    r = {"sides": {"ours": {"first_chunk": good},
                   "LeRobot compiled (reduce-overhead)": {"first_chunk": {"passed": False, "max_rel": 0.3}}},
         "errors": {}, "tolerance_rel": 1e-1}
    assert failures({"act bf16": r}) == ["act bf16: LeRobot compiled (reduce-overhead): actions differ from LeRobot "
                                          "eager fp32 by 3.000e-01 (relative) > 1e-01"]


def test_every_side_of_ours_is_checked() -> None:
    """SmolVLA races ours in both numerics: either one beyond the tolerance, or missing, fails the run."""
    check = {"passed": True, "max_rel": 0.0, "steps": 2, "episode_max_rel": 0.0, "episode_steps": 8}
    bad = {**check, "passed": False, "max_rel": 1e-4, "episode_max_rel": 5e-3}
    r = {"sides": {"ours-fast": {"first_chunk": check}, "ours-exact": {"first_chunk": bad}},
         "ours_sides": ["ours-fast", "ours-exact"], "errors": {}, "tolerance_rel": 1e-3}
    assert failures({"s": r}) == ["s: ours-exact: actions differ from LeRobot eager fp32 by 1.000e-04 over the first "
                                  "chunk, 5.000e-03 over its 8 checked steps (relative) > 1e-03"]
    r["sides"].pop("ours-exact")
    r["errors"]["ours-exact"] = "RuntimeError: boom"
    assert failures({"s": r}) == ["s: ours-exact did not run (RuntimeError: boom)"]


def test_a_longer_reference_checks_the_whole_episode_beside_the_first_chunk() -> None:
    ref = torch.tensor([[1.0, 0.0], [1.0, 0.0], [4.0, 0.0]])
    ours = torch.tensor([[1.0, 0.0], [1.1, 0.0], [4.0, 2.0]])
    err = first_chunk_error(ours, ref, chunk=2)
    assert err["steps"] == 2 and err["max_rel"] == pytest.approx(0.1)
    assert err["episode_steps"] == 3 and err["episode_max_rel"] == pytest.approx(0.5)


def test_first_chunk_error_is_relative_to_the_largest_reference_action() -> None:
    ref = torch.tensor([[2.0, -4.0], [1.0, 0.0]])
    ours = torch.tensor([[2.0, -4.0], [1.2, 0.0], [9.0, 9.0]])      # steps past the chunk are not compared
    err = first_chunk_error(ours, ref)
    assert err["steps"] == 2 and err["max_abs"] == pytest.approx(0.2) and err["max_rel"] == pytest.approx(0.05)


def test_lerobot_modes_per_precision_and_policy() -> None:
    fp32 = lerobot_side.modes("diffusion", "fp32", compile_mode="reduce-overhead")
    assert [(m.key, m.compile_mode) for m in fp32] == [("eager", None), ("compiled", "reduce-overhead"),
                                                       ("compiled-default", "default")]
    # LeRobot runs bf16 weights only for SmolVLA's VLM; ACT and Diffusion Policy race it under autocast
    assert [m.key for m in lerobot_side.modes("act", "bf16")] == ["autocast", "autocast-compiled"]
    smolvla = lerobot_side.modes("smolvla", "bf16")
    assert [m.key for m in smolvla] == ["autocast", "autocast-compiled", "bf16-weights", "bf16-weights-compiled"]
    assert all(m.autocast != m.bf16_weights for m in smolvla)
    assert [m.key for m in lerobot_side.modes("act", "fp32", ("eager", "autocast"))] == ["eager"]


def test_a_compiled_lerobot_diffusion_gets_the_eager_weights_through_its_own_compile_model(tmp_path: Path) -> None:
    from lerobot_reference import lerobot
    lerobot()
    from benchmarks.policies import make_checkpoint
    eager, _ = make_checkpoint("diffusion", tmp_path / "ckpt", "smoke")
    mode = lerobot_side.modes("diffusion", "fp32")[1]
    compiled = lerobot_side.build_policy("diffusion", eager, mode)
    assert compiled.config.compile_model and compiled.config.compile_mode == "reduce-overhead"
    assert type(compiled.diffusion.unet).__name__ == "OptimizedModule"       # LeRobot compiled its UNet
    theirs = {k.replace("._orig_mod", ""): v for k, v in compiled.state_dict().items()}
    assert theirs.keys() == eager.state_dict().keys()
    assert all(torch.equal(theirs[k], v) for k, v in eager.state_dict().items())
    assert lerobot_side.build_policy("diffusion", eager, lerobot_side.modes("diffusion", "fp32")[0]) is eager


def test_warm_up_runs_until_an_episode_compiles_nothing() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.sin(x) * 2, backend="eager")
    settled = lerobot_side.warm_up(lambda: f(torch.ones(3)), compiled=True, min_episodes=2, max_episodes=5)
    assert settled["settled"] and settled["warmup_episodes"] == 2 and settled["compiled_frames"] == 1

    g = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    sizes = iter(range(1, 10))

    def always_new() -> None:                      # a new static shape each episode: recompiles every time
        g(torch.ones(next(sizes)))

    busy = lerobot_side.warm_up(always_new, compiled=True, min_episodes=2, max_episodes=3)
    assert not busy["settled"] and busy["warmup_episodes"] == 3 and busy["compiled_frames"] == 3
    eager = lerobot_side.warm_up(lambda: None, compiled=False, min_episodes=1, max_episodes=1)
    assert eager["settled"] and eager["warmup_episodes"] == 1 and eager["compiled_frames"] == 0


def test_bootstrap_interval_brackets_the_median_ratio() -> None:
    slow, fast = [10.0, 11.0, 12.0, 30.0], [2.0, 2.1, 2.2, 1.9]
    ci = spread.bootstrap_ratio(slow, fast, reps=500)
    assert ci["ratio"] == pytest.approx(11.5 / 2.05)
    assert ci["low"] <= ci["ratio"] <= ci["high"] and ci["reps"] == 500
    assert spread.over_periods([5.0, 25.0, 40.0, 10.0]) == {"20ms": 0.5, "33ms": 0.25}
    assert spread.three_numbers([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}


def test_the_time_budget_skips_compiled_modes_that_would_not_fit_and_says_so() -> None:
    import time

    from benchmarks.race import RaceSettings, _budget_allows
    s = RaceSettings(budget_s=100.0, started=time.perf_counter() - 40.0, jobs_total=4, jobs_done=0)
    eager, compiled, optional = lerobot_side.modes("act", "fp32")
    notes: list[str] = []
    assert _budget_allows(s, eager, 1e9, notes, "act fp32")                 # eager modes always run
    assert _budget_allows(s, compiled, 50.0, notes, "act fp32")             # 50 s of the 60 s left
    assert not _budget_allows(s, compiled, 70.0, notes, "act fp32")
    # an optional mode gets this job's share (100 s / 4 jobs, 40 s already spent): none left
    assert not _budget_allows(s, optional, 1.0, notes, "act fp32")
    s.jobs_done = 2                                                          # shares carried forward: 75 s
    assert _budget_allows(s, optional, 10.0, notes, "act fp32")
    assert len(notes) == 2 and "skipped act fp32 compiled" in notes[0] and "compiled-default" in notes[1]
    assert _budget_allows(RaceSettings(), compiled, 1e9, notes, "x")         # no budget: everything runs
