"""GR00T N1.5 as an arena-backed policy: a LeRobot checkpoint loaded by our loader, an episode stepped through
the arena with replans decided by the queue, equal at every step to LeRobot's episode with our noise stream."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flashrt_ros.models.lerobot.factory import load_lerobot_policy
from flashrt_ros.models.lerobot.groot.modeling_groot import GrootPolicy
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import InvalidArgument


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from groot_reference import Case, reference_inputs, reference_record, run_reference
    root = tmp_path_factory.mktemp("groot_policy")
    h, m, plans = 16, 8, 3                                   # TINY: horizon 16, max_action_dim 8; 17 steps / 8
    noise = torch.stack([normal(torch.tensor(0), torch.tensor(p), h * m).view(1, h, m) for p in range(plans)])
    save_file({"noise": noise}, str(root / "noise.safetensors"))
    case = Case(directory=str(root / "a"), attn="sdpa", n_action_steps=8, steps=17,
                noise_file=str(root / "noise.safetensors"))
    run_reference([case], root / "spec")
    return case, reference_inputs(case), reference_record(case)


def _policy(directory: Path, instruction: str) -> GrootPolicy:
    policy = load_lerobot_policy(directory)                   # the factory: type "groot", weights strict
    assert isinstance(policy, GrootPolicy)
    policy.set_default_instruction(instruction)
    return policy


def test_an_episode_through_the_arena_is_lerobots(reference):
    case, inputs, rec = reference
    policy = _policy(Path(case.directory), case.task)
    arena = StateArena(policy.state_specs())
    policy.init_state(arena)
    replans = []
    for step in range(case.steps):
        observation = {STATE: inputs["observation.state"][step]}
        observation.update({f"observation.images.cam{i}": inputs[f"observation.images.cam{i}"][step]
                            for i in range(case.cameras)})
        replan = int(arena[policy.LEFT]) == 0
        replans += [step] if replan else []
        with torch.no_grad():
            action = policy.step_observation(observation, arena, replan)
        assert torch.equal(action, rec["actions"][step]), step
    assert replans == rec["plan_steps"].tolist()
    assert int(arena[policy.PLANS]) == 3


@pytest.mark.parametrize("dtype,numerics,cause", [(torch.float16, "exact", "float32 or bfloat16"),
                                                  (torch.float16, "fast", "float32 or bfloat16"),
                                                  (torch.float32, "fp8", "no float8 weights")])
def test_what_is_not_built_is_refused_by_name(reference, dtype, numerics, cause):
    case, _inputs, _rec = reference
    with pytest.raises(InvalidArgument, match=cause):
        load_lerobot_policy(case.directory, dtype=dtype, numerics=numerics)
