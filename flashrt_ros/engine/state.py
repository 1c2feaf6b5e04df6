"""The LLM engine's own state buffers, declared beside the model's.

Why in the arena: everything that decides the next emitted token must be in a
capsule. Besides the model state that is the transcript (so a restored capsule
knows its text), the next-token logits or the sampled-but-unconsumed token,
the sampling settings and the random stream.

The transcript is ``meta.tokens[:position]`` (tokens consumed by the model)
followed by ``meta.pending_token`` when ``meta.has_pending`` is 1 (emitted to
the client, not yet fed back). ``meta.logits`` holds the logits of the last
consumed token; they are the source of the next draw when nothing is pending.
"""
from __future__ import annotations

import torch

from flashrt_ros.runtime.arena import POSITION, BufferSpec

TOKENS = "meta.tokens"
PENDING = "meta.pending_token"
HAS_PENDING = "meta.has_pending"
LAST_TOKEN = "meta.last_token"
PROMPT_LENGTH = "meta.prompt_length"
LOGITS = "meta.logits"
TEMPERATURE = "sampling.temperature"
TOP_K = "sampling.top_k"
TOP_P = "sampling.top_p"
RNG_SEED = "rng.seed"
RNG_COUNTER = "rng.counter"


def engine_state_specs(max_context: int, vocab_size: int) -> list[BufferSpec]:
    """Engine buffers (the core ``meta.position``/``meta.boundary`` are declared separately).

    The transcript, live only up to the position, comes last so that the fully
    live buffers before it and its live prefix are one contiguous copy.
    """
    i64, f32 = torch.int64, torch.float32
    return [
        BufferSpec(PENDING, (), i64, group="meta", doc="emitted token not yet fed to the model"),
        BufferSpec(HAS_PENDING, (), i64, group="meta", doc="1 if meta.pending_token is valid"),
        BufferSpec(LAST_TOKEN, (), i64, group="meta", doc="last token consumed by the model"),
        BufferSpec(PROMPT_LENGTH, (), i64, group="meta",
                   doc="position at which the current generation's output began"),
        BufferSpec(LOGITS, (vocab_size,), f32, group="meta", doc="logits after the last consumed token"),
        BufferSpec(TEMPERATURE, (), f32, group="sampling", doc="0 = greedy"),
        BufferSpec(TOP_K, (), i64, group="sampling", doc="<= 0 disables"),
        BufferSpec(TOP_P, (), f32, group="sampling", doc=">= 1 disables"),
        BufferSpec(RNG_SEED, (), i64, group="rng", doc="counter-based generator: seed"),
        BufferSpec(RNG_COUNTER, (), i64, group="rng", doc="counter-based generator: draws so far"),
        BufferSpec(TOKENS, (max_context,), i64, group="meta", live_axis=0, length_from=POSITION,
                   append_only=True, doc="transcript: token ids consumed by the model"),
    ]
