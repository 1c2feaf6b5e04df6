"""GR00T N1.5 as an arena-backed policy: a LeRobot checkpoint loaded by our loader, an episode stepped through
the arena with replans decided by the queue, equal at every step to LeRobot's episode with our noise stream."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_groot import arena_episode, counter_noise_reference
from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.runtime.errors import InvalidArgument


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return counter_noise_reference(tmp_path_factory.mktemp("groot_policy"))


def _policy(directory: Path, instruction: str) -> GrootPolicy:
    policy = load_lerobot_policy(directory)                   # the factory: type "groot", weights strict
    assert isinstance(policy, GrootPolicy)
    policy.set_default_instruction(instruction)
    return policy


def test_an_episode_through_the_arena_is_lerobots(reference):
    case, inputs, rec = reference
    actions, replans, arena = arena_episode(_policy(Path(case.directory), case.task), case, inputs)
    for step, action in enumerate(actions):
        assert torch.equal(action, rec["actions"][step]), step
    assert replans == rec["plan_steps"].tolist()
    assert int(arena[GrootPolicy.PLANS]) == 3


@pytest.mark.parametrize("dtype,numerics,cause", [(torch.float16, "exact", "float32 or bfloat16"),
                                                  (torch.float16, "fast", "float32 or bfloat16"),
                                                  (torch.float32, "fp8", "no float8 weights")])
def test_what_is_not_built_is_refused_by_name(reference, dtype, numerics, cause):
    case, _inputs, _rec = reference
    with pytest.raises(InvalidArgument, match=cause):
        load_lerobot_policy(case.directory, dtype=dtype, numerics=numerics)
