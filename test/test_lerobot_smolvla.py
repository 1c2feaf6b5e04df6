"""SmolVLA checkpoints written by LeRobot 0.4.4 run in our engine with LeRobot's actions (fp32, CPU, CI size).

Each case builds ``SmolVLAPolicy`` with LeRobot's own classes over a local
SmolVLM2 directory (``smolvla_reference.py``: config at CI size, SmolLM2's
tokenizer with the image tokens), perturbs every weight with seeded noise, saves
it with ``save_pretrained`` and its processors, loads the directory with
``policy:=lerobot:<dir>`` and compares three chunks of consecutive steps with
``preprocessor -> select_action(noise=...) -> postprocessor``, the noise of
each plan being the one our counter-based stream draws; in both numerics
(``exact``: LeRobot's operations; ``fast``: fused kernels, equal within rounding).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lerobot_reference import case_features, max_relative_error, observations, processors
from smolvla_reference import TINY, make_smolvla_checkpoint, write_vlm_directory
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.lerobot.smolvla.modeling_smolvla import SmolVLAPolicy as OurSmolVLA
from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.runtime.errors import InvalidArgument

TOLERANCE = 1e-5
TASK = "pick up the red cube"

CASES = {
    # two non-square cameras (resize with padding), cross/self attention alternating, mean-std
    "two_cameras_cross_attn_meanstd": dict(cameras=2, hw=(24, 40), state=5, env=0, action=4, norm="MEAN_STD",
                                           cfg=dict()),
    # one square camera, an expert of half the layers (self-attention only in layer 0), min-max, full chunk used
    "half_expert_minmax": dict(cameras=1, hw=(32, 32), state=3, env=0, action=6, norm="MIN_MAX",
                               cfg=dict(num_expert_layers=2, self_attn_every_n_layers=4, n_action_steps=6)),
    # an empty camera slot (LeRobot fills it with -1 and masks it out; we leave it out of the prefix)
    "empty_camera_slot": dict(cameras=1, hw=(32, 32), state=4, env=0, action=3, norm="MEAN_STD",
                              cfg=dict(empty_cameras=1)),
    # all layers self-attention, instruction padded to max_length
    "self_attn_padded_instruction": dict(cameras=1, hw=(40, 24), state=4, env=0, action=3, norm="MEAN_STD",
                                         cfg=dict(attention_mode="self_attn", pad_language_to="max_length")),
}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    return write_vlm_directory(tmp_path_factory.mktemp("smolvlm2_tiny"), TINY)


def plan_noise(seed: int, plan: int, config) -> torch.Tensor:
    """The noise our stream draws for plan ``plan`` of an episode seeded ``seed``."""
    n = config.chunk_size * config.max_action_dim
    return normal(torch.tensor(seed), torch.tensor(plan), n).view(1, config.chunk_size, config.max_action_dim)


def lerobot_actions(policy, config, directory: Path, obs: list[dict], task: str, seed: int = 0) -> torch.Tensor:
    pre, post = processors(config, directory)
    policy.reset()
    out = []
    with torch.no_grad():
        for i, o in enumerate(obs):
            batch = pre({**{k: v.clone() for k, v in o.items()}, "task": task})
            noise = plan_noise(seed, i // config.n_action_steps, config)
            out.append(post(policy.select_action(batch, noise=noise))[0])
    return torch.stack(out)


def engine_for(directory: Path, tmp_path: Path, task: str, numerics: str = "exact") -> PolicyEngine:
    engine = PolicyEngine(make_policy(f"lerobot:{directory}", numerics=numerics), directory=str(tmp_path / "capsules"))
    set_instruction(engine, task)
    return engine


def set_instruction(engine: PolicyEngine, task: str) -> None:
    from flashrt_ros.engine.vla import set_instruction as engine_set
    engine_set(engine, task)


@pytest.mark.parametrize("name", sorted(CASES))
def test_smolvla_matches_lerobot_select_action_over_three_chunks(name, tmp_path, vlm_dir):
    case = CASES[name]
    directory, ref, config = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm_dir)
    steps = 3 * config.n_action_steps
    obs = observations(case_features(case), steps, seed=5)
    expected = lerobot_actions(ref, config, directory, obs, TASK)
    for numerics in ("exact", "fast"):                  # fast: the same function in fused kernels
        engine = engine_for(directory, tmp_path / numerics, TASK, numerics)
        ours = torch.stack([engine.step(o) for o in obs])
        err = max_relative_error(ours, expected)
        print(f"{name} {numerics}: max relative error {err:.2e} over {steps} steps (3 chunks)")
        assert err <= TOLERANCE, f"{name} {numerics}: max relative error {err:.3e}"
    n = config.n_action_steps
    assert (expected[n:2 * n] - expected[:n]).abs().max() > 1e-3     # a new chunk is a new plan


def test_instruction_ids_match_lerobot_tokenizer_step(tmp_path, vlm_dir):
    directory, _, config = make_smolvla_checkpoint(tmp_path / "ckpt", CASES["two_cameras_cross_attn_meanstd"], vlm_dir)
    pre, _ = processors(config, directory)
    feats = case_features(CASES["two_cameras_cross_attn_meanstd"])
    batch = pre({**observations(feats, 1, seed=1)[0], "task": TASK})
    policy = make_policy(f"lerobot:{directory}")
    assert isinstance(policy, OurSmolVLA)
    assert policy.instruction_ids(TASK) == batch["observation.language.tokens"][0].tolist()


def test_the_instruction_changes_the_actions(tmp_path, vlm_dir):
    directory, _, config = make_smolvla_checkpoint(tmp_path / "ckpt", CASES["two_cameras_cross_attn_meanstd"], vlm_dir)
    obs = observations(case_features(CASES["two_cameras_cross_attn_meanstd"]), 1, seed=2)[0]
    a = engine_for(directory, tmp_path / "a", TASK).step(obs)
    b = engine_for(directory, tmp_path / "b", "put the cube in the box").step(obs)
    assert (a - b).abs().max() > 1e-4


def test_unsupported_smolvla_options_are_refused_by_name(tmp_path, vlm_dir):
    import json
    directory, _, _ = make_smolvla_checkpoint(tmp_path / "ckpt", CASES["half_expert_minmax"], vlm_dir)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["adapt_to_pi_aloha"] = True
    (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidArgument, match="adapt_to_pi_aloha"):
        make_policy(f"lerobot:{directory}")


def test_too_long_instruction_ids_are_refused_before_anything_changes(tmp_path, vlm_dir):
    directory, _, config = make_smolvla_checkpoint(tmp_path / "ckpt", CASES["half_expert_minmax"], vlm_dir)
    engine = engine_for(directory, tmp_path, TASK)
    policy = engine.policy
    before = engine.arena[policy.LANG].clone()
    from flashrt_ros.engine.vla import set_instruction_ids
    with pytest.raises(InvalidArgument, match="at most"):
        set_instruction_ids(engine, list(range(config.tokenizer_max_length + 1)))
    assert torch.equal(engine.arena[policy.LANG], before)


def test_policy_instruction_parameter_starts_every_episode(tmp_path, vlm_dir):
    from types import SimpleNamespace

    from flashrt_ros.engine.factory import build_engine
    directory, _, _ = make_smolvla_checkpoint(tmp_path / "ckpt", CASES["half_expert_minmax"], vlm_dir)
    config = SimpleNamespace(engine_kind="policy", policy=f"lerobot:{directory}", policy_instruction=TASK,
                             device="cpu", dtype="float32", numerics="auto", capsule_directory=str(tmp_path / "caps"),
                             capsule_device_budget_mb=64, capsule_host_budget_mb=64, capsule_disk_budget_mb=64,
                             rollback_depth=2, default_tier="device", boundary_timeout_s=5.0)
    engine = build_engine(config, log=lambda _: None)
    p = engine.policy
    assert p.numerics == "exact"                                        # 'auto' on the CPU
    assert build_engine(SimpleNamespace(**{**vars(config), "numerics": "fast"}),
                        log=lambda _: None).policy.numerics == "fast"
    with pytest.raises(InvalidArgument, match="SmolVLAPolicy has no float8 weights"):     # π0 / π0.5 only
        build_engine(SimpleNamespace(**{**vars(config), "numerics": "fp8"}), log=lambda _: None)
    ids = p.instruction_ids(TASK)
    assert engine.arena[p.LANG][: len(ids)].tolist() == ids and int(engine.arena[p.LANG_LEN]) == len(ids)
    set_instruction(engine, "put the cube in the box")
    engine.capsules.reset()
    assert int(engine.arena[p.LANG_LEN]) == len(ids)
    with pytest.raises(InvalidArgument, match="takes no language instruction"):
        build_engine(SimpleNamespace(**{**vars(config), "policy": "gru"}), log=lambda _: None)


def test_a_checkpoint_with_tied_embeddings_saved_as_lm_head_only_loads(tmp_path, vlm_dir):
    """safetensors keeps one name of a tied pair (``lm_head`` sorts first): the embeddings come from it."""
    from safetensors.torch import load_file, save_file
    case = CASES["half_expert_minmax"]
    directory, _, _ = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm_dir)
    obs = observations(case_features(case), 7, seed=3)
    engine = engine_for(directory, tmp_path / "a", TASK)
    before = torch.stack([engine.step(o) for o in obs])
    weights = load_file(str(directory / "model.safetensors"))
    embed = "model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
    weights["model.vlm_with_expert.vlm.lm_head.weight"] = weights.pop(embed)
    save_file(weights, str(directory / "model.safetensors"))
    engine = engine_for(directory, tmp_path / "b", TASK)
    after = torch.stack([engine.step(o) for o in obs])
    assert torch.equal(before, after)
