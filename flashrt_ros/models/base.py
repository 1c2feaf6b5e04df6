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
from typing import Any, Iterable

import torch

from flashrt_ros.ops.linear import Linear
from flashrt_ros.runtime.arena import POSITION, BufferSpec, StateArena

#: The one buffer holding keys and values of every attention layer.
KV_CACHE = "kv_cache"


def kv_cache_spec(max_context: int, layers: int, kv_heads: int, head_dim: int,
                  dtype: torch.dtype, *, name: str = KV_CACHE, group: str = "kv") -> BufferSpec:
    """``[max_context, layers, 2 (k, v), kv_heads, head_dim]``: position-major, all layers in one buffer.

    Why position-major: the live part of every layer's cache (rows below the
    position) is then one contiguous byte range, so a capsule copies the whole
    KV state with a single device memcpy instead of one strided copy per layer
    (measured on an H200: a multi-tensor copy of 13 segments ran at 0.4x the
    speed of one flat copy of the same bytes; benchmarks/kernel_segment_copies.py).
    """
    return BufferSpec(name, (max_context, layers, 2, kv_heads, head_dim), dtype, group=group, live_axis=0,
                      length_from=POSITION, append_only=True,
                      doc="attention keys and values of every layer, position-major")


def kv_views(arena: StateArena, index: int, buffer: str = KV_CACHE) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[max_context, kv_heads, head_dim]`` key and value views of attention layer ``index``."""
    cache = arena[buffer]
    return cache[:, index, 0], cache[:, index, 1]


class CausalLM(torch.nn.Module, ABC):
    """A decoder-only language model whose whole live state lives in a StateArena.

    Subclasses set ``vocab_size`` and implement :meth:`state_specs` and
    :meth:`forward`. Per-layer state buffers are named ``layers.{i}.*``; the
    attention caches of all layers share one ``KV_CACHE`` buffer
    (:func:`kv_cache_spec`); the engine adds its own ``meta.*`` buffers beside them.
    """

    vocab_size: int

    def build_decoder(self, config: Any, vocab_size: int, hidden_size: int, blocks: Iterable[torch.nn.Module],
                      norm: torch.nn.Module, *, tie_embeddings: bool, embedding: str = "embed_tokens",
                      head: str = "lm_head") -> None:
        """The parts every decoder has, in this order: the token embedding, the ``layers``, the final
        ``norm`` and the output head (its weight the embedding's with ``tie_embeddings``).

        ``embedding`` and ``head`` are the attribute names, as the checkpoint's weights name them
        (Hugging Face: ``embed_tokens`` / ``lm_head``; llama.cpp and gpt-fast: ``tok_embeddings`` /
        ``output``).
        """
        self.config = config
        self.vocab_size = vocab_size
        embed = torch.nn.Embedding(vocab_size, hidden_size)
        setattr(self, embedding, embed)
        self.layers = torch.nn.ModuleList(blocks)
        self.norm = norm
        output = Linear(hidden_size, vocab_size, bias=False)
        setattr(self, head, output)
        if tie_embeddings:
            output.weight = embed.weight

    @abstractmethod
    def state_specs(self, max_context: int) -> list[BufferSpec]:
        """Every state buffer the model reads or writes for a context of ``max_context`` tokens.

        KV caches: one :func:`kv_cache_spec` buffer (group ``"kv"``, live along
        the position, append-only), declared last so it extends the run of
        fully-live buffers before it. Recurrent / conv state (hybrid models):
        groups ``"recurrent"`` / ``"conv"``.
        """

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                arena: StateArena, *, last_only: bool = False) -> torch.Tensor:
        """Consume ``T`` new tokens at consecutive absolute ``positions``; return float32 logits.

        Logits are ``[T, vocab]``, or ``[1, vocab]`` for the last token with
        ``last_only`` (what an engine needs: the LM head over a whole prefill
        chunk would cost a large matmul and a ``T x vocab`` buffer for nothing).
        Writes the new state into the arena in place. Must stay capturable:
        fixed shapes per ``T``, no host sync, no allocation of persistent state,
        positions read from the ``positions`` tensor, never from the host.
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
