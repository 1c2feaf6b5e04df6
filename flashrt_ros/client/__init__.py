"""A small Python client for a running flashrt node (CLI, tests, behaviour trees).

Why one client: every caller needs the same things — wait for a service with a
timeout, retry while it is not yet available, turn ``success=false`` into a
clear error, and stream an action's feedback — so they live here once, in the
style of nav2_simple_commander. Two flavours:

- ``call_async(verb, **fields)`` returns an rclpy future (non-blocking; the
  behaviour trees poll it from their tick);
- ``call(verb, **fields)`` blocks until the response (it spins the client's
  own node when nothing else spins it) and raises ``ServiceCallError`` on
  failure responses, timeouts or an absent node.

Its rooms, one concept each, put together in ``FlashRTClient``:

- ``core``: errors, the goals' owner, waiting on the client's node, Ctrl-C and
  SIGTERM at safe points;
- ``services``: the capsule services (every verb of ``interface/services.py``),
  a lost reply re-sent only where that is safe (``retry_safe``);
- ``goals``: goals sent with a lease, a lost acceptance recovered from the
  action's status, a lost result asked for again, cancel by handle or id;
- ``actions``: Generate and RunPolicy goals run to their result;
- ``node_queries``: ``~/status`` and the node's parameters.

Every wait is bounded and ends in ``TIMEOUT`` (error code 13): a DDS reply can be
lost for good (ros2/ros2#1253); ``services`` and ``goals`` say what is re-sent.
``cancel_goals`` and ``running_goal`` (``flashrt_ros.client.goal_admin``) build on this.
"""
from __future__ import annotations

from rclpy.node import Node

from flashrt_ros.client.actions import ActionCalls, GenerateOutcome, RunPolicyOutcome
from flashrt_ros.client.core import TIMEOUT_CODE, ClientCore, ServiceCallError, Terminated, default_owner
from flashrt_ros.client.goals import (ACCEPTANCE_GRACE_S, GOAL_ENDED, RESULT_ASK_FIRST_S, RESULT_ASK_MAX_S,
                                      RESULT_GRACE_S, ResultAsking)
from flashrt_ros.client.node_queries import NodeQueries
from flashrt_ros.client.services import (FIRST_ATTEMPT_S, RETRY_SAFE_VERBS, SERVICES, ServiceCalls, resend_times,
                                         retry_safe)
from flashrt_ros.client.lease import DEFAULT_LEASE_S


class FlashRTClient(ServiceCalls, ActionCalls, NodeQueries):
    """Typed access to one flashrt node's services, its actions, its status and parameters.

    ``lease_s``: the lease of every goal sent (0: none; see ``goals``);
    ``owner``: who the goals are from (default ``default_owner(node)``)."""

    def __init__(self, node: Node, namespace: str = "/flashrt", *, lease_s: float = DEFAULT_LEASE_S,
                 owner: str = "") -> None:
        ClientCore.__init__(self, node, namespace, owner)
        self._setup_goals(lease_s)
        self._setup_services()
        self._setup_actions()


__all__ = ["ACCEPTANCE_GRACE_S", "FIRST_ATTEMPT_S", "GOAL_ENDED", "RESULT_ASK_FIRST_S", "RESULT_ASK_MAX_S",
           "RESULT_GRACE_S", "RETRY_SAFE_VERBS", "SERVICES", "TIMEOUT_CODE", "FlashRTClient", "GenerateOutcome",
           "ResultAsking", "RunPolicyOutcome", "ServiceCallError", "Terminated", "default_owner", "resend_times",
           "retry_safe"]
