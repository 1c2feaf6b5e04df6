"""The contract between model code and the engines.

Why: the engine owns the arena, positions and capsules; a model only declares
which state buffers it needs and then reads/writes them in place during
``forward``. Keeping that line sharp is what lets one engine host a pure
attention model and a hybrid (recurrent + attention) model alike, and lets a
capsule be a plain copy of the declared bytes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from flashrt_ros.runtime.arena import BufferSpec, StateArena


class CausalLM(torch.nn.Module, ABC):
    """A decoder-only language model whose whole live state lives in a StateArena.

    Subclasses set ``vocab_size`` and implement :meth:`state_specs` and
    :meth:`forward`. Names of state buffers are prefixed ``layers.{i}.``; the
    engine adds its own ``meta.*`` buffers beside them.
    """

    vocab_size: int

    @abstractmethod
    def state_specs(self, max_context: int) -> list[BufferSpec]:
        """Every state buffer the model reads or writes for a context of ``max_context`` tokens.

        KV caches: ``[max_context, kv_heads, head_dim]``, group ``"kv"``,
        ``live_axis=0``, ``length_from=POSITION``, ``append_only=True``.
        Recurrent / conv state (hybrid models): groups ``"recurrent"`` / ``"conv"``.
        """

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                arena: StateArena) -> torch.Tensor:
        """Consume ``T`` new tokens at absolute ``positions`` and return float32 logits ``[T, vocab]``.

        Writes the new state into the arena in place. Must stay capturable:
        fixed shapes per ``T``, no host sync, no allocation of persistent state,
        attention over the static KV buffer with a ``key_pos <= query_pos`` mask.
        """

    def config_dict(self) -> dict[str, Any]:
        """Architecture hyper-parameters (JSON-serialisable) for fingerprints and status."""
        cfg = getattr(self, "config", None)
        if cfg is None:
            return {}
        if hasattr(cfg, "to_dict"):
            return dict(cfg.to_dict())
        return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype of the model's state buffers (that of its parameters)."""
        return next(self.parameters()).dtype


@dataclass
class FingerprintInputs:
    """What identifies a loaded model for ``runtime.fingerprint.compute_fingerprint``.

    ``named_weights`` holds references (no copies). ``extra`` carries what the
    weights alone do not show: the source file's sha256, its quantisation type,
    library versions.
    """

    config: dict[str, Any]
    named_weights: list[tuple[str, torch.Tensor]]
    code_version: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: CausalLM, **extra: Any) -> FingerprintInputs:
        from flashrt_ros import __version__
        return cls(config=model.config_dict(), named_weights=list(model.named_parameters()),
                   code_version=f"flashrt_ros-{__version__}:{type(model).__module__}.{type(model).__qualname__}",
                   extra={"torch": torch.__version__, **extra})
