"""The policies the MuJoCo arm demo runs: the trained LeRobot checkpoints (default) and a random reference.

Trained (``examples/train_arm``: scripted-expert demonstrations, LeRobot 0.4.4's own
training, fp16 weights in LeRobot's checkpoint format): ``TRAINED["act"]`` and
``TRAINED["diffusion"]`` under ``flashrt_ros/sim/checkpoints/``. They observe
``observation.state`` = shoulder and elbow positions then velocities (the sim's
JointState) and ``observation.environment_state`` = the target's x, y (the sim's
``~/target``), and command two joint position targets. The node loads one with
``policy:=lerobot:<dir>`` (``trained_policy_spec()`` gives that string).

``arm_policy()`` is the chunked reference transformer with random weights from a
fixed seed (state only): it exercises capsules, it does not reach
(``policy:=flashrt_ros.sim.arm_policy:arm_policy``).
"""
from __future__ import annotations

from pathlib import Path

from flashrt_ros.models.reference_policies import ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig

CHECKPOINTS = Path(__file__).resolve().with_name("checkpoints")
TRAINED = {"act": CHECKPOINTS / "arm_act", "diffusion": CHECKPOINTS / "arm_diffusion"}


def trained_policy_spec(name: str = "act") -> str:
    """The node's ``policy`` parameter for a committed trained checkpoint (``act`` or ``diffusion``)."""
    if name not in TRAINED:
        raise ValueError(f"trained arm policies: {sorted(TRAINED)}, not {name!r}")
    return f"lerobot:{TRAINED[name]}"


def arm_policy() -> ChunkedTransformerPolicy:
    return ChunkedTransformerPolicy(ChunkedTransformerPolicyConfig(obs_dim=4, act_dim=2))
