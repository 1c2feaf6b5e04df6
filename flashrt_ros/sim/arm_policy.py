"""The policy the MuJoCo arm demo runs: the chunked reference transformer sized for the arm.

Observes ``observation.state`` = shoulder and elbow positions then velocities
(4 values, from the sim's JointState) and commands two joint position targets.
Weights are random from a fixed seed (no trained checkpoint is available
offline): the demo is about exact interrupt-and-resume, not about reaching well.
Loaded by the node as ``policy:=flashrt_ros.sim.arm_policy:arm_policy``.
"""
from __future__ import annotations

from flashrt_ros.models.policies import ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig


def arm_policy() -> ChunkedTransformerPolicy:
    return ChunkedTransformerPolicy(ChunkedTransformerPolicyConfig(obs_dim=4, act_dim=2))
