"""The instruction of a vision-language-action policy: set between two control steps.

Why a verb of its own and not an observation field: the instruction is episode
state, not a per-step reading. It lives in the policy's arena buffers (so a
capsule brings it back and ``fork`` can give each branch its own), and it must
change only at a committed boundary: it goes through ``PolicyEngine.write_state``
(the engine's gate, one rollback-ring entry: a ``rollback(1)`` undoes it).
Writing it empties the action queue, so the next step replans with the new
instruction. A refused instruction changes nothing.

A fork's new noise draw over the stored prefix is the engine's own verb,
``PolicyEngine.redraw(seed)``. ``reinstruct`` sets an instruction and plans the
last chunk again from the stored encoded observation (π0 / π0.5: the image tokens
and state of the last replan; ``PolicyEngine.replan_from_context``): two
boundaries, no new observation, the vision tower not run again.
"""
from __future__ import annotations

from typing import Sequence

from flashrt_ros.runtime.errors import InvalidArgument


def set_instruction(engine, text: str, *, timeout: float | None = None) -> list[int]:
    """Tokenise ``text`` with the checkpoint's tokenizer and make it the instruction; returns the ids."""
    ids = _policy(engine).instruction_ids(text)
    set_instruction_ids(engine, ids, timeout=timeout)
    return ids


def set_instruction_ids(engine, ids: Sequence[int], *, timeout: float | None = None) -> None:
    """Make the token ids ``ids`` the instruction (at the next boundary)."""
    policy = _policy(engine)
    ids = [int(i) for i in ids]
    engine.write_state(lambda arena: policy.write_instruction(arena, ids), timeout=timeout)  # validates first


def reinstruct(engine, text: str, *, timeout: float | None = None) -> list[int]:
    """``set_instruction`` then ``engine.replan_from_context()``: the queue holds the chunk the last replan
    would have planned with ``text`` (same observation, same noise draw). Returns the instruction's ids."""
    ids = set_instruction(engine, text, timeout=timeout)
    engine.replan_from_context(timeout=timeout)
    return ids


def _policy(engine):
    policy = engine.policy
    if not hasattr(policy, "write_instruction"):
        raise InvalidArgument(f"{type(policy).__name__} takes no language instruction")
    return policy
