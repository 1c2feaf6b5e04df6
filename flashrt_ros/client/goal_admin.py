"""Show and cancel a node's running goal from any process (``flashrt goals``, ``flashrt cancel``).

Why: a goal whose client was killed keeps the node busy until its lease runs out
(or for ever, for a goal sent without a lease, e.g. by ``ros2 action send_goal``);
a second goal is then refused with BUSY naming the running one. An operator needs
to end it by its id (or all of them) without the client that sent it. The running
goal, its owner and state are read from the node's latched ``~/status``; the
cancel goes through the action's own ``cancel_goal`` service.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from action_msgs.msg import GoalInfo
from action_msgs.srv import CancelGoal
from unique_identifier_msgs.msg import UUID

from flashrt_ros.client.core import TIMEOUT_CODE, ServiceCallError
from flashrt_ros.interface.errors import ErrorCode
from flashrt_ros.interface.goals import goal_id_hex

ACTIONS = ("run_policy", "generate")
#: The action a node's goals run on, by its engine.
ACTION_OF_ENGINE = {"policy": "run_policy", "llm": "generate"}


@dataclass
class RunningGoal:
    action: str
    goal_id: str            # 32 hex digits
    owner: str
    state: str


def running_goal(client: Any, timeout_s: float = 10.0) -> RunningGoal | None:
    """The node's running goal (from its latest ``~/status``), or None."""
    status = client.status(timeout_s=timeout_s)
    if not status.goal_id:
        return None
    return RunningGoal(ACTION_OF_ENGINE.get(status.engine_kind, "run_policy"), status.goal_id,
                       status.goal_owner, status.goal_state)


def cancel_goals(client: Any, goal_id: str = "", timeout_s: float = 10.0) -> list[RunningGoal]:
    """Cancel goal ``goal_id`` (32 hex digits, or a prefix of the running goal's), or every goal of
    both actions when empty; wait (up to ``timeout_s``) until the node no longer runs them.

    Returns the goals the node agreed to cancel. Raises ``ServiceCallError`` NOT_FOUND (1) for
    an id that is not the running goal's, TIMEOUT (13) when the node does not answer.
    """
    running = running_goal(client, timeout_s)
    if goal_id:
        if running is None or not running.goal_id.startswith(goal_id.lower()):
            now = f"the running goal is {running.goal_id}" if running else "no goal is running"
            raise ServiceCallError(f"no running goal on {client.namespace} matches {goal_id!r} ({now})",
                                   ErrorCode.NOT_FOUND)
        targets = [(running.action, bytes.fromhex(running.goal_id))]
    else:
        targets = [(action, bytes(16)) for action in ACTIONS]       # zero id and stamp: every goal
    cancelling: list[RunningGoal] = []
    for action, raw_id in targets:
        for info in _call_cancel(client, action, raw_id, timeout_s).goals_canceling:
            key = goal_id_hex(info.goal_id)
            known = running is not None and running.goal_id == key
            cancelling.append(RunningGoal(action, key, running.owner if known else "",
                                          running.state if known else ""))
    if cancelling:
        ids = {g.goal_id for g in cancelling}
        latest: list[Any] = []
        sub = client.watch_status(latest.append)
        try:
            client.wait_until(lambda: bool(latest) and latest[-1].goal_id not in ids, timeout_s)
        finally:
            client.node.destroy_subscription(sub)
        still = latest[-1].goal_id if latest and latest[-1].goal_id in ids else ""
        for goal in cancelling:
            goal.state = "still running" if goal.goal_id == still else "ended"
    return cancelling


def _call_cancel(client: Any, action: str, raw_id: bytes, timeout_s: float) -> Any:
    service = client.node.create_client(CancelGoal, f"{client.namespace}/{action}/_action/cancel_goal")
    try:
        if not client.wait_until(service.service_is_ready, timeout_s):
            raise ServiceCallError(f"{client.namespace}/{action}: cancel service not available within "
                                   f"{timeout_s:g} s (is the node running, and on the same ROS_DOMAIN_ID?)",
                                   TIMEOUT_CODE)
        future = service.call_async(CancelGoal.Request(goal_info=GoalInfo(goal_id=UUID(uuid=list(raw_id)))))
        deadline = time.monotonic() + timeout_s
        client.wait_until(future.done, max(0.0, deadline - time.monotonic()))
        if not future.done():
            raise ServiceCallError(f"{client.namespace}/{action}: no answer to the cancel within {timeout_s:g} s",
                                   TIMEOUT_CODE)
        return future.result()
    finally:
        client.node.destroy_client(service)
