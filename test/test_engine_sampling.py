"""The counter-based sampler: deterministic in (seed, counter), faithful to the filtered softmax."""
import pytest
import torch

from flashrt_ros.engine.sampling import SamplingParams, greedy_token, sample_token
from flashrt_ros.ops.counter_rng import hash32, uniform as uniform_from_counter
from flashrt_ros.runtime.errors import InvalidArgument


def _draw(logits, temperature=1.0, top_k=0, top_p=1.0, seed=7, counter=0):
    t = lambda v, dt: torch.tensor(v, dtype=dt)  # noqa: E731
    return int(sample_token(logits, t(temperature, torch.float32), t(top_k, torch.int64),
                            t(top_p, torch.float32), t(seed, torch.int64), t(counter, torch.int64)))


def test_uniforms_are_open_interval_and_depend_on_seed_and_counter():
    idx = torch.arange(50_000)
    u = uniform_from_counter(torch.tensor(1), torch.tensor(0), idx)
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    same = uniform_from_counter(torch.tensor(1), torch.tensor(0), idx)
    assert torch.equal(u, same)
    assert not torch.equal(u, uniform_from_counter(torch.tensor(1), torch.tensor(1), idx))
    assert not torch.equal(u, uniform_from_counter(torch.tensor(2), torch.tensor(0), idx))
    big_seed = uniform_from_counter(torch.tensor(2**40 + 1), torch.tensor(0), idx)
    assert not torch.equal(u, big_seed)


def test_temperature_zero_is_argmax():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert _draw(logits, temperature=0.0) == int(logits.argmax()) == int(greedy_token(logits))


def test_top_k_one_is_argmax_at_any_temperature():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(1))
    assert {_draw(logits, temperature=5.0, top_k=1, counter=c) for c in range(50)} == {int(logits.argmax())}


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    drawn = {_draw(logits, top_p=0.7, counter=c) for c in range(300)}
    assert drawn == {0, 1}          # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: token 2 and 3 excluded


def test_sample_frequencies_follow_the_softmax():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 2000
    counts = torch.bincount(torch.tensor([_draw(probs.log(), counter=c) for c in range(n)]), minlength=4)
    freq = counts.float() / n
    assert torch.allclose(freq, probs, atol=0.04), freq


@pytest.mark.parametrize("bad", [
    dict(temperature=-1.0), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=1.5), dict(top_p=float("nan")), dict(top_k=-1),
    dict(seed=2 ** 64), dict(seed=-(2 ** 63) - 1)])
def test_sampling_params_refuse_every_bad_field_with_invalid_argument(bad):
    assert SamplingParams().greedy
    with pytest.raises(InvalidArgument):
        SamplingParams(**bad)


def test_every_uint64_seed_maps_onto_the_int64_arena_scalar():
    assert SamplingParams(seed=2 ** 64 - 1).seed_int64 == -1
    assert SamplingParams(seed=2 ** 63).seed_int64 == -(2 ** 63)
    assert SamplingParams(seed=5).seed_int64 == 5
