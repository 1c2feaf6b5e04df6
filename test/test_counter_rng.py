"""The one counter-based RNG (LLM sampling and policy noise): exact integer arithmetic, purity, statistics."""
import random

import torch

from flashrt_ros.ops.counter_rng import MUL1 as _MUL1
from flashrt_ros.ops.counter_rng import MUL2 as _MUL2
from flashrt_ros.ops.counter_rng import hash32 as _hash32
from flashrt_ros.ops.counter_rng import normal as counter_normal
from flashrt_ros.ops.counter_rng import uniform_bits as counter_uniform_bits


def _py_hash32(x: int) -> int:
    """The same mix written with Python's unbounded ints (the reference)."""
    m = 0xFFFFFFFF
    x &= m
    x ^= x >> 16
    x = (x * _MUL1) & m
    x ^= x >> 15
    x = (x * _MUL2) & m
    return x ^ (x >> 15)


def test_products_stay_below_int64_overflow():
    assert max(_MUL1, _MUL2) < 1 << 31
    assert (1 << 32) * max(_MUL1, _MUL2) < 1 << 63


def test_hash32_matches_unbounded_integer_reference():
    rnd = random.Random(1)
    xs = [rnd.randrange(1 << 32) for _ in range(1000)] + [0, 1, (1 << 32) - 1]
    assert _hash32(torch.tensor(xs, dtype=torch.int64)).tolist() == [_py_hash32(x) for x in xs]


def test_distinct_indices_never_collide():
    bits = counter_uniform_bits(torch.tensor(9), torch.tensor(2), torch.arange(100_000))
    assert bits.unique().numel() == 100_000
    assert int(bits.min()) >= 0 and int(bits.max()) < 1 << 32


def test_noise_is_a_pure_function_of_seed_and_counter():
    s, c = torch.tensor(7), torch.tensor(41)
    assert torch.equal(counter_normal(s, c, 16), counter_normal(s.clone(), c.clone(), 16))
    assert not torch.equal(counter_normal(s, c, 16), counter_normal(s, c + 1, 16))
    assert not torch.equal(counter_normal(s, c, 16), counter_normal(s + 1, c, 16))


def test_every_word_of_seed_and_counter_matters():
    idx = torch.arange(8)
    base = counter_uniform_bits(torch.tensor(3), torch.tensor(5), idx)
    variants = [(3 + (1 << 40), 5), (3, 5 + (1 << 40)), (5, 3), (3 << 32 | 5, 0), (-3, 5)]
    for seed, counter in variants:
        assert not torch.equal(base, counter_uniform_bits(torch.tensor(seed), torch.tensor(counter), idx))


def test_noise_is_standard_normal():
    z = torch.cat([counter_normal(torch.tensor(11), torch.tensor(c), 1000) for c in range(100)])
    assert abs(z.mean().item()) < 0.02
    assert abs(z.std().item() - 1.0) < 0.02
    # tails: P(|z| > 1.96) = 0.05
    assert abs((z.abs() > 1.96).float().mean().item() - 0.05) < 0.005
    assert torch.isfinite(z).all()


def test_llm_sampling_and_policy_noise_draw_from_the_same_generator():
    from flashrt_ros.engine import sampling
    from flashrt_ros.models import reference_policies
    from flashrt_ros.ops import counter_rng
    assert sampling.uniform is counter_rng.uniform
    assert reference_policies.counter_normal is counter_rng.normal
