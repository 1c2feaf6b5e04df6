"""Plain configuration records of the LLM engine."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StoreConfig:
    """Budgets and placement of the engine's CapsuleStore (see ``runtime.store``).

    ``directory=None`` disables the disk tier (save/load then fail with
    INVALID_ARGUMENT); budgets are bytes per tier.
    """

    device_budget_bytes: int = 512 << 20
    host_budget_bytes: int = 2 << 30
    disk_budget_bytes: int = 8 << 30
    directory: Path | str | None = None
    rollback_depth: int = 8
    default_tier: str = "device"


@dataclass
class GenerationResult:
    """Outcome of one ``LLMEngine.generate`` call.

    ``token_ids`` are the emitted tokens (a final stop token included);
    ``text`` is their decoded text without special tokens. ``stop_reason`` is
    one of ``stop_token``, ``max_new_tokens``, ``cancelled``, ``context_full``.
    ``position`` counts the tokens the model has consumed; ``transcript_length``
    also counts the pending (emitted, not yet consumed) token, if any.
    With speculative decoding, ``drafted_tokens`` counts the drafts verified and
    ``accepted_tokens`` those emitted (0 and 0 without).
    """

    text: str
    token_ids: list[int]
    stop_reason: str
    prompt_tokens: int
    position: int
    transcript_length: int
    timings: dict[str, float] = field(default_factory=dict)
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": list(self.token_ids), "stop_reason": self.stop_reason,
                "prompt_tokens": self.prompt_tokens, "position": self.position,
                "transcript_length": self.transcript_length, "timings": dict(self.timings),
                "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens}

