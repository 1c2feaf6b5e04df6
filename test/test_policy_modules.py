"""The policy contract: state only in arena buffers, in place, chunking and ensembling as documented."""
import math

import pytest
import torch

from flashrt_ros.models.policy_factory import make_policy
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.models.reference_policies import (ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig,
                                                  GRUPolicy, GRUPolicyConfig)
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import InvalidArgument


def _policies() -> list[PolicyModule]:
    return [GRUPolicy(), ChunkedTransformerPolicy()]


def _arena(policy: PolicyModule) -> StateArena:
    arena = StateArena(policy.state_specs())
    policy.init_state(arena)
    return arena


def _obs(i: int, dim: int = 6) -> torch.Tensor:
    return torch.sin(torch.arange(dim, dtype=torch.float32) + 0.37 * i)


@pytest.mark.parametrize("policy", _policies(), ids=lambda p: type(p).__name__)
def test_state_buffers_are_prefixed_and_step_writes_them_in_place(policy):
    arena = _arena(policy)
    assert all(s.name.startswith("policy.") for s in policy.state_specs())
    ptrs = {n: arena[n].data_ptr() for n in arena}
    before = arena.block.clone()
    with torch.no_grad():
        action = policy.step(_obs(0), arena)
    assert action.shape == (policy.act_dim,)
    assert {n: arena[n].data_ptr() for n in arena} == ptrs
    assert not torch.equal(arena.block, before), "step must advance the arena state"


@pytest.mark.parametrize("policy", _policies(), ids=lambda p: type(p).__name__)
def test_step_depends_only_on_obs_and_arena_bytes(policy):
    arena = _arena(policy)
    with torch.no_grad():
        for i in range(5):
            policy.step(_obs(i), arena)
        saved = arena.block.clone()
        first = [policy.step(_obs(10 + i), arena) for i in range(6)]
        after_first = arena.block.clone()
        arena.block.copy_(saved)
        second = [policy.step(_obs(10 + i), arena) for i in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert torch.equal(arena.block, after_first)


@pytest.mark.parametrize("policy", _policies(), ids=lambda p: type(p).__name__)
def test_state_carries_memory_of_past_observations(policy):
    a, b = _arena(policy), _arena(policy)
    with torch.no_grad():
        for i in range(4):
            policy.step(_obs(i), a)
            policy.step(-_obs(i), b)
        assert not torch.equal(policy.step(_obs(9), a), policy.step(_obs(9), b))


def test_history_mask_ignores_unwritten_ring_rows():
    policy = ChunkedTransformerPolicy(ChunkedTransformerPolicyConfig(noise_std=0.0))
    clean, dirty = _arena(policy), _arena(policy)
    dirty[policy.RING].copy_(torch.randn_like(dirty[policy.RING]) * 100)  # garbage in rows never written
    with torch.no_grad():
        for i in range(3):
            assert torch.equal(policy.step(_obs(i), clean), policy.step(_obs(i), dirty))


def test_new_chunk_every_k_steps_and_ring_wraps():
    cfg = ChunkedTransformerPolicyConfig(history=4, chunk=6, replan_every=3)
    policy = ChunkedTransformerPolicy(cfg)
    arena = _arena(policy)
    with torch.no_grad():
        for n in range(1, 11):
            policy.step(_obs(n), arena)
            assert int(arena[policy.QUEUE_INDEX]) == math.ceil(n / cfg.replan_every)
            assert int(arena[policy.RING_INDEX]) == n
    # the ring holds the last `history` observations at slot (step mod history)
    for step in range(10 - cfg.history + 1, 11):
        assert torch.equal(arena[policy.RING][(step - 1) % cfg.history], _obs(step))


def test_action_is_exponential_temporal_ensemble_of_overlapping_chunks():
    cfg = ChunkedTransformerPolicyConfig(chunk=6, replan_every=2, ensemble_decay=0.3, noise_std=0.0,
                                         max_action=10.0)
    policy = ChunkedTransformerPolicy(cfg)
    arena = _arena(policy)
    chunks: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for t in range(12):
            action = policy.step(_obs(t), arena)
            if t % cfg.replan_every == 0:
                slot = (int(arena[policy.QUEUE_INDEX]) - 1) % cfg.chunk_slots
                chunks[t] = arena[policy.QUEUE][slot].clone()
            # explicit ACT ensemble: w_i = exp(-m i), i = 0 for the oldest chunk covering t
            starts = sorted(s for s in chunks if 0 <= t - s < cfg.chunk)
            w = torch.tensor([math.exp(-cfg.ensemble_decay * i) for i in range(len(starts))])
            preds = torch.stack([chunks[s][t - s] for s in starts])
            expected = (w[:, None] * preds).sum(0) / w.sum()
            torch.testing.assert_close(action, expected, rtol=1e-5, atol=1e-6)
            if t >= cfg.chunk:
                assert len(starts) == cfg.chunk_slots


def test_noise_stream_is_part_of_the_state():
    policy = ChunkedTransformerPolicy(ChunkedTransformerPolicyConfig(noise_std=0.5))
    arena = _arena(policy)
    assert int(arena[policy.RNG_SEED]) == policy.cfg.rng_seed
    with torch.no_grad():
        policy.step(_obs(0), arena)
        saved = arena.block.clone()
        a1 = policy.step(_obs(1), arena)
        arena.block.copy_(saved)
        arena[policy.RNG_COUNTER].add_(1)   # same network inputs, different noise draw
        a2 = policy.step(_obs(1), arena)
    assert not torch.equal(a1, a2)
    assert int(arena[policy.RNG_COUNTER]) == 3


def test_weights_depend_only_on_the_config_seed():
    a, b = ChunkedTransformerPolicy(), ChunkedTransformerPolicy()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(GRUPolicy().head.weight, GRUPolicy(GRUPolicyConfig(seed=1)).head.weight)


def test_make_policy_resolves_reference_names_and_factories():
    assert isinstance(make_policy("gru"), GRUPolicy)
    assert isinstance(make_policy("transformer"), ChunkedTransformerPolicy)
    assert isinstance(make_policy("flashrt_ros.models.reference_policies:GRUPolicy"), GRUPolicy)
    for bad in ("nope", "collections:OrderedDict", "no_such_module_xyz:f", "flashrt_ros.models.reference_policies:nope"):
        with pytest.raises(InvalidArgument):
            make_policy(bad)
