"""The policy observation contract: named features, static input buffers, refusals that name the feature."""
import pytest
import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.models.policy_features import STATE, FeatureSpec
from flashrt_ros.models.reference_policies import GRUPolicy
from flashrt_ros.runtime.arena import BufferSpec
from flashrt_ros.runtime.errors import InvalidArgument

CAMERA = "observation.images.wrist"


class CameraMean(PolicyModule):
    """Action = mean image colour + running sum of the state: reads two features, keeps one buffer."""

    SUM = "policy.sum"

    def __init__(self) -> None:
        super().__init__()
        self.obs_dim, self.act_dim = 3, 3

    def input_features(self):
        return {STATE: FeatureSpec((3,), "state"), CAMERA: FeatureSpec((3, 4, 6), "image")}

    def state_specs(self):
        return [BufferSpec(self.SUM, (3,), torch.float32, group="policy")]

    def step_observation(self, observation, arena):
        total = arena[self.SUM]
        total.add_(observation[STATE])
        return observation[CAMERA].mean(dim=(1, 2)) + total


def test_reference_policy_declares_its_state_and_accepts_a_bare_vector_or_a_dict():
    a, b = PolicyEngine(GRUPolicy()), PolicyEngine(GRUPolicy())
    assert a.features == {STATE: FeatureSpec((6,), "state")} and a.policy.action_dim == 2
    obs = torch.linspace(-1, 1, 6)
    for _ in range(3):
        assert torch.equal(a.step(obs), b.step({STATE: obs}))


def test_image_and_state_features_reach_the_policy():
    engine = PolicyEngine(CameraMean())
    image = torch.rand(3, 4, 6, generator=torch.Generator().manual_seed(0))
    state = torch.tensor([1.0, 2.0, 3.0])
    engine.step({STATE: state, CAMERA: image})
    action = engine.step({STATE: state, CAMERA: image})
    assert action.shape == (3,)
    torch.testing.assert_close(action, image.mean(dim=(1, 2)) + 2 * state)


@pytest.mark.parametrize("observation, named", [
    ({STATE: torch.zeros(3)}, CAMERA),                                            # missing camera
    ({STATE: torch.zeros(3), CAMERA: torch.zeros(3, 4, 6), "observation.x": torch.zeros(1)}, "observation.x"),
    ({STATE: torch.zeros(4), CAMERA: torch.zeros(3, 4, 6)}, STATE),               # wrong state length
    ({STATE: torch.zeros(3), CAMERA: torch.zeros(3, 6, 4)}, CAMERA),              # transposed image
    (torch.zeros(3), CAMERA),                                                     # bare vector, image missing
])
def test_malformed_observation_is_refused_naming_the_feature_and_changes_nothing(observation, named):
    engine = PolicyEngine(CameraMean())
    engine.step({STATE: torch.ones(3), CAMERA: torch.zeros(3, 4, 6)})
    before = engine.arena.block.clone()
    with pytest.raises(InvalidArgument, match=named.replace(".", r"\.")):
        engine.step(observation)
    assert torch.equal(engine.arena.block, before) and engine.position == 1


def test_feature_spec_rejects_shapes_that_break_the_convention():
    with pytest.raises(ValueError):
        FeatureSpec((4, 4, 3), "image")        # channels last
    with pytest.raises(ValueError):
        FeatureSpec((2, 3), "state")
    with pytest.raises(ValueError):
        FeatureSpec((3,), "depth")
