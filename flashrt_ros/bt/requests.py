"""The request/response core under every behaviour-tree front-end (py_trees, BehaviorTree.CPP).

Why one place: a verb must behave the same whichever tree library ticks it, so
the rules live here and the front-ends only translate statuses and ports:

* **A tick never waits.** A request is sent on the first ``poll()`` once its
  server is ready; later polls only look at the rclpy future. The futures
  complete while some executor spins the client's node (a spin thread, or
  ``executor.spin_once(timeout_sec=0)`` between ticks).
* **``success`` is checked.** A response or result with ``success=false`` is
  FAILURE carrying the node's ``error_code`` and message; an absent server or a
  missing answer is FAILURE with ``TIMEOUT``.
* **A lost reply is not a hang.** DDS can lose a service reply for good
  (ros2/ros2#1253). Every request has a deadline and then FAILS with
  ``TIMEOUT``; a request that is safe to repeat (``flashrt_ros.client.retry_safe``:
  list, verify, pin, unpin, save, pause, resume, restore, reset, snapshot with
  overwrite) is re-sent while it waits (2 s, 6 s, 14 s after the first), and
  the first reply to any copy counts. A goal is never sent under a new id: if its
  acceptance never arrives it is cancelled by its goal id, and a result lost
  after the goal ended (its status says so) is asked for again.
* **Halt stops at a committed boundary.** Halting a service request abandons it
  (a request already delivered may still be applied: services cannot be
  recalled). Halting a goal cancels it: the node stops between two committed
  steps and, with ``rollback_on_cancel``, restores the state the goal started
  from. A goal halted before its acceptance arrived is cancelled the moment it
  is accepted (from the executor, whether or not the tree ticks again: a tree
  that ends and is not ticked again must not leave it running). Until that
  cancelled goal has reported its result, every later request
  of the same client waits (RUNNING, bounded by its own timeout), so the next
  node of the tree acts on the boundary the goal stopped at, never on a state
  the cancel has not settled yet. Clients that share a ``halt_scope`` (the
  clients of the nodes of one tree) wait for each other's halted goals: a
  simulator restored while the policy's cancelled goal still steps would be
  moved again by that goal.

Each concept in its module: ``progress`` (a request's progress and failure
messages), ``service_request``, ``goal_request`` (with the halted-goal scope),
``step_budget`` (RunPolicy's steps left across halts) and ``status_watch`` (the
node's ``~/status`` for condition nodes). Their names are importable from here.
"""
from __future__ import annotations

from flashrt_ros.bt.goal_request import (SETTLE_TIMEOUT_S, GoalRequest, HaltScope, halted_goals_settled,
                                         unsettled_goals)
from flashrt_ros.bt.progress import DEFAULT_TIMEOUT_S, Progress, describe_failure
from flashrt_ros.bt.service_request import ServiceRequest, response_status
from flashrt_ros.bt.status_watch import StatusWatch, check_status, status_watch
from flashrt_ros.bt.step_budget import StepBudget, run_policy_fields

__all__ = ["DEFAULT_TIMEOUT_S", "SETTLE_TIMEOUT_S", "GoalRequest", "HaltScope", "Progress", "ServiceRequest",
           "StatusWatch", "StepBudget", "check_status", "describe_failure", "halted_goals_settled",
           "response_status", "run_policy_fields", "status_watch", "unsettled_goals"]
