"""The policy engine as the ROS layer sees it: declared features in, one action out.

Why an adapter: the ROS layer needs four things of the node's ``PolicyEngine``:
which features to feed (``engine.features``, the policy's ``input_features()``),
the action size, ``step(observation mapping)`` (validated by the engine) and,
for trajectory output, the actions the policy already planned.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from flashrt_ros.models.policy_features import FeatureSpec


class PolicyStepper:
    """``step(Mapping[str, Tensor]) -> Tensor`` over the node's policy engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.policy = engine.policy
        self.features: dict[str, FeatureSpec] = dict(engine.features)
        self.action_dim = int(self.policy.action_dim)

    def step(self, observation: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One committed engine step on the named features; the action as float32 ``(action_dim,)``."""
        return self.engine.step(observation)

    def planned_actions(self) -> torch.Tensor:
        """Actions after the one just taken that the policy has already planned (``(k, action_dim)``,
        k may be 0). Read between steps, under the engine's boundary gate."""
        plan = getattr(self.policy, "planned_actions", None)
        if plan is None:
            return torch.zeros(0, self.action_dim)
        return self.engine.gate.run_at_boundary(lambda: plan(self.engine.arena).detach().cpu().clone(),
                                                timeout=self.engine.capsules.timeout_s)
