"""GR00T N1.5 in bf16 as LeRobot runs it (``use_bf16``, its default): float32 weights, every plan under bf16
autocast, the camera pixels and the normalised state rounded to bf16 first. Our episode through the arena must be
LeRobot's bf16 episode bit for bit on the CPU (the same ops under the same autocast rules), ``fast`` must stay
within a declared bound of ``exact``, and the precision is part of the capsule fingerprint.

The parity has teeth: our float32 episode differs from LeRobot's bf16 one, and the one place that needed a change
(transformers computes the RoPE angles with autocast off; without that ours computed them in bf16) moved the
backbone's features by 2.2e-2 of 3.9 and every chunk after them.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_groot import arena_episode, counter_noise_reference, rel, run, tiny_checkpoint
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction
from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.runtime.errors import FingerprintMismatch, InvalidArgument

#: fast vs exact in bf16, max |difference| over the largest |action|, declared before measuring: fast changes
#: only how products and attention are shaped (the prompt buffer's 228 rows, a key mask), so each bf16 product
#: may round differently in its last bit (2^-8 relative) and that carries through 2 LLM layers, 2 VL
#: self-attention and 4 DiT blocks and 4 Euler steps; π0's and SmolVLA's bf16 fast tests allow 5e-2 for that.
BOUND = 5e-2


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """LeRobot's tiny GR00T with ``use_bf16`` (bf16 autocast), stepped over an episode with our noise stream."""
    return counter_noise_reference(tmp_path_factory.mktemp("groot_bf16"), use_bf16=True)


def _episode(case, inputs, dtype: torch.dtype) -> list[torch.Tensor]:
    policy = load_lerobot_policy(case.directory, dtype=dtype)
    assert isinstance(policy, GrootPolicy) and policy.compute_dtype == dtype
    policy.set_default_instruction(case.task)
    return arena_episode(policy, case, inputs)[0]


def test_a_bf16_episode_is_lerobots_bf16_episode_bit_for_bit(reference):
    case, inputs, rec = reference
    for step, action in enumerate(_episode(case, inputs, torch.bfloat16)):
        assert torch.equal(action, rec["actions"][step]), (step, (action - rec["actions"][step]).abs().max())
    float32 = torch.stack(_episode(case, inputs, torch.float32))
    assert not torch.equal(float32, rec["actions"]), "the bf16 reference must differ from float32 arithmetic"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("groot_bf16_fast"))


def make_engine(checkpoint: Path, tmp_path, numerics: str, dtype: torch.dtype, name: str) -> PolicyEngine:
    engine = PolicyEngine(load_lerobot_policy(checkpoint, dtype=dtype, numerics=numerics),
                          directory=str(tmp_path / name), rollback_depth=4)
    set_instruction(engine, "pick up the red cube")
    return engine


def test_fast_bf16_equals_exact_bf16_within_the_bound(checkpoint, tmp_path):
    exact = make_engine(checkpoint, tmp_path, "exact", torch.bfloat16, "x")
    fast = make_engine(checkpoint, tmp_path, "fast", torch.bfloat16, "f")
    reference, actions = run(exact, 0, 12), run(fast, 0, 12)
    error = rel(actions, reference)
    print(f"fast vs exact, bf16: {error:.3g} of the largest action")
    assert error <= BOUND
    float32 = run(make_engine(checkpoint, tmp_path, "exact", torch.float32, "x32"), 0, 12)
    assert not torch.equal(reference, float32)


def test_a_capsule_of_one_precision_is_refused_by_the_other(checkpoint, tmp_path):
    bf16 = make_engine(checkpoint, tmp_path, "fast", torch.bfloat16, "shared")
    run(bf16, 0, 3)
    bf16.capsules.snapshot("home")
    bf16.capsules.save("home")
    float32 = make_engine(checkpoint, tmp_path, "fast", torch.float32, "shared")
    assert bf16.fingerprint != float32.fingerprint
    with pytest.raises(FingerprintMismatch):
        float32.capsules.load("home")


def test_float16_is_refused_by_name(checkpoint):
    with pytest.raises(InvalidArgument, match="float32 or bfloat16"):
        load_lerobot_policy(checkpoint, dtype=torch.float16)


def test_dtype_auto_follows_the_checkpoints_use_bf16_on_cuda(reference, checkpoint):
    """LeRobot runs a GR00T checkpoint in bf16 when its config says ``use_bf16`` (its default); the CPU keeps the
    float32 default of every policy."""
    from flashrt_ros.models.lerobot import default_dtype
    case, _inputs, _rec = reference
    assert default_dtype(case.directory, torch.device("cuda")) == torch.bfloat16       # use_bf16: true
    assert default_dtype(checkpoint, torch.device("cuda")) == torch.float32            # use_bf16: false
    assert default_dtype(case.directory, torch.device("cpu")) == torch.float32
