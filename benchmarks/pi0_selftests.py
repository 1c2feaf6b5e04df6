"""Deliberately broken π0 / π0.5 ``fast`` forms: the self-test sides a benchmark's check must fail.

Why: a check is proven only by a broken network it catches (``benchmarks.action_checks``). Each form patches one
layer object of a policy already in the ``fast`` numerics (its methods shadowed on the instance, so graphs
captured afterwards run the broken form) and returns the undo. Benchmark-only: the runtime knows nothing of it.
"""
from __future__ import annotations

from typing import Callable

import torch

FORMS = ("selftest-skip-layer", "selftest-zero-head", "selftest-zero-vlm-head")


def _shadow(layer, name: str, fn) -> Callable[[], None]:
    object.__setattr__(layer, name, fn)
    return lambda: object.__delattr__(layer, name)


def _zero_head_output(layer, head_dim: int) -> Callable[[], None]:
    """The attention output's head 0 zeroed before the output product (every call of this layer)."""
    product = type(layer).output.__get__(layer)

    def output(attn: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        attn = attn.clone()
        attn[:, :head_dim] = 0
        return product(attn, residual=residual)
    return _shadow(layer, "output", output)


def break_policy(policy, form: str) -> Callable[[], None]:
    """Apply ``form`` (one of ``FORMS``) to a ``fast`` policy; returns the undo."""
    if getattr(policy, "numerics", "exact") == "exact":
        raise ValueError("self-tests break the fast form: call use_numerics('fast') first")
    model, cfg = policy.model, policy.cfg
    expert = model.expert.layers[len(model.expert.layers) // 2]
    if form == "selftest-skip-layer":
        if cfg.pi05:        # adaRMS layers: both residual updates zero
            undo_out = _shadow(expert, "output", lambda attn, residual=None: torch.zeros_like(attn[:, :cfg.expert.width]))
            undo_mlp = _shadow(expert, "gate_up_down", lambda h: torch.zeros_like(h))
            return lambda: (undo_out(), undo_mlp())
        return _shadow(expert, "folded_rest", lambda x, attn: x)
    if form == "selftest-zero-head":
        return _zero_head_output(expert, cfg.expert.head_dim)
    if form == "selftest-zero-vlm-head":
        vlm = model.language_model.layers[len(model.language_model.layers) // 2]
        return _zero_head_output(vlm, cfg.vlm.head_dim)
    raise ValueError(f"unknown self-test {form!r}: one of {FORMS}")
