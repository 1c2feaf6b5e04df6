"""Request set-up of the LLM engine: a prompt becomes token ids, sampling settings become arena bytes.

Why apart: this is the part of a request that depends on text and settings,
not on how steps run. It writes the arena (sampling settings, the prompt
length) only through the ``write_request`` step the engine commits, so the
settings are part of the next capsule like everything else.
"""
from __future__ import annotations

from typing import Sequence

from flashrt_ros.engine.sampling import SamplingParams
from flashrt_ros.engine.state import (PENDING, PROMPT_LENGTH, RNG_COUNTER, RNG_SEED, TEMPERATURE,
                                      TOKENS, TOP_K, TOP_P)
from flashrt_ros.models.tokenizer import Tokenizer
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import ContextOverflow, InvalidArgument


def prompt_ids(tokenizer: Tokenizer, arena: StateArena, prompt: str | Sequence[int], *, chat: bool,
               position: int, has_pending: int) -> list[int]:
    """The ids a prompt adds to the transcript (text is encoded; ``chat`` wraps it as a user turn)."""
    if not isinstance(prompt, str):
        if chat:
            raise InvalidArgument("chat=True needs a text prompt")
        return [int(i) for i in prompt]
    if chat:
        return tokenizer.chat_ids(prompt, after_token=last_transcript_token(arena, position, has_pending))
    return tokenizer.encode(prompt) if prompt else []


def last_transcript_token(arena: StateArena, position: int, has_pending: int) -> int | None:
    """The transcript's last token (the pending one if any), None on an empty transcript."""
    if has_pending:
        return int(arena[PENDING].item())
    if position > 0:
        return int(arena[TOKENS][position - 1].item())
    return None


def check_fits(ids: Sequence[int], *, position: int, has_pending: int, max_context: int) -> int:
    """The transcript length after feeding ``ids``; ContextOverflow if that exceeds ``max_context``."""
    needed = position + (has_pending if ids else 0) + len(ids)
    if needed > max_context:
        raise ContextOverflow(f"prompt of {len(ids)} tokens does not fit: position {position}, "
                              f"max_context {max_context}")
    return needed


def check_ids(ids: Sequence[int], *, vocab_size: int, position: int, has_pending: int) -> None:
    """Refuse ids outside the vocabulary, and an empty prompt with nothing to continue from."""
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InvalidArgument(f"token ids out of range [0, {vocab_size}): {bad[:5]}")
    if not ids and position == 0 and not has_pending:
        raise InvalidArgument("empty prompt on an empty context: there is nothing to continue from")


def write_request(arena: StateArena, sampling: SamplingParams | None, prompt_length: int | None) -> None:
    """Write the request's sampling settings and prompt length into the arena (inside a step)."""
    if sampling is not None:
        arena[TEMPERATURE].fill_(sampling.temperature)
        arena[TOP_K].fill_(sampling.top_k)
        arena[TOP_P].fill_(sampling.top_p)
        if sampling.seed is not None:
            arena[RNG_SEED].fill_(sampling.seed_int64)
            arena[RNG_COUNTER].zero_()
    if prompt_length is not None:
        arena[PROMPT_LENGTH].fill_(prompt_length)
