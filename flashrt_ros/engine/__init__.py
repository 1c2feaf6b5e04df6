"""Engines that host a model over a StateArena: the LLM engine (and the policy engine).

Names are resolved lazily so that importing one engine does not import the other.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMEngine": "flashrt_ros.engine.llm_engine",
    "GenerationResult": "flashrt_ros.engine.config",
    "StoreConfig": "flashrt_ros.engine.config",
    "SamplingParams": "flashrt_ros.engine.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flashrt_ros.engine' has no attribute {name!r}")
