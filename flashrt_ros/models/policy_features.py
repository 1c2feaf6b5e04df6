"""What a policy reads each step: named features with fixed shapes (the observation contract).

Why a declared contract: both sides of the policy build against it without
knowing each other. The engine keeps one static input buffer per feature
(captured graphs read fixed addresses) and refuses a malformed observation
before it reaches the policy, naming the offending feature; the robot I/O
layer (``flashrt_ros.robot_io``) turns cameras and joint states into exactly
these tensors without knowing the policy. Names follow LeRobot's
(``observation.state``, ``observation.images.<camera>``,
``observation.environment_state``) so a LeRobot checkpoint's features map 1:1.

Images arrive as float32 ``(3, H, W)`` in ``[0, 1]`` (LeRobot's convention);
the policy normalises them itself. State vectors are float32 ``(n,)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

STATE = "observation.state"
ENV_STATE = "observation.environment_state"
IMAGES_PREFIX = "observation.images."

FeatureKind = Literal["state", "image"]


@dataclass(frozen=True)
class FeatureSpec:
    """One input of a policy: its shape per step and whether it is a state vector or an image."""

    shape: tuple[int, ...]
    kind: FeatureKind = "state"

    def __post_init__(self) -> None:
        if self.kind not in ("state", "image"):
            raise ValueError(f"feature kind must be 'state' or 'image', not {self.kind!r}")
        if self.kind == "image" and (len(self.shape) != 3 or self.shape[0] != 3):
            raise ValueError(f"an image feature is (3, H, W), not {self.shape}")
        if self.kind == "state" and len(self.shape) != 1:
            raise ValueError(f"a state feature is (n,), not {self.shape}")
