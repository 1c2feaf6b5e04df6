"""Goals: sent under a fresh id with a lease, their acceptance recovered, their result asked for
again, cancelled by handle or by id.

Lost replies and requests. A goal is never sent under a new id twice (it may
have been accepted). One whose acceptance reply is lost but which the action's
status topic lists was accepted: after ``ACCEPTANCE_GRACE_S`` the listing is taken
as the acceptance. One that neither a reply nor the status names after
``REQUEST_RESEND_FIRST_S`` may never have arrived (a server that has not yet
matched the client drops it): the same request goes again under the same goal id,
doubling the wait up to ``REQUEST_RESEND_MAX_S``; the server refuses an id it
already tracks, so a copy never starts a second goal, and whichever reply comes
answers the goal. One still unanswered when the wait for it ends is cancelled by
its goal id. A
lost result is asked for again (get-result is read-only): soon once the goal's
status says it ended, and on a slow doubling schedule while no status says so,
because a status message taken before the goal's acceptance is dropped by rclpy
(it has no goal handle to update yet), so a goal that ends at once may never
show as ended.

Goals carry a lease (``lease_s``, default ``lease.DEFAULT_LEASE_S``) and an
``owner``: while the process lives, a thread of its own renews the lease of every
goal it sent (whether or not anything spins the client's node); if the process
dies, the node ends the goal.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.action.client import ClientGoalHandle
from rclpy.qos import qos_profile_action_status_default
from rclpy.task import Future
from unique_identifier_msgs.msg import UUID

from flashrt_ros.client.core import TIMEOUT_CODE, ClientCore, NodeGone, ServiceCallError
from flashrt_ros.client.lease import LeaseRenewer
from flashrt_ros.interface.goals import GOAL_RESEND_HORIZON_S, goal_id_hex
from flashrt_ros.interface.qos import FEEDBACK_QOS

#: A goal's status once it has ended (its result is then due).
GOAL_ENDED = (GoalStatus.STATUS_SUCCEEDED, GoalStatus.STATUS_CANCELED, GoalStatus.STATUS_ABORTED)
#: How long a goal listed by the node's status may wait for its acceptance reply before the client
#: takes the listing as the acceptance (the reply was lost).
ACCEPTANCE_GRACE_S = 1.0
#: How long a goal may go unanswered and unlisted before its request is sent again (same goal id),
#: doubling up to ``REQUEST_RESEND_MAX_S``.
REQUEST_RESEND_FIRST_S = 2.0
REQUEST_RESEND_MAX_S = 8.0
#: After a goal's status says it ended, how long its result may take before it is asked for again.
RESULT_GRACE_S = 2.0
#: While no status says the goal ended: first re-ask of its result, doubling up to ``RESULT_ASK_MAX_S``.
RESULT_ASK_FIRST_S = 8.0
RESULT_ASK_MAX_S = 60.0


class ResultAsking:
    """When to ask for a goal's result again, its reply having possibly been lost.

    Soon (``RESULT_GRACE_S``) after the goal's status says it ended; else every
    ``RESULT_ASK_FIRST_S`` doubling to ``RESULT_ASK_MAX_S``, since the status
    of a goal that ended before its acceptance arrived is never seen. Extra
    requests of a running goal are held by the server and answered at its end.
    """

    def __init__(self, now: float) -> None:
        self._asked_at = now
        self._blind_s = RESULT_ASK_FIRST_S

    def due(self, status: int, now: float) -> bool:
        """Whether to ask again now (given the goal handle's latest status); counts it as asked."""
        if status in GOAL_ENDED:
            due = now - self._asked_at >= RESULT_GRACE_S
        else:
            due = now - self._asked_at >= self._blind_s
            if due:
                self._blind_s = min(2 * self._blind_s, RESULT_ASK_MAX_S)
        if due:
            self._asked_at = now
        return due


class _Resend:
    """A goal awaiting its acceptance: what to send again, when, and a refused copy's answer."""

    def __init__(self, client: Any, goal: Any, goal_id: Any, future: Future, sent_at: float) -> None:
        self.client, self.goal, self.goal_id, self.future = client, goal, goal_id, future
        self.sent_at = sent_at
        self.delay_s = REQUEST_RESEND_FIRST_S
        self.next_at = sent_at + self.delay_s
        self.copies = 0
        self.refusal: tuple[Any, float] | None = None
        self.probe: Future | None = None         # a get-result request for the goal id: does the node know it?


class GoalCalls(ClientCore):
    """The goals of the node's actions that this client sent, from their send to their result."""

    def _setup_goals(self, lease_s: float) -> None:
        self.leases = LeaseRenewer(self.node, self.namespace, lease_s)
        self._feedback_callbacks: dict[bytes, Callable[[Any], None]] = {}
        self._sent_goal_ids: dict[int, Any] = {}     # goal request future -> goal id, until answered
        self._listed: dict[bytes, tuple[Any, Any, Any, float]] = {}   # (client, id, stamp, first seen)
        self._resends: dict[bytes, _Resend] = {}     # the goals awaiting acceptance: how to send them again
        self._recovery_timer: Any = None
        self._cancel_clients: dict[str, Any] = {}    # action name -> its cancel_goal service client
        self._instances: dict[bytes, str] = {}       # goal id -> the node instance it was sent to (node_watch)

    def _follow_goals(self, actions: tuple[tuple[Any, str, Any], ...]) -> None:
        """Subscribe to each action's (type, name, action client) feedback and status topics."""
        node = self.node
        # Our own subscription to the action's feedback topic: rclpy's ActionClient drops a goal's
        # feedback callback as soon as its result arrives, and feedback travels on another topic,
        # so the last pieces can come after the result (and were silently lost).
        self._feedback_subs = [node.create_subscription(
            action.Impl.FeedbackMessage, f"{self.namespace}/{name}/_action/feedback",
            self._on_feedback, FEEDBACK_QOS.profile()) for action, name, _client in actions]
        # ... and to its status: a goal listed there was accepted, even if its acceptance reply was lost.
        self._status_subs = [node.create_subscription(
            GoalStatusArray, f"{self.namespace}/{name}/_action/status",
            lambda msg, c=action_client: self._on_goal_status(c, msg), qos_profile_action_status_default)
            for _action, name, action_client in actions]

    def _send_goal(self, action_client: Any, goal: Any, feedback: Callable[[Any], None] | None) -> Future:
        """Send ``goal`` under a fresh id: feedback routed, lease renewed from now, id kept until accepted."""
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        if feedback is not None:
            self._feedback_callbacks[bytes(goal_id.uuid)] = feedback
        if goal.lease_s > 0:
            self.leases.hold(goal_id)
        self._instances[bytes(goal_id.uuid)] = self.node_watch.heard().instance_id
        future = action_client.send_goal_async(goal, goal_uuid=goal_id)
        self._resends[bytes(goal_id.uuid)] = _Resend(action_client, goal, goal_id, future, time.monotonic())
        return self._remember_goal_id(future, goal_id)

    def _remember_goal_id(self, future: Future, goal_id: Any) -> Future:
        """Keep a sent goal's id until its acceptance arrives (from its reply, or from the action's
        status topic if the reply was lost; to cancel it by id if neither comes)."""
        key = bytes(goal_id.uuid)
        self._sent_goal_ids[id(future)] = goal_id
        if self._recovery_timer is None:
            self._recovery_timer = self.node.create_timer(ACCEPTANCE_GRACE_S / 4, self.recover_lost_acceptances)

        def answered(f: Future) -> None:
            self._sent_goal_ids.pop(id(f), None)
            self._listed.pop(key, None)
            self._resends.pop(key, None)
        future.add_done_callback(answered)
        return future

    def _on_goal_status(self, action_client: Any, msg: Any) -> None:
        """Note the goals of ours a status list names while they still wait for their acceptance."""
        now = time.monotonic()
        for status in msg.status_list:
            key = bytes(status.goal_info.goal_id.uuid)
            if key in self._resends and key not in self._listed:
                self._listed[key] = (action_client, status.goal_info.goal_id, status.goal_info.stamp, now)

    def recover_lost_acceptances(self) -> None:
        """Goals the node's status has listed for ``ACCEPTANCE_GRACE_S`` while their acceptance reply
        never came were accepted: complete their futures (the reply was lost). A timer on the
        client's node calls it while goals wait, so whatever spins the node recovers them.

        The grace: the status often arrives before the reply; taking it at once would leave the
        reply, when it comes, to rclpy's "unexpected goal response" warning."""
        now = time.monotonic()
        for key, (action_client, goal_id, stamp, seen) in list(self._listed.items()):
            if now - seen >= ACCEPTANCE_GRACE_S and self._listed.pop(key, None) is not None:
                resend = self._resends.get(key)
                action_client.accept_from_status(goal_id, stamp, resend.future if resend else None)
        for key, resend in list(self._resends.items()):
            if key in self._listed or resend.future.done():
                continue
            if resend.refusal is not None:
                self._decide_refused_copy(resend, now)
            elif now >= resend.next_at and now - resend.sent_at < GOAL_RESEND_HORIZON_S:
                self._send_again(key, resend, now)

    def _decide_refused_copy(self, resend: "_Resend", now: float) -> None:
        """A copy was refused: as a new goal (the node is busy, inactive), or because the node already tracks its
        id (the first request arrived after all; running, or ended and retained, ``GOAL_RETENTION_S``). Accepted
        when the node's heartbeat lists the goal (running) or the get-result probe shows the node knows it (it
        answers a known goal's result, and ``STATUS_UNKNOWN`` at once for an id it never accepted); the refusal
        is the answer when the probe says unknown, or (a node without a heartbeat) when no status listed the goal
        within ``ACCEPTANCE_GRACE_S``."""
        accepted = ClientGoalHandle(resend.client, resend.goal_id,
                                    resend.client._action_type.Impl.SendGoalService.Response(accepted=True))
        if goal_id_hex(resend.goal_id) in self.node_watch.heard().goal_ids:
            resend.client.answer_pending(resend.goal_id, lambda: accepted, resend.future)
        elif resend.probe is not None and resend.probe.done() and not resend.probe.cancelled():
            known = resend.probe.result().status != GoalStatus.STATUS_UNKNOWN
            resend.client.answer_pending(resend.goal_id, (lambda: accepted) if known else
                                         (lambda r=resend: r.refusal[0]), resend.future)
        elif resend.probe is None and now - resend.refusal[1] >= ACCEPTANCE_GRACE_S:
            resend.client.answer_pending(resend.goal_id, lambda r=resend: r.refusal[0], resend.future)

    def _send_again(self, key: bytes, resend: "_Resend", now: float) -> None:
        """Send a goal's request again under its own id (see the module docstring)."""
        copy = resend.client.send_goal_async(resend.goal, goal_uuid=resend.goal_id)
        resend.copies += 1
        resend.delay_s = min(2 * resend.delay_s, REQUEST_RESEND_MAX_S)
        resend.next_at = now + resend.delay_s

        def copy_answered(f: Future) -> None:
            if f.cancelled() or resend.future.done() or f.exception() is not None:
                return
            handle = f.result()
            if handle.accepted:
                resend.client.answer_pending(resend.goal_id, lambda: handle, resend.future)
            else:
                # refused: a new refusal, or the server already tracks this id (the first request arrived
                # after all): ask the node what it knows of the goal (_decide_refused_copy)
                resend.refusal = (handle, time.monotonic())
                if self.node_watch.heard().at is not None:
                    probe = ClientGoalHandle(resend.client, resend.goal_id,
                                             resend.client._action_type.Impl.SendGoalService.Response(accepted=True))
                    resend.probe = probe.get_result_async()
        copy.add_done_callback(copy_answered)

    def goal_node_gone(self, goal_id: Any) -> str | None:
        """Why a goal sent under ``goal_id`` can no longer end on its node (it stopped beating, or it restarted
        since the goal was sent), or None (``client.node_watch``)."""
        if goal_id is None:
            return self.node_watch.gone("")
        return self.node_watch.gone(self._instances.get(bytes(goal_id.uuid), ""))

    def sent_goal_id(self, future: Future) -> Any:
        """The goal id of a ``generate_async`` / ``run_policy_async`` future still waiting for its
        acceptance (else None)."""
        return self._sent_goal_ids.get(id(future))

    def forget_goal(self, goal: Any) -> None:
        """A goal ended (or was rejected, or its acceptance was lost): stop delivering its
        feedback (late pieces are dropped) and stop renewing its lease.

        ``goal``: its goal handle, or its goal id (a goal whose acceptance never arrived)."""
        goal_id = getattr(goal, "goal_id", goal)
        self._feedback_callbacks.pop(bytes(goal_id.uuid), None)
        self._instances.pop(bytes(goal_id.uuid), None)
        self.leases.release(goal_id)

    def _on_feedback(self, msg: Any) -> None:
        callback = self._feedback_callbacks.get(bytes(msg.goal_id.uuid))
        if callback is not None:
            callback(msg.feedback)

    def _goal_result(self, action: str, sent: Future, wait_s: float, timeout_s: float) -> tuple[Any, Any]:
        """(goal handle, wrapped result) of a sent goal; (handle, None) when it was rejected.

        Ctrl-C while waiting cancels the goal first (its final result rides on the
        KeyboardInterrupt as ``.result``); no result within ``timeout_s`` cancels it too."""
        goal_id = self._sent_goal_ids.get(id(sent))
        instance = self._instances.get(bytes(goal_id.uuid), "") if goal_id is not None else ""
        try:
            handle = self._wait(sent, wait_s, instance)
        except NodeGone:
            sent.cancel()                                # nothing left to cancel on a dead node
            if goal_id is not None:
                self.forget_goal(goal_id)
            raise
        except KeyboardInterrupt as interrupt:
            # Ctrl-C / SIGTERM before the acceptance arrived: the node may run the goal already
            interrupt.result = self._cancel_unanswered(action, sent, wait_s)
            raise
        if handle is None:
            # Never re-sent: it may have been accepted. Cancel it by its id in case it was.
            cancelled = self._cancel_by_id(action, sent, self._sent_goal_ids.get(id(sent)), wait_s)
            raise ServiceCallError(
                f"{action}: no answer to the goal request (nor to its copies under the same id) within {wait_s:.1f} s "
                "(TIMEOUT); never sent under a new id, "
                + ("a cancel was sent in case it was accepted" if cancelled else
                   "and no answer to a cancel either: the goal may be running"), TIMEOUT_CODE)
        self._sent_goal_ids.pop(id(sent), None)
        if not handle.accepted:
            self.forget_goal(handle)
            return handle, None
        try:
            wrapped = self.wait_result(handle, timeout_s)
        except KeyboardInterrupt as interrupt:
            interrupt.result = self._cancel(handle, wait_s)
            raise
        if wrapped is None:
            handle.cancel_goal_async()
            raise ServiceCallError(f"{action}: no result within {timeout_s:.0f} s (TIMEOUT); a cancel "
                                   "was sent", TIMEOUT_CODE)
        return handle, wrapped

    def wait_result(self, handle: Any, timeout_s: float) -> Any:
        """The goal's wrapped result, or None after ``timeout_s``.

        The result travels as the reply of a get-result request, which can be
        lost like any reply; it is asked for again as ``ResultAsking`` says.
        """
        futures = [handle.get_result_async()]
        asking = ResultAsking(time.monotonic())
        deadline = time.monotonic() + timeout_s
        instance = self._instances.get(bytes(handle.goal_id.uuid), "")
        while (left := deadline - time.monotonic()) > 0:
            answered = next((f for f in futures if f.done()), None)
            if answered is not None:
                return answered.result()
            if asking.due(handle.status, time.monotonic()):
                futures.append(handle.get_result_async())
            try:
                self._wait_any(futures, min(left, 0.2), instance)
            except NodeGone:
                self.forget_goal(handle)
                raise
        return None

    def cancel_goal_id(self, goal_id: Any, action: str = "generate") -> Future:
        """Ask the node to cancel ``action`` goal ``goal_id`` (a goal whose acceptance never arrived)."""
        from action_msgs.msg import GoalInfo
        from action_msgs.srv import CancelGoal
        if action not in ("generate", "run_policy"):
            raise ValueError(f"unknown action {action!r} (generate or run_policy)")
        if action not in self._cancel_clients:
            self._cancel_clients[action] = self.node.create_client(
                CancelGoal, f"{self.namespace}/{action}/_action/cancel_goal")
        return self._cancel_clients[action].call_async(CancelGoal.Request(goal_info=GoalInfo(goal_id=goal_id)))

    def _cancel_unanswered(self, action: str, sent: Future, wait_s: float) -> Any:
        """Cancel a goal interrupted before its acceptance arrived and return its final result (None
        if none came): wait (bounded) for the acceptance and cancel through the handle, else by id."""
        goal_id = self._sent_goal_ids.get(id(sent))
        handle = self._wait(sent, wait_s)
        if handle is not None:
            if handle.accepted:
                return self._cancel(handle, wait_s)
            self.forget_goal(handle)
            return None
        self._cancel_by_id(action, sent, goal_id, wait_s)
        return None

    def _cancel_by_id(self, action: str, sent: Future, goal_id: Any, wait_s: float) -> bool:
        """A sent goal whose acceptance never came: drop the request and cancel the goal by its id in
        case the node accepted it; True if the node answered the cancel."""
        sent.cancel()
        if goal_id is None:
            return False
        self.forget_goal(goal_id)
        return self._wait(self.cancel_goal_id(goal_id, action), wait_s) is not None

    def _cancel(self, handle: Any, wait_s: float) -> Any:
        """Cancel a goal and return its final result (the node stops at a committed boundary)."""
        if self._wait(handle.cancel_goal_async(), wait_s) is None:
            return None
        wrapped = self.wait_result(handle, wait_s)
        return wrapped.result if wrapped is not None else None

    def close(self) -> None:
        """Stop renewing leases and recovering acceptances, then close the core (its executor)."""
        self.leases.close()
        if self._recovery_timer is not None:
            self.node.destroy_timer(self._recovery_timer)
            self._recovery_timer = None
        super().close()
