"""The policy engine as the ROS layer sees it: declared features in, one action out.

Why an adapter: the node holds whatever the engine factory built (today an
``EngineHost`` wrapping a ``PolicyEngine``). The ROS layer needs four things
of it: which features to feed, the action size, ``step(observation mapping)``
and, for trajectory output, the actions the policy already planned. Policies
that predate ``input_features()`` observe one state vector of ``obs_dim``.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from flashrt_ros.models.policy_features import STATE, FeatureSpec


def input_features(policy: Any) -> dict[str, FeatureSpec]:
    """The policy's declared features, or ``{observation.state: (obs_dim,)}`` for older ones."""
    declared = getattr(policy, "input_features", None)
    if callable(declared):
        return dict(declared())
    return {STATE: FeatureSpec((int(policy.obs_dim),), "state")}


class PolicyStepper:
    """``step(Mapping[str, Tensor]) -> Tensor`` over the node's policy engine."""

    def __init__(self, engine_like: Any) -> None:
        self.engine = getattr(engine_like, "engine", engine_like)
        self.policy = self.engine.policy
        self.features = input_features(self.policy)
        self.action_dim = int(getattr(self.policy, "action_dim", getattr(self.policy, "act_dim", 0)))
        self._takes_mapping = callable(getattr(self.policy, "input_features", None))

    def step(self, observation: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One committed engine step on the named features; the action as float32 ``(action_dim,)``."""
        if self._takes_mapping:
            return self.engine.step(observation)
        return self.engine.step(observation[STATE])

    def planned_actions(self) -> torch.Tensor:
        """Actions after the one just taken that the policy has already planned (``(k, action_dim)``,
        k may be 0). Read between steps, under the engine's boundary gate."""
        plan = getattr(self.policy, "planned_actions", None)
        if plan is None:
            return torch.zeros(0, self.action_dim)
        return self.engine.gate.run_at_boundary(lambda: plan(self.engine.arena).detach().cpu().clone(),
                                                timeout=1.0)
