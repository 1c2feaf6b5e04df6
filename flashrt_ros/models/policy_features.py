"""What a policy observes: one ``FeatureSpec`` per named input (the shared contract).

Why a declaration: the ROS layer turns cameras and joint states into exactly the
tensors a policy expects (``(3, H, W)`` float32 images in [0, 1], ``(n,)``
float32 state) without knowing the policy. Names follow LeRobot:
``observation.state``, ``observation.images.<camera>``,
``observation.environment_state``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

STATE = "observation.state"


@dataclass(frozen=True)
class FeatureSpec:
    shape: tuple[int, ...]
    kind: Literal["state", "image"]
