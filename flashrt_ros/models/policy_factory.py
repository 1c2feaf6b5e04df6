"""A policy from its name: the node parameter ``policy`` turned into a ``PolicyModule``.

Why a module of its own: the factory knows every policy family (the reference
policies, LeRobot checkpoints, any importable factory), while each family knows
only the contract in ``policy_interface``; so the policy code imports one way,
from here down, and never back.

Names (``make_policy``): ``'gru'`` and ``'transformer'`` (``get_policy_class``),
``'lerobot:<checkpoint dir>'`` (ACT, Diffusion Policy, SmolVLA), or
``'package.module:factory'`` (a callable returning a ``PolicyModule``).
"""
from __future__ import annotations

import importlib

import torch

from flashrt_ros.models.lerobot import load_lerobot_policy
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.models.reference_policies import ChunkedTransformerPolicy, GRUPolicy
from flashrt_ros.runtime.errors import InvalidArgument

REFERENCE_POLICIES: dict[str, type[PolicyModule]] = {"gru": GRUPolicy, "transformer": ChunkedTransformerPolicy}
LEROBOT_PREFIX = "lerobot:"


def get_policy_class(name: str) -> type[PolicyModule]:
    """The reference policy class registered under ``name`` (``'gru'``, ``'transformer'``)."""
    try:
        return REFERENCE_POLICIES[name]
    except KeyError:
        raise InvalidArgument(f"no reference policy {name!r}: use one of {sorted(REFERENCE_POLICIES)}") from None


def make_policy(spec: str, dtype: torch.dtype = torch.float32, numerics: str = "exact") -> PolicyModule:
    """``'gru'``, ``'transformer'``, ``'lerobot:<checkpoint dir>'`` (ACT, Diffusion Policy, SmolVLA), or
    ``'package.module:factory'`` (a callable returning a PolicyModule).

    ``dtype`` applies to LeRobot checkpoints (float32, bfloat16, float16); the others are float32.
    ``numerics`` (``exact`` / ``fast``) to the LeRobot policies that have both (SmolVLA, π0, π0.5).
    """
    if spec in REFERENCE_POLICIES:
        return get_policy_class(spec)()
    if spec.startswith(LEROBOT_PREFIX):
        return load_lerobot_policy(spec[len(LEROBOT_PREFIX):], dtype=dtype, numerics=numerics)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"policy {spec!r}: use one of {sorted(REFERENCE_POLICIES)}, "
                              "'lerobot:<checkpoint dir>' or 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"policy {spec!r}: cannot import: {exc}") from exc
    policy = factory()
    if not isinstance(policy, PolicyModule):
        raise InvalidArgument(f"policy {spec!r} returned {type(policy).__name__}, not a PolicyModule")
    return policy
