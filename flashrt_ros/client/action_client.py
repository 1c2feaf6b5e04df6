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

Lost acceptances. Fast DDS drops a reply the server sends before it has matched the
client's reply reader ("failed to send response (timeout)", ros2/ros2#1253): a fresh
client's first goal could run on the node while the client waited for its acceptance,
then cancelled it by id. ``accept_from_status`` lets the client complete the goal's
future from the action's status topic, which lists every accepted goal, exactly as the
lost reply would have. It reaches into rclpy's ``ActionClient`` (its pending-request
tables), kept in step with rclpy 9 (Kilted) and checked by tests.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle


class RaceFreeActionClient(ActionClient):
    """An ``ActionClient`` whose lock exists before the client becomes visible to executors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_lock" and "_lock" in self.__dict__:
            return          # keep the first lock: a spinning executor may be holding it right now
        super().__setattr__(name, value)

    def accept_from_status(self, goal_id: Any, stamp: Any) -> bool:
        """The server's status lists goal ``goal_id``, still waiting here for its acceptance reply:
        complete its ``send_goal_async`` future with an accepted handle. False if no such goal waits.

        The reply, should it come after all, is then ignored as unexpected (rclpy logs a warning)."""
        key = bytes(goal_id.uuid)
        with self._lock:
            seq = next((s for s, g in self._goal_sequence_number_to_goal_id.items() if bytes(g.uuid) == key), None)
            if seq is None:
                return False
            future = self._pending_goal_requests.pop(seq, None)
            del self._goal_sequence_number_to_goal_id[seq]
            if future is None or future.done():
                return False
            response = self._action_type.Impl.SendGoalService.Response(accepted=True, stamp=stamp)
            handle = ClientGoalHandle(self, goal_id, response)
            self._goal_handles[key] = weakref.ref(handle)         # status updates reach the handle
        self.remove_future(future)
        future.set_result(handle)
        return True
