"""GR00T N1.5 in the ``fast`` numerics on the CPU (tiny LeRobot checkpoint): ``exact``'s function with fixed shapes.

``fast`` runs the language model over the prompt buffer's whole capacity (right-padded) and the action head over
all of the features' rows with the padding masked out of the attention keys, so no shape depends on the prompt
and no body reads the device on the host: the step toward captured CUDA-graph plans. It must give ``exact``'s
actions within float32 rounding (``exact`` is LeRobot's bits, ``test_groot_policy.py``), keep every capsule
property, and the mask must be what makes it so: without it the padding moves the actions past the bound.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from host_reads import no_host_reads
from tiny_groot import N, observation, rel, run, tiny_checkpoint
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import reinstruct, set_instruction
from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import FingerprintMismatch, InvalidArgument

#: 210 of the 228 prompt rows (near the capacity), then 119 (109 rows of padding)
LONG = "pick up the red cube on the left of the table and put it gently into the blue box by the window"
SHORT = "open"
TASK, OTHER = "pick up the red cube", "put the cube in the box"
#: fast vs exact, max |difference| over the largest |action| of the episode. Chosen before measuring, on the
#: basis π0's fast numerics use (test_pi0_fast.py): fast changes only the rounding (products over 228 rows instead
#: of the prompt's, SDPA with a key mask whose masked terms are exact zeros), a few float32 ulps (1.2e-7) per
#: operation through 2 LLM layers, 2 VL self-attention blocks, 4 DiT blocks and 4 Euler steps; 1e-5 leaves two
#: orders of magnitude for that. Measured (2 cores, torch CPU): 0, fast gives exact's bits here (each product row
#: and each masked softmax term happen to round alike); the bound, not that, is the contract. An unmasked
#: padding measured 6.8e-4, 68 times the bound (test_the_bound_catches_padding_that_is_not_masked).
BOUND = 1e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("groot_fast"))


def make_engine(checkpoint: Path, tmp_path, numerics: str = "fast", name: str = "e",
                instruction: str = TASK) -> PolicyEngine:
    policy = load_lerobot_policy(checkpoint, numerics=numerics)        # the factory passes numerics through
    assert isinstance(policy, GrootPolicy) and policy.numerics == numerics
    engine = PolicyEngine(policy, directory=str(tmp_path / name), rollback_depth=4)
    set_instruction(engine, instruction)
    return engine


def episode(engine: PolicyEngine) -> torch.Tensor:
    """17 steps: the long instruction for 8 (plans at 0, 5), then the short one for 9 (plans at 8, 13)."""
    set_instruction(engine, LONG)
    first = run(engine, 0, 8)
    set_instruction(engine, SHORT)
    return torch.cat([first, run(engine, 8, 9)])


def test_a_fast_episode_equals_exact_within_the_bound(checkpoint, tmp_path):
    """Four replans over a long prompt and a short one (109 padded rows): the actions, the stored features
    (valid rows; zero past the prompt, as exact's) and their length."""
    exact, fast = make_engine(checkpoint, tmp_path, "exact", "x"), make_engine(checkpoint, tmp_path, "fast", "f")
    reference, actions = episode(exact), episode(fast)
    error = rel(actions, reference)
    print(f"fast vs exact: actions {error:.3g} of the largest action")
    assert error <= BOUND
    p = exact.policy
    length = int(exact.arena[p.FEATURES_LEN])
    assert length == len(p.instruction_ids(SHORT)) and torch.equal(fast.arena[p.FEATURES_LEN],
                                                                  exact.arena[p.FEATURES_LEN])
    assert rel(fast.arena[p.FEATURES], exact.arena[p.FEATURES]) <= BOUND
    assert (fast.arena[p.FEATURES][length:] == 0).all()
    assert torch.equal(fast.arena[p.IMAGES], exact.arena[p.IMAGES]), "SigLIP runs the same ops in both"
    assert int(fast.arena[p.PLANS]) == 4


def test_the_bound_catches_padding_that_is_not_masked(checkpoint, tmp_path, monkeypatch):
    """The mutation the key mask guards against: every row taken as valid (the action head attends to the
    padding; its rows are the zeroed features, so through vlln only LayerNorm's bias: a small push). The same
    episode then leaves the bound (by 68 times, measured), so the bound is what shows the mask works."""
    reference = episode(make_engine(checkpoint, tmp_path, "exact", "x"))
    monkeypatch.setattr(GrootPolicy, "key_mask",
                        lambda self, arena: torch.ones(1, 1, 1, self.prompt_capacity, dtype=torch.bool))
    error = rel(episode(make_engine(checkpoint, tmp_path, "fast", "f")), reference)
    print(f"fast without the key mask vs exact: {error:.3g}")
    assert error > 10 * BOUND


def test_fast_bodies_read_nothing_on_the_host(checkpoint, tmp_path, monkeypatch):
    """A replanning step, a pop, a plan, a redraw and a replan from context, every host read an error; then the
    same bodies outside the guard give the same queue (the guard changed nothing)."""
    engine = make_engine(checkpoint, tmp_path, instruction=SHORT)
    p, arena = engine.policy, engine.arena
    start = arena.block.clone()
    obs = observation(0, p)

    def bodies() -> torch.Tensor:
        p.step_observation(obs, arena, replan=True)
        p.step_observation(obs, arena, replan=False)
        p.plan(observation(1, p), arena)
        p.redraw_chunk(arena)
        p.replan_from_context(arena)
        return arena[p.QUEUE].clone()
    with no_host_reads(monkeypatch):
        guarded = bodies()
    assert int(arena[p.LEFT]) == N and int(arena[p.FEATURES_LEN]) == len(p.instruction_ids(SHORT))
    arena.block.copy_(start)
    with torch.no_grad():
        assert torch.equal(bodies(), guarded)


def test_fast_makes_its_time_tables_once(checkpoint, tmp_path, monkeypatch):
    """Three plans, a redraw and a replan from context: the flow's time tables are made on the first and kept."""
    engine = make_engine(checkpoint, tmp_path)
    head = engine.policy._groot_model.action_head
    calls = []
    made = head.time_tables
    monkeypatch.setattr(head, "time_tables", lambda batch=1: calls.append(batch) or made(batch))
    run(engine, 0, 2 * N + 1)
    engine.redraw(3)
    reinstruct(engine, OTHER)
    assert calls == [1]


def test_fast_bodies_keep_to_the_policys_device(checkpoint):
    """The bodies on the meta device (shapes, no data): any tensor they make on the CPU, or copy from it (a
    host-to-device copy a captured graph cannot hold), meets a meta tensor and raises. The CPU stand-in for a
    CUDA run: the processor's rescale constants were such a tensor."""
    p = load_lerobot_policy(checkpoint, numerics="fast").to("meta")
    arena = StateArena(p.state_specs(), device="meta")
    obs = {STATE: torch.zeros(p.cfg.state_dim, device="meta")}
    obs.update({cam: torch.zeros(p.cfg.image_shape, device="meta") for cam in p.cfg.cameras})
    with torch.no_grad():
        p.step_observation(obs, arena, replan=True)
        p.redraw_chunk(arena)
        p.replan_from_context(arena)
    assert arena[p.QUEUE].device.type == "meta"


def test_a_redraw_before_any_replan_draws_from_one_zero_row(checkpoint, tmp_path):
    """No valid feature row yet (features_len 0, as on a graph's warm-up on the cold state): the key mask keeps
    row 0, so the chunk is a defined, finite function, exact's over the one zero row, whatever an SDPA backend
    makes of a query with no key (CPU torch 2.13 gives zeros, other backends may give NaN)."""
    fast, exact = make_engine(checkpoint, tmp_path), make_engine(checkpoint, tmp_path, "exact", "x")
    p = fast.policy
    assert int(fast.arena[p.FEATURES_LEN]) == 0
    exact.arena[p.FEATURES_LEN].fill_(1)                              # exact over features[:1], all zero
    with torch.no_grad():
        p.redraw_chunk(fast.arena)
        exact.policy.redraw_chunk(exact.arena)
    assert torch.isfinite(fast.arena[p.QUEUE]).all()
    assert rel(fast.arena[p.QUEUE], exact.arena[p.QUEUE]) <= BOUND


def test_feature_rows_past_the_live_extent_change_no_bit(checkpoint, tmp_path):
    """A capsule copies only the features' live rows (``features_len``), so a restore may leave other bytes past
    them. fast computes over those rows but the key mask gives them weight exactly 0: a redraw over large finite
    garbage there is a redraw over the zeros, to the bit."""
    engine = make_engine(checkpoint, tmp_path, instruction=SHORT)
    p, arena = engine.policy, engine.arena
    run(engine, 0, 1)
    length, saved = int(arena[p.FEATURES_LEN]), arena.block.clone()
    with torch.no_grad():
        p.redraw_chunk(arena)
        clean = arena[p.QUEUE].clone()
        arena.block.copy_(saved)
        arena[p.FEATURES][length:] = 1e4 * torch.randn(p.prompt_capacity - length, p.backbone_width)
        p.redraw_chunk(arena)
    assert torch.equal(arena[p.QUEUE], clean)


def test_fast_snapshot_mid_chunk_other_work_restore_is_bit_identical(checkpoint, tmp_path):
    """Padding and masks are deterministic: the capsule restores the fast episode to the bit."""
    uninterrupted = run(make_engine(checkpoint, tmp_path, name="ref"), 0, 17)
    engine = make_engine(checkpoint, tmp_path)
    first = run(engine, 0, 7)                                                   # mid-chunk: 3 actions left
    engine.capsules.snapshot("mid")
    set_instruction(engine, LONG)                                               # other work: a longer prompt,
    run(engine, 50, 9)                                                          # two plans, a re-instruction,
    reinstruct(engine, SHORT)                                                   # a reset
    engine.capsules.reset(seed=7)
    run(engine, 80, 3)
    engine.capsules.restore("mid")
    assert torch.equal(torch.cat([first, run(engine, 7, 10)]), uninterrupted)


def test_fast_reinstruct_by_fork_equals_a_cold_replan(checkpoint, tmp_path):
    engine = make_engine(checkpoint, tmp_path)
    run(engine, 0, 2)
    engine.capsules.snapshot("scene")
    engine.capsules.fork("scene", "branch")
    engine.capsules.restore("branch")
    reinstruct(engine, OTHER)
    forked = run(engine, 0, 2 * N + 1)
    cold = make_engine(checkpoint, tmp_path, name="cold", instruction=OTHER)
    assert torch.equal(forked, run(cold, 0, 2 * N + 1))


def test_a_fast_plan_writes_exactly_the_buffers_its_action_queue_names(checkpoint, tmp_path):
    engine = make_engine(checkpoint, tmp_path)
    p, arena, queue = engine.policy, engine.arena, engine.policy.action_queue()
    run(engine, 0, 2)
    set_instruction(engine, SHORT)                  # another prompt length
    before = {name: arena[name].clone() for name in arena}
    with torch.no_grad():
        p.plan(observation(3, p), arena)
    assert {name for name in arena if not torch.equal(arena[name], before[name])} == \
        {queue.chunk, queue.left, *queue.planned}


def test_a_capsule_of_one_numerics_is_refused_by_the_other(checkpoint, tmp_path):
    """The numerics are in the fingerprint (``config``): an exact engine's capsule file is not loaded by a fast
    one over the same weights; and the numerics are chosen once."""
    exact = make_engine(checkpoint, tmp_path, "exact", "shared")
    run(exact, 0, 3)
    exact.capsules.snapshot("home")
    exact.capsules.save("home")
    fast = make_engine(checkpoint, tmp_path, "fast", "shared")
    assert exact.fingerprint != fast.fingerprint
    with pytest.raises(FingerprintMismatch):
        fast.capsules.load("home")
    with pytest.raises(InvalidArgument, match="chosen once"):
        fast.policy.use_numerics("exact")


def test_exact_refuses_cuda_and_names_fast(checkpoint):
    """The check comes before any work: an arena whose queue says CUDA shows it without a GPU."""
    policy = load_lerobot_policy(checkpoint)
    on_cuda = {policy.QUEUE: SimpleNamespace(device=torch.device("cuda"))}
    with pytest.raises(InvalidArgument, match="use numerics fast on CUDA"):
        policy.plan(observation(0, policy), on_cuda)
