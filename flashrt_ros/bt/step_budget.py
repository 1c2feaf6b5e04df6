"""The steps a RunPolicy node has left across halts (``resume_after_halt``), and its goal's fields."""
from __future__ import annotations

from typing import Any, Callable

from flashrt_ros.bt.goal_request import GoalRequest
from flashrt_ros.interface.actions import RUN_POLICY


class StepBudget:
    """The steps a RunPolicy node has left of ``max_steps`` across halts (``resume_after_halt``).

    A halted goal stops between two steps; the next start of the same node then
    runs only what that goal left (counted from its result, so a mission of N
    steps takes exactly N committed steps however often it is interrupted; a
    rolled-back goal left all of its steps). A run that finishes resets the budget.
    """

    def __init__(self) -> None:
        self.left: int | None = None
        self._sent = 0
        self._halted: GoalRequest | None = None

    def steps_to_send(self, max_steps: int) -> int:
        """Called when the goal is sent (after any halted goal has reported)."""
        if self._halted is not None:
            kept = self._halted.reported_steps()
            self.left = self._sent - min(kept, self._sent) if kept is not None else self._sent
            self._halted = None
        self._sent = self.left if self.left is not None else max_steps
        return self._sent

    def halted(self, request: GoalRequest) -> None:
        self._halted = request

    def finished(self) -> None:
        self.left, self._halted = None, None


def run_policy_fields(fields: dict[str, Any], budget: StepBudget | None
                      ) -> dict[str, Any] | Callable[[], dict[str, Any] | None]:
    """A RunPolicy goal's fields (those a tree gives: ``interface.actions.RUN_POLICY.tree_fields``), as
    their declared types; with a budget, read at send time (None: no step left to run)."""
    def typed(steps: int) -> dict[str, Any]:
        return {f.name: f.kind(steps if f.name == "max_steps" else fields[f.name]) for f in RUN_POLICY.tree_fields}
    max_steps = int(fields["max_steps"])
    if budget is None or not max_steps:
        return typed(max_steps)

    def at_send() -> dict[str, Any] | None:
        steps = budget.steps_to_send(max_steps)
        return typed(steps) if steps > 0 else None
    return at_send
