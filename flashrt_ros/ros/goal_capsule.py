"""rollback_on_cancel: the capsule a goal takes when accepted, restored if it is cancelled.

Why: a behaviour tree halts a running branch by cancelling its action goal. If
the goal had already advanced the engine (tokens generated, policy steps taken),
the halted branch would leave half-applied state behind (BehaviorTree.ROS2#18,
navigation2#6426). With the node parameter ``rollback_on_cancel`` the goal
snapshots the engine before its first step; a cancel restores that capsule (at
a committed boundary), any other ending just drops it.
"""
from __future__ import annotations

import uuid
from typing import Any


class GoalCapsule:
    """A private snapshot of the engine, named ``goal-<random>``, owned by one goal."""

    def __init__(self, engine: Any, tier: str) -> None:
        self._engine = engine
        self.name = f"goal-{uuid.uuid4().hex[:16]}"
        engine.capsules.snapshot(self.name, tier=tier)

    def restore(self) -> None:
        """Put the engine back to the goal's start (then drop the capsule)."""
        try:
            self._engine.capsules.restore(self.name)
        finally:
            self.discard()

    def discard(self) -> None:
        try:
            self._engine.capsules.drop(self.name)
        except Exception:  # noqa: BLE001 - already gone (reset, evicted by the user): nothing to keep
            pass
