"""rclpy's ActionClient, safe to create on a node that an executor is already spinning.

Why: rclpy (Humble to Kilted; ros2/rclpy#1589) adds a new ActionClient to its node's
waitables and only afterwards creates the client's ``_lock``. An executor spinning that
node in another thread rebuilds its wait set when the node changes and calls
``get_num_entities()``, which takes ``_lock``; landing in that window it raises
``AttributeError: 'ActionClient' object has no attribute '_lock'``, and a thread running
``executor.spin()`` ends there: no later reply or feedback reaches any node on that
executor. We saw it as ``/arm/flashrt/reset`` answering nothing for 120 s in 1 of 10
fresh-clone test runs (the supervisor creates its clients after its executor started).

The fix: the lock exists before the client joins its node, and the base class's later
assignment keeps it (an executor may already hold it), so there is one lock for the
client's whole life. Harmless on an rclpy that creates its lock first.
"""
from __future__ import annotations

import threading
from typing import Any

from rclpy.action import ActionClient


class RaceFreeActionClient(ActionClient):
    """An ``ActionClient`` whose lock exists before the client becomes visible to executors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_lock" and "_lock" in self.__dict__:
            return          # keep the first lock: a spinning executor may be holding it right now
        super().__setattr__(name, value)
