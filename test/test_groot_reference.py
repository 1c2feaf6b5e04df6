"""The GR00T N1.5 test reference (``groot_reference``): LeRobot 0.4.4's own ``GrootPolicy`` built tiny, seeded and
offline on transformers 4.57.6, in its own process.

What a parity test of our GR00T needs from it, checked here: a complete LeRobot checkpoint; actions, inputs and
noise recorded; runs that are bit-identical (same case, another process) and a reloaded checkpoint that
reproduces them bit for bit from the recorded inputs and noise; the noise regenerable from its seed; LeRobot's
action-queue and unnormalisation semantics as ``groot_reference/NOTES.md`` describes them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from groot_reference import (TINY, Case, reference_inputs, reference_record, reference_run, replay_record,
                             run_reference)
from groot_reference.reference import NOISE_SEED_STRIDE


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("groot_reference")
    out = {"a": Case(directory=str(root / "a"), n_action_steps=8),
           "b": Case(directory=str(root / "b"), n_action_steps=8, seed=1),
           "a2": Case(directory=str(root / "a2"), n_action_steps=8),
           "c": Case(directory=str(root / "c"), seed=2, noise_seed=3, constant_dims=True, attn="sdpa",
                     cameras=1, steps=18)}
    run_reference([out["a"], out["b"]], root / "first")
    run_reference([out["a2"], out["c"]], root / "second")      # another process: a2 repeats a
    run_reference([out["a"]], root / "replay", replay=True)    # a's checkpoint reloaded in a third process
    return out


def test_the_checkpoint_is_lerobots_and_complete(cases):
    d = Path(cases["a"].directory)
    for name in ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json",
                 "policy_preprocessor_step_2_groot_pack_inputs_v3.safetensors",
                 "policy_postprocessor_step_0_groot_action_unpack_unnormalize_v1.safetensors",
                 "base/config.json", "base/model.safetensors", "eagle2hg-processor-groot-n1p5/config.json",
                 "eagle2hg-processor-groot-n1p5/tokenizer.json", "groot_sizes.json"):
        assert (d / name).is_file(), name
    config = json.loads((d / "config.json").read_text())
    assert config["type"] == "groot" and config["base_model_path"] == str(d / "base")
    assert (config["max_state_dim"], config["max_action_dim"]) == (TINY["max_state_dim"], TINY["max_action_dim"])
    weights = load_file(str(d / "model.safetensors"))
    assert all(k.startswith("_groot_model.") for k in weights)
    assert sum(v.numel() for v in weights.values()) == reference_run(cases["a"])["parameters"] == 497_816
    # the seeded perturbation reaches norms (LeRobot initialises them to ones)
    assert not torch.equal(weights["_groot_model.action_head.vlln.weight"], torch.ones(TINY["text"]["hidden_size"]))
    stats = load_file(str(d / "policy_postprocessor_step_0_groot_action_unpack_unnormalize_v1.safetensors"))
    assert torch.equal(stats["action.min"], reference_inputs(cases["a"])["stats.action.min"])


def test_the_record_has_the_documented_shapes(cases):
    case, rec, inputs = cases["a"], reference_record(cases["a"]), reference_inputs(cases["a"])
    sizes = json.loads((Path(case.directory) / "groot_sizes.json").read_text())
    h, m = TINY["action_horizon"], TINY["max_action_dim"]
    assert inputs["observation.images.cam0"].shape == (case.steps, 3, *case.hw)
    assert inputs["observation.images.cam0"].dtype == torch.uint8
    assert inputs["observation.state"].shape == (case.steps, case.state)
    assert rec["actions"].shape == rec["actions_normalized"].shape == (case.steps, case.action)
    assert rec["plan_steps"].tolist() == [0, 8, 16]
    plans = len(rec["plan_steps"])
    assert rec["noise"].shape == rec["action_pred"].shape == (plans, 1, h, m)
    tile = TINY["image_size"]
    assert rec["eagle_pixel_values"].shape == (plans, case.cameras, 3, tile, tile)
    assert rec["state"].shape == (plans, 1, 1, TINY["max_state_dim"])
    assert rec["embodiment_id"].flatten().tolist() == [31] * plans          # new_embodiment
    ids = rec["eagle_input_ids"]
    t = ids.shape[-1]
    assert rec["backbone_features"].shape == (plans, 1, t, TINY["text"]["hidden_size"])
    assert int((ids[0] == sizes["image_token_index"]).sum()) == case.cameras * sizes["tokens_per_tile"]
    for k, v in rec.items():
        assert torch.isfinite(v.float()).all(), k
    assert rec["actions"].std() > 0.1 and (rec["actions"][1:] != rec["actions"][:-1]).any(dim=1).all()


def test_noise_is_the_seeded_draw_and_lerobots_queue_keeps_the_chunks_last_rows(cases):
    for case in (cases["a"], cases["c"]):
        rec = reference_record(case)
        for p in range(len(rec["plan_steps"])):
            torch.manual_seed(case.noise_seed * NOISE_SEED_STRIDE + p)
            assert torch.equal(rec["noise"][p], torch.randn(rec["noise"][p].shape))
        # the deque (maxlen n_action_steps) extended by a 16-row chunk keeps its last n rows
        skip = TINY["action_horizon"] - case.n_action_steps
        for s in range(case.steps):
            p = int((rec["plan_steps"] <= s).sum()) - 1
            row = skip + s - int(rec["plan_steps"][p])
            assert torch.equal(rec["actions_normalized"][s], rec["action_pred"][p, 0, row, :case.action]), (case, s)
    assert reference_record(cases["c"])["plan_steps"].tolist() == [0, 16]


def test_the_postprocessor_inverts_min_max(cases):
    for case in (cases["a"], cases["c"]):
        rec, inputs = reference_record(case), reference_inputs(case)
        lo, hi = inputs["stats.action.min"], inputs["stats.action.max"]
        expected = torch.where(hi != lo, (rec["actions_normalized"] + 1) / 2 * (hi - lo) + lo, lo)
        torch.testing.assert_close(rec["actions"], expected, rtol=1e-6, atol=1e-6)
    assert (reference_record(cases["c"])["actions"][:, 0] == reference_inputs(cases["c"])["stats.action.min"][0]).all()


def test_the_same_case_is_bit_identical_in_another_process(cases):
    first, again = reference_record(cases["a"]), reference_record(cases["a2"])
    assert first.keys() == again.keys()
    for k in first:
        assert torch.equal(first[k], again[k]), k
    w1 = load_file(str(Path(cases["a"].directory) / "model.safetensors"))
    w2 = load_file(str(Path(cases["a2"].directory) / "model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_another_seed_gives_other_weights_and_actions(cases):
    a, b = reference_record(cases["a"]), reference_record(cases["b"])
    assert torch.equal(a["noise"], b["noise"]) and torch.equal(a["eagle_input_ids"], b["eagle_input_ids"])
    assert (a["action_pred"] - b["action_pred"]).abs().max() > 1e-2
    assert (a["actions"] - b["actions"]).abs().max() > 1e-2


def test_lerobot_reloads_the_checkpoint_and_replays_the_recorded_noise_bit_exactly(cases):
    rec, replay = reference_record(cases["a"]), replay_record(cases["a"])
    assert rec.keys() == replay.keys()
    for k in rec:
        assert torch.equal(rec[k], replay[k]), k
