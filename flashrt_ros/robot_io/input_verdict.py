"""The policy inputs' verdict: fresh, stale, refused or a failed step, said in one text.

Why one place: the same verdict is shown by ``~/status`` (``inputs_state`` /
``inputs_detail``), by a RunPolicy goal's waiting feedback (``flashrt
run-policy``'s "waiting ..." lines, a behaviour-tree node's "waiting" event), by
the goal's state in ``flashrt goals``, and by the goal's result when it ends on
it, with the error code that names the cause (``STALE_INPUTS``,
``INPUT_REJECTED``, ``INTERNAL`` for a policy step that raised). A user reads
the same words wherever they look. A topic whose messages arrive but are
refused (an image encoding the node cannot convert, a JointState lacking
joints) is reported as refused, never as "no message yet" or stale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

#: why a goal could not step -> the stop reason it ends with after its stale_timeout_s
STOP_REASONS = {"stale": "stale_inputs", "rejected": "input_rejected", "step_failed": "step_failed"}


@dataclass(frozen=True)
class InputVerdict:
    """``state`` is EngineStatus.inputs_state (fresh | stale | error); ``cause`` says why it is not
    fresh (stale | rejected | step_failed), the key of ``STOP_REASONS``."""

    state: str
    detail: str
    cause: str

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"


FRESH = InputVerdict("fresh", "", "")


def not_ready(stale: Sequence[str], reason: str, rejections: Mapping[str, str]) -> InputVerdict:
    """A take that found inputs missing, too old or out of sync (``stale``: their names, ``reason``:
    the freshness rule's text). Inputs whose latest messages were refused are named with why."""
    refused = [name for name in stale if name in rejections]
    if not refused:
        return InputVerdict("stale", reason, "stale")
    return rejected({name: rejections[name] for name in refused},
                    [name for name in stale if name not in rejections])


def rejected(refused: Mapping[str, str], also_stale: Sequence[str] = ()) -> InputVerdict:
    """Inputs whose messages the node refuses: ``{topic: why}``; ``also_stale``: other inputs not fresh."""
    detail = "input messages refused: " + "; ".join(f"{topic}: {why}" for topic, why in refused.items())
    if also_stale:
        detail += f"; not fresh either: {', '.join(also_stale)}"
    return InputVerdict("error", detail, "rejected")


def step_failed(error: BaseException) -> InputVerdict:
    """The policy raised on an observation its inputs accepted."""
    return InputVerdict("error", f"policy step failed: {error}", "step_failed")
