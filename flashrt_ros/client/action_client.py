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

Lost requests. The request can be lost too: right after a node (re)starts, the client may
see its action server before the server has matched the client's request writer, and the
goal never arrives (seen in 2 fresh-clone CI runs: the node logged no goal in 60 s). The
client then sends the same request again under the same goal id (``GoalCalls``); rclpy's
server refuses a goal id it already tracks before any callback runs, so a copy can never
start a second goal. ``answer_pending`` completes the first future from whichever copy's
reply comes.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.task import Future


class RaceFreeActionClient(ActionClient):
    """An ``ActionClient`` whose lock exists before the client becomes visible to executors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_lock" and "_lock" in self.__dict__:
            return          # keep the first lock: a spinning executor may be holding it right now
        super().__setattr__(name, value)

    def accept_from_status(self, goal_id: Any, stamp: Any, future: Future | None = None) -> bool:
        """The server's status lists goal ``goal_id``, still waiting here for its acceptance reply:
        complete its ``send_goal_async`` future (``future``, else the first one sent under that id)
        with an accepted handle. False if no such goal waits.

        The reply, should it come after all, is then ignored as unexpected (rclpy logs a warning)."""
        response = self._action_type.Impl.SendGoalService.Response(accepted=True, stamp=stamp)
        return self.answer_pending(goal_id, lambda: ClientGoalHandle(self, goal_id, response), future)

    def answer_pending(self, goal_id: Any, make_handle: Callable[[], Any], future: Future | None = None) -> bool:
        """Complete a ``send_goal_async`` future of goal ``goal_id`` still waiting for its reply with
        ``make_handle()``; every other request of that id (a re-sent one) stops waiting too, so a
        late reply to any of them is ignored as unexpected. False if no such future waits."""
        key = bytes(goal_id.uuid)
        with self._lock:
            seqs = [s for s, g in self._goal_sequence_number_to_goal_id.items() if bytes(g.uuid) == key]
            futures = {s: self._pending_goal_requests.pop(s, None) for s in seqs}
            for s in seqs:
                del self._goal_sequence_number_to_goal_id[s]
            waiting = [f for f in futures.values() if f is not None and not f.done()]
            target = future if future is not None else (waiting[0] if waiting else None)
            if target is None or target.done() or target not in waiting:
                return False
            handle = make_handle()
            if handle.accepted:
                self._goal_handles[key] = weakref.ref(handle)     # status updates reach the handle
        for f in waiting:
            self.remove_future(f)
            if f is not target:
                f.cancel()
        target.set_result(handle)
        return True
