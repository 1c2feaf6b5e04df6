"""The complete SmolVLA capsule: prefix KV, action queue, noise stream, instruction, positions (CPU, CI size).

The policy here is our SmolVLA at CI size with seeded random weights (no
checkpoint, no LeRobot needed): these tests are about state, parity is in
``test_lerobot_smolvla.py``.
"""
from __future__ import annotations

import pytest
import torch

from host_reads import no_host_reads
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction_ids
from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import SmolVLAConfig, VLMSizes
from flashrt_ros.models.lerobot.smolvla.modeling_smolvla import SmolVLAPolicy
from flashrt_ros.runtime.errors import InvalidArgument

TINY_VLM = VLMSizes(text_hidden=64, text_heads=4, text_kv_heads=2, head_dim=16, text_intermediate=128,
                    vocab_size=512, vision_hidden=32, vision_heads=2, vision_intermediate=64, vision_layers=2,
                    patch_size=8, image_size=32, scale_factor=2)
CAMERA = "observation.images.top"
INSTRUCTION = [5, 17, 99, 3]


def tiny_policy(seed: int = 0) -> SmolVLAPolicy:
    cfg = SmolVLAConfig(state_dim=4, env_state_dim=0, action_dim=3, cameras=(CAMERA,), image_shape=(3, 24, 40),
                        vlm=TINY_VLM, chunk_size=6, n_action_steps=5, max_state_dim=8, max_action_dim=8,
                        resize_imgs_with_padding=(32, 32), tokenizer_max_length=8, num_vlm_layers=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = SmolVLAPolicy(cfg)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.2 * torch.randn_like(p))
    return policy.eval().requires_grad_(False)


