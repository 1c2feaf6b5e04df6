"""The complete GR00T N1.5 capsule and re-instruct by fork (CPU, tiny checkpoint; parity is test_groot_policy.py).

The capsule holds the image tokens and state of the last replan, the backbone features the action head reads,
the prompt, the action queue and the noise stream. Re-instruct by fork: a capsule taken after a replan holds the
encoded images; each fork takes another instruction and plans again from them (``engine.vla.reinstruct``)
without SigLIP, and the result equals a cold replan with that instruction. The language model attends over the
image tokens and the instruction together, so it runs again; a redraw runs only the action head. The checkpoint
is LeRobot's own, made once per module by ``groot_reference``; these tests compare our engine with itself.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_groot import N, observation, run, tiny_checkpoint
from flashrt_ros.engine.chunk_planner import ACTIVE, READY, ReplanConfig
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import reinstruct, set_instruction
from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy

TASK = "pick up the red cube"
OTHERS = ("put the cube in the box", "open the drawer", "stack the blue block")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("groot_capsules"))


def make_engine(checkpoint: Path, tmp_path, name: str = "e", replan: str = "sync") -> PolicyEngine:
    """``replan`` async: merged 2 steps after launch, ``late="wait"`` (an exact schedule)."""
    policy = load_lerobot_policy(checkpoint)
    assert isinstance(policy, GrootPolicy) and policy.cfg.n_action_steps == N
    cfg = ReplanConfig(mode=replan, delay_steps=2, late="wait")
    engine = PolicyEngine(policy, directory=str(tmp_path / name), rollback_depth=4, replan=cfg)
    set_instruction(engine, TASK)
    return engine


def count_calls(policy: GrootPolicy) -> dict[str, int]:
    """Forward-hook counters on SigLIP, the language model's first layer and the action head's state encoder
    (one forward each per plan)."""
    eagle = policy._groot_model.backbone.eagle_model
    modules = {"vision": eagle.vision_model.vision_model.embeddings,
               "language_model": eagle.language_model.model.layers[0],
               "action_head": policy._groot_model.action_head.state_encoder}
    calls = dict.fromkeys(modules, 0)
    for what, module in modules.items():
        module.register_forward_hook(lambda *_, what=what: calls.__setitem__(what, calls[what] + 1))
    return calls


def test_the_capsule_holds_the_whole_groot_state(checkpoint, tmp_path):
    engine = make_engine(checkpoint, tmp_path)
    p, arena = engine.policy, engine.arena
    assert {p.IMAGES, p.STATE_VEC, p.FEATURES, p.FEATURES_LEN, p.PROMPT, p.PROMPT_LEN, p.QUEUE, p.LEFT,
            p.RNG_SEED, p.PLANS} <= set(arena)
    assert int(arena[p.FEATURES_LEN]) == 0, "nothing to redraw from before a replan"
    set_instruction(engine, OTHERS[0])                                   # a longer prompt first
    run(engine, 0, 1)
    long = int(arena[p.FEATURES_LEN])
    set_instruction(engine, TASK)
    run(engine, 1, 2)
    length = int(arena[p.PROMPT_LEN])
    assert length == len(p.instruction_ids(TASK)) < long < p.prompt_capacity
    assert int(arena[p.FEATURES_LEN]) == length and arena.live_view(p.FEATURES).shape[0] == length
    assert arena[p.FEATURES][length:].abs().max() == 0, "rows past the prompt are zero"
    assert arena[p.FEATURES][:length].abs().amax(dim=1).min() > 0


def test_snapshot_mid_chunk_other_work_restore_is_bit_identical(checkpoint, tmp_path):
    uninterrupted = run(make_engine(checkpoint, tmp_path, "ref"), 0, 17)        # 4 plans of 5 actions
    engine = make_engine(checkpoint, tmp_path)
    first = run(engine, 0, 7)                                                   # mid-chunk: 3 actions left
    engine.capsules.snapshot("mid")
    set_instruction(engine, OTHERS[0])                                          # other work: another
    run(engine, 50, 9)                                                          # instruction, two plans,
    reinstruct(engine, OTHERS[1])                                               # a re-instruction, a reset
    engine.capsules.reset(seed=7)
    run(engine, 80, 3)
    engine.capsules.restore("mid")
    resumed = run(engine, 7, 10)
    assert torch.equal(torch.cat([first, resumed]), uninterrupted)


@pytest.mark.parametrize("groups", [{"prefix"}, {"prefix", "observation", "instruction"}])
def test_restoring_part_of_the_state_diverges(checkpoint, groups, tmp_path):
    """The features alone, or even with the stored observation and the prompt, are not the episode: the queue
    and the noise counter are."""
    uninterrupted = run(make_engine(checkpoint, tmp_path, "ref"), 0, 17)
    engine = make_engine(checkpoint, tmp_path)
    run(engine, 0, 7)
    engine.capsules.snapshot("mid")
    set_instruction(engine, OTHERS[0])
    run(engine, 50, 9)
    engine.capsules.restore("mid", groups=groups)
    resumed = run(engine, 7, 10)
    assert (resumed - uninterrupted[7:]).abs().max() > 1e-3


def test_reinstruct_by_fork_equals_a_cold_replan_with_that_instruction(checkpoint, tmp_path):
    """A capsule after one replan holds the encoded images; each fork re-instructs from them without SigLIP,
    and its chunk and whole continuation (through the next replans) are bit-identical to an episode that had
    that instruction from the start."""
    engine = make_engine(checkpoint, tmp_path)
    p, arena = engine.policy, engine.arena
    run(engine, 0, 2)                                                    # replan on observation 0, one pop
    engine.capsules.snapshot("scene")
    source = {name: arena[name].clone() for name in (p.PROMPT, p.PROMPT_LEN, p.QUEUE, p.LEFT, p.FEATURES_LEN)}
    features = arena.live_view(p.FEATURES).clone()
    for i in range(len(OTHERS)):
        engine.capsules.fork("scene", f"branch{i}")
    calls = count_calls(p)
    branches = {}
    for i, task in enumerate(OTHERS):
        engine.capsules.restore(f"branch{i}")
        before = dict(calls)
        reinstruct(engine, task)
        assert calls["vision"] == before["vision"], "a re-instruction must not run SigLIP"
        assert calls["language_model"] > before["language_model"] and calls["action_head"] > before["action_head"]
        assert int(arena[p.FEATURES_LEN]) == len(p.instruction_ids(task))
        assert not engine.next_step_replans()                             # the queue is full again
        branches[task] = run(engine, 0, 2 * N + 1)                        # pops, then replans on obs N, 2N
        engine.capsules.snapshot(f"branch{i}", overwrite=True)
    for task, forked in branches.items():
        cold = make_engine(checkpoint, tmp_path, f"cold_{len(task)}")
        set_instruction(cold, task)
        assert torch.equal(forked, run(cold, 0, 2 * N + 1)), task
    assert not torch.equal(branches[OTHERS[0]][:N], branches[OTHERS[1]][:N])
    engine.capsules.restore("scene")                                      # the source is untouched
    assert all(torch.equal(arena[name], value) for name, value in source.items())
    assert torch.equal(arena.live_view(p.FEATURES), features)


def test_rollback_undoes_a_reinstruction(checkpoint, tmp_path):
    """The queue, prompt and features are back, and the episode goes on as if it had not been re-instructed."""
    uninterrupted = run(make_engine(checkpoint, tmp_path, "ref"), 0, 3 + 2 * N)
    engine = make_engine(checkpoint, tmp_path)
    p, arena = engine.policy, engine.arena
    run(engine, 0, 3)
    kept = {name: arena[name].clone() for name in (p.QUEUE, p.LEFT, p.PROMPT, p.PROMPT_LEN, p.FEATURES_LEN)}
    features = arena.live_view(p.FEATURES).clone()
    reinstruct(engine, OTHERS[1])                                         # two boundaries
    assert not torch.equal(arena[p.QUEUE], kept[p.QUEUE]) and not torch.equal(arena[p.PROMPT], kept[p.PROMPT])
    engine.capsules.rollback(2)
    assert all(torch.equal(arena[name], value) for name, value in kept.items())
    assert torch.equal(arena.live_view(p.FEATURES), features) and not engine.next_step_replans()
    assert torch.equal(run(engine, 3, 2 * N), uninterrupted[3:])


def test_pops_and_redraws_run_only_what_they_need(checkpoint, tmp_path):
    """A replan runs SigLIP, the language model and the action head; a pop none of them; a redraw only the
    action head (the stored features are reused), and it is the chunk an episode with that seed plans first."""
    engine = make_engine(checkpoint, tmp_path)
    calls = count_calls(engine.policy)
    replans = []
    for i in range(11):
        replans.append(engine.next_step_replans())
        before = dict(calls)
        engine.step(observation(i, engine.policy))
        assert {k: calls[k] > before[k] for k in calls} == dict.fromkeys(calls, replans[-1]), i
    assert replans == [i % N == 0 for i in range(11)]
    seeded = make_engine(checkpoint, tmp_path, "seeded")
    seeded.capsules.reset(seed=4)
    set_instruction(seeded, TASK)
    run(seeded, 10, 1)                                                    # plan 0 of seed 4 on observation 10
    engine.capsules.reset(seed=9)                                         # a reset brings back the default
    set_instruction(engine, TASK)                                         # instruction
    run(engine, 10, 1)                                                    # plan 0 of seed 9, same observation
    drawn = engine.arena[engine.policy.QUEUE].clone()
    before = dict(calls)
    engine.redraw(4)
    assert calls["vision"] == before["vision"] and calls["language_model"] == before["language_model"]
    assert calls["action_head"] > before["action_head"]
    assert torch.equal(engine.arena[engine.policy.QUEUE], seeded.arena[seeded.policy.QUEUE])
    assert not torch.equal(engine.arena[engine.policy.QUEUE], drawn)


def test_a_plan_writes_exactly_the_buffers_its_action_queue_names(checkpoint, tmp_path):
    """What a plan beside the loop writes is all the merge carries over (``planned``, the queue; ``left`` the
    merge sets); no action follows the queued rows (``ahead`` 0: they are the chunk's last)."""
    engine = make_engine(checkpoint, tmp_path)
    policy, arena, queue = engine.policy, engine.arena, engine.policy.action_queue()
    run(engine, 0, 2)
    set_instruction(engine, "open")                 # another prompt length
    before = {name: arena[name].clone() for name in arena}
    with torch.no_grad():
        policy.plan(observation(3, policy), arena)
    changed = {name for name in arena if not torch.equal(arena[name], before[name])}
    assert changed == {queue.chunk, queue.left, *queue.planned}
    assert queue.ahead == 0 and queue.refill == N


def test_a_capsule_taken_with_a_plan_in_flight_continues_bit_identically(checkpoint, tmp_path):
    """Beside the loop the image tokens, features, queue and noise counter a plan writes ride in the capsule
    (``async.copy.*``): the snapshot waits for the plan in flight, and a restore merges the same chunk at the
    same step. 5 queued, delay 2, none ahead: a merged chunk keeps 3, so the next plan launches at once."""
    engine = make_engine(checkpoint, tmp_path, replan="async")
    run(engine, 0, 4)
    assert int(engine.arena[ACTIVE]) == 1, "a plan is in flight at the snapshot"
    engine.capsules.snapshot("in_flight")
    assert int(engine.arena[READY]) == 1, "the snapshot waited for the plan and holds its result"
    once = run(engine, 4, 12)
    engine.capsules.restore("in_flight")
    before = engine.replan_status()
    again = run(engine, 4, 12)
    after = engine.replan_status()
    assert torch.equal(once, again)
    # merged at steps 4 (the one in the capsule), 6, 8, ..., 14 at the chunk's action 2; launched after each
    assert after["merged"] - before["merged"] == 6 and after["launched"] - before["launched"] == 6
    engine.close()


def test_uint8_frames_are_the_float_frames_they_stand_for(checkpoint, tmp_path):
    """A camera's raw uint8 bytes through ``engine.step`` are the frame ``k / 255`` (not floats up to 255, which
    GR00T's preprocessing would clamp to white); an image of another integer type is refused by name, changing
    nothing."""
    from flashrt_ros.runtime.errors import InvalidArgument
    raw = make_engine(checkpoint, tmp_path, "raw")
    frames = {k: v for k, v in observation(0, raw.policy).items()}
    as_bytes = {k: (v * 255).to(torch.uint8) if v.dim() == 3 else v for k, v in frames.items()}
    as_floats = {k: v.to(torch.float32) / 255 if v.dtype == torch.uint8 else v for k, v in as_bytes.items()}
    assert torch.equal(raw.step(as_bytes), make_engine(checkpoint, tmp_path, "float").step(as_floats))
    engine = make_engine(checkpoint, tmp_path, "int16")
    boundary = engine.status()["boundary"]
    with pytest.raises(InvalidArgument, match="observation.images.cam0.*float in \\[0, 1\\] or uint8, not torch.int16"):
        engine.step({k: v.to(torch.int16) if v.dtype == torch.uint8 else v for k, v in as_bytes.items()})
    assert engine.status()["boundary"] == boundary