def observation(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return {"observation.state": torch.randn(4, generator=g), CAMERA: torch.rand(3, 24, 40, generator=g)}


@pytest.fixture
def engine(tmp_path):
    eng = PolicyEngine(tiny_policy(), directory=str(tmp_path / "capsules"), rollback_depth=4)
    set_instruction_ids(eng, INSTRUCTION)
    yield eng
    eng.close()


def run(engine: PolicyEngine, start: int, n: int) -> torch.Tensor:
    return torch.stack([engine.step(observation(start + i)) for i in range(n)])


def test_the_capsule_holds_the_whole_vla_state(engine):
    names = set(engine.arena)
    p = engine.policy
    assert {f"{p.KEY}0", f"{p.VALUE}3", p.PREFIX_LEN, p.LANG, p.LANG_LEN, p.QUEUE, p.LEFT, p.RNG_SEED,
            p.PLANS} <= names
    run(engine, 0, 2)
    # live extent: image tokens + instruction + state; the KV of each layer is copied only that far
    assert int(engine.arena[p.PREFIX_LEN]) == 4 + len(INSTRUCTION) + 1
    assert engine.arena.live_view(f"{p.KEY}0").shape[0] == 4 + len(INSTRUCTION) + 1
    assert engine.arena[f"{p.KEY}0"][int(engine.arena[p.PREFIX_LEN]):].abs().max() == 0


def test_snapshot_mid_chunk_other_work_restore_is_bit_identical(engine, tmp_path):
    reference = PolicyEngine(tiny_policy(), directory=str(tmp_path / "ref"))
    set_instruction_ids(reference, INSTRUCTION)
    uninterrupted = run(reference, 0, 17)                  # 17 steps: 4 plans (chunks of 5)

    first = run(engine, 0, 7)                              # mid-chunk (2 actions left)
    engine.capsules.snapshot("mid")
    set_instruction_ids(engine, [1, 2])                    # other work: another instruction, other
    run(engine, 50, 9)                                     # observations, two more plans
    engine.capsules.reset(seed=7)
    run(engine, 80, 3)
    engine.capsules.restore("mid")
    resumed = run(engine, 7, 10)
    assert torch.equal(torch.cat([first, resumed]), uninterrupted)


def test_kv_only_restore_diverges(engine, tmp_path):
    reference = PolicyEngine(tiny_policy(), directory=str(tmp_path / "ref"))
    set_instruction_ids(reference, INSTRUCTION)
    uninterrupted = run(reference, 0, 17)
    run(engine, 0, 7)
    engine.capsules.snapshot("mid")
    set_instruction_ids(engine, [1, 2])
    run(engine, 50, 9)
    engine.capsules.restore("mid", groups={"kv"})          # prefix KV back, queue / noise / instruction not
    resumed = run(engine, 7, 10)
    assert not torch.equal(resumed, uninterrupted[7:])
    assert (resumed - uninterrupted[7:]).abs().max() > 1e-3


def test_fork_into_noise_seeds_reuses_the_prefix_and_shares_nothing(engine):
    run(engine, 0, 1)                                      # one prefill: the prefix KV of observation 0
    engine.capsules.snapshot("prefix")
    kv_before = engine.arena[f"{engine.policy.KEY}0"].clone()
    draws = {}
    for seed in (1, 2, 3):
        engine.capsules.fork("prefix", f"seed{seed}")
    engine.capsules.verify("prefix")                       # records its hashes (CPU/device tier: none yet)
    for seed in (1, 2, 3):
        engine.capsules.restore(f"seed{seed}")
        engine.redraw(seed)                                # no VLM run: denoise over the stored prefix
        assert torch.equal(engine.arena[f"{engine.policy.KEY}0"], kv_before)
        draws[seed] = run(engine, 1, 4)
        engine.capsules.snapshot(f"seed{seed}", overwrite=True)
    assert not torch.equal(draws[1], draws[2]) and not torch.equal(draws[2], draws[3])
    # seed 1 again from the untouched prefix: the same draw; its own capsule moved on alone
    engine.capsules.restore("prefix")
    engine.redraw(1)
    assert torch.equal(run(engine, 1, 4), draws[1])
    report = engine.capsules.verify("prefix")              # the forks' runs never wrote the source's bytes
    assert report.ok and report.verified and not report.hashed_now


def test_fork_into_instructions_shares_nothing(engine):
    run(engine, 0, 2)
    engine.capsules.snapshot("scene")
    instructions = {"a": [7, 8, 9], "b": [10, 11], "c": [12, 13, 14, 15, 16]}
    for name in instructions:
        engine.capsules.fork("scene", name)
    first = {}
    for name, ids in instructions.items():
        engine.capsules.restore(name)
        set_instruction_ids(engine, ids)
        first[name] = run(engine, 2, 6)
        engine.capsules.snapshot(name, overwrite=True)
    assert not torch.equal(first["a"], first["b"]) and not torch.equal(first["b"], first["c"])
    # each branch continues alone, whatever the others did in between
    engine.capsules.restore("a")
    again = run(engine, 8, 3)
    engine.capsules.restore("c")
    run(engine, 8, 3)
    engine.capsules.restore("a")
    assert torch.equal(run(engine, 8, 3), again)
    assert int(engine.arena[engine.policy.LANG_LEN]) == 3


def test_rollback_undoes_an_instruction(engine):
    run(engine, 0, 3)
    before = engine.arena[engine.policy.LANG].clone()
    set_instruction_ids(engine, [42])
    assert engine.next_step_replans()                      # mid-chunk: the new instruction empties the queue
    engine.capsules.rollback(1)
    assert torch.equal(engine.arena[engine.policy.LANG], before)
    assert not engine.next_step_replans()                  # the chunk in progress is back


def test_bad_instruction_and_redraw_before_any_prefix_are_refused(engine):
    boundary = engine.status()["boundary"]
    with pytest.raises(InvalidArgument, match="at most"):
        set_instruction_ids(engine, list(range(20)))
    with pytest.raises(InvalidArgument, match="in \\[0, 512\\)"):
        set_instruction_ids(engine, [600])
    with pytest.raises(InvalidArgument, match="nothing to redraw"):
        engine.redraw(3)
    with pytest.raises(InvalidArgument, match="int64"):
        engine.redraw(1 << 63)
    assert int(engine.arena[engine.policy.LANG_LEN]) == len(INSTRUCTION)
    assert engine.status()["boundary"] == boundary


def test_pops_do_not_run_the_vlm_or_the_expert(engine):
    """The engine's host choice: a replanning step runs the vision encoder, the VLM and the expert;
    a pop runs none of them (counted by forward hooks, not timed)."""
    model = engine.policy.model.vlm_with_expert
    calls = {"vision": 0, "vlm": 0, "expert": 0}
    for what, module in (("vision", model.vlm.model.vision_model),
                         ("vlm", model.vlm.model.text_model.layers[0].input_layernorm),
                         ("expert", model.lm_expert.layers[0].input_layernorm)):
        module.register_forward_hook(lambda *_, what=what: calls.__setitem__(what, calls[what] + 1))
    replans = []
    for i in range(11):
        replans.append(engine.next_step_replans())
        before = dict(calls)
        engine.step(observation(i))
        ran = {k: calls[k] > before[k] for k in calls}
        assert ran == dict.fromkeys(calls, replans[-1]), (i, ran)
    assert replans == [i % 5 == 0 for i in range(11)]       # chunks of n_action_steps = 5
    assert calls["vision"] == calls["vlm"] == 3
    assert engine.position == 11
    engine.capsules.rollback(2)
    assert engine.position == 9 and not engine.next_step_replans()


def test_redraw_is_the_first_chunk_of_that_seed_over_the_stored_prefix(engine, tmp_path):
    reference = PolicyEngine(tiny_policy(), directory=str(tmp_path / "ref"))
    set_instruction_ids(reference, INSTRUCTION)
    reference.capsules.reset(seed=4)
    expected = run(reference, 0, 5)                         # one chunk planned over observation 0
    engine.capsules.reset(seed=9)
    run(engine, 0, 2)                                       # the prefix of observation 0, seed 9's chunk
    calls = []
    engine.policy.model.vlm_with_expert.vlm.model.vision_model.register_forward_hook(lambda *_: calls.append(1))
    engine.redraw(4)
    assert not calls and engine.position == 2 and engine.episode_seed == 4
    assert not engine.next_step_replans()
    engine.capsules.rollback(1)                             # one boundary: undone
    assert engine.episode_seed == 9 and engine.position == 2
    engine.redraw(4)
    assert torch.equal(run(engine, 50, 5), expected)        # pops: the observation is not read
    assert engine.next_step_replans() and not calls


def test_planned_actions_are_the_next_actions_of_the_queue(engine):
    run(engine, 0, 2)
    planned = engine.policy.planned_actions(engine.arena)
    assert planned.shape == (3, 3)
    assert torch.equal(planned, run(engine, 2, 3))
    assert engine.policy.planned_actions(engine.arena).shape == (0, 3)


def test_step_bodies_and_redraw_read_nothing_on_the_host(engine, monkeypatch):
    """What a captured body must not do (a host read syncs and breaks capture): checked on CPU."""
    policy, arena = engine.policy, engine.arena
    obs = observation(0)
    with no_host_reads(monkeypatch):
        policy.step_observation(obs, arena, replan=True)
        policy.step_observation(obs, arena, replan=False)
        left = arena[policy.LEFT].clone()
        policy.redraw_chunk(arena)
    assert int(left) == policy.cfg.n_action_steps - 2
    assert int(arena[policy.LEFT]) == policy.cfg.n_action_steps


def test_bf16_runs_with_bf16_kv_and_stays_near_fp32(engine, tmp_path):
    bf16 = PolicyEngine(tiny_policy().to(torch.bfloat16), directory=str(tmp_path / "bf16"))
    set_instruction_ids(bf16, INSTRUCTION)
    assert bf16.arena[f"{bf16.policy.KEY}0"].dtype == torch.bfloat16
    low, full = run(bf16, 0, 7), run(engine, 0, 7)
    assert torch.isfinite(low).all() and low.dtype == torch.float32
    print(f"bf16 vs fp32: max relative error {float((low - full).abs().max() / full.abs().max()):.2e}")
    assert (low - full).abs().max() <= 0.06 * full.abs().max()      # measured 2.0e-2 at CI size
