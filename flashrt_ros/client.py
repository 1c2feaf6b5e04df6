"""A small Python client for a running flashrt node (CLI, tests, behaviour trees).

Why one module: every caller needs the same things — wait for a service with a
timeout, retry while it is not yet available, turn ``success=false`` into a
clear error, and stream an action's feedback — so they live here once, in the
style of nav2_simple_commander. Two flavours:

- ``call_async(verb, **fields)`` returns an rclpy future (non-blocking; the
  behaviour trees poll it from their tick);
- ``call(verb, **fields)`` blocks until the response (it spins the client's
  own node when nothing else spins it) and raises ``ServiceCallError`` on
  failure responses, timeouts or an absent node.

Lost replies. A DDS service reply can be lost for good: Fast DDS drops it when
the server has not yet matched the client's reply reader ("failed to send
response (timeout)", ros2/ros2#1253), typically on a new client's first calls
on a loaded machine. So every wait here is bounded and ends in ``TIMEOUT``
(error code 13), and a request is re-sent only where a repeat cannot do
anything one late request would not (``retry_safe``): read-only verbs (list,
verify), idempotent ones (pin, unpin, save, pause, resume) and those that set
the state to one named value (restore, reset, switch_session, a snapshot with
overwrite).
Never re-sent: a snapshot without overwrite, fork, load (a repeat of an
applied one answers ALREADY_EXISTS), drop and close_session (NOT_FOUND),
rollback (it would go back twice) and an action goal (it may have been
accepted: a goal whose acceptance never arrived is cancelled by its id
instead). A lost result is asked for again (get-result is read-only): soon once
the goal's status says it ended, and on a slow doubling schedule while no
status says so, because a status message taken before the goal's acceptance
is dropped by rclpy (it has no goal handle to update yet), so a goal that ends
at once may never show as ended.

Beside the capsule services and Generate: ``status`` / ``watch_status``
(``~/status``, transient-local), ``run_policy`` (the RunPolicy action),
``cancel_goals`` and ``get_parameters`` / ``set_parameter`` (the node's
rcl_interfaces services): what a user without ros2cli needs.

Goals carry a lease (``lease_s``, default ``goal_lease.DEFAULT_LEASE_S``) and an
``owner``: while an executor spins the client's node, a timer renews the lease
of every goal it sent; if the process dies or hangs, the node ends the goal.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_action_status_default
from rclpy.task import Future

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.goal_lease import DEFAULT_LEASE_S, LeaseRenewer, goal_key
from flashrt_ros.ros.action_client import RaceFreeActionClient
from flashrt_ros.ros.service_qos import FEEDBACK_QOS, SERVICE_QOS
from flashrt_ros.ros.service_verbs import BY_NAME, VERBS
from rcl_interfaces.srv import SetParameters
from unique_identifier_msgs.msg import UUID

#: A goal's status once it has ended (its result is then due).
GOAL_ENDED = (GoalStatus.STATUS_SUCCEEDED, GoalStatus.STATUS_CANCELED, GoalStatus.STATUS_ABORTED)

#: verb -> (service type, service name relative to the node's namespace): every capsule verb of
#: ``ros/service_verbs.py``, and the node's own parameter service (rclpy's), for behaviour trees
#: (SetParameter); its answers have results[] instead of success (bt/requests.py reads both)
SERVICES: dict[str, tuple[type, str]] = {
    **{verb.name: (verb.srv, verb.name) for verb in VERBS},
    "set_parameters": (SetParameters, "set_parameters"),
}


#: Verbs a lost reply may be re-sent for (see the module docstring); ``snapshot`` only with overwrite.
RETRY_SAFE_VERBS = frozenset({verb.name for verb in VERBS if verb.retry_safe} | {"set_parameters"})
#: How long one attempt waits for its reply before a retry-safe request is sent again (doubling).
FIRST_ATTEMPT_S = 2.0
#: How long a goal listed by the node's status may wait for its acceptance reply before the client
#: takes the listing as the acceptance (the reply was lost).
ACCEPTANCE_GRACE_S = 1.0
#: After a goal's status says it ended, how long its result may take before it is asked for again.
RESULT_GRACE_S = 2.0
#: While no status says the goal ended: first re-ask of its result, doubling up to ``RESULT_ASK_MAX_S``.
RESULT_ASK_FIRST_S = 8.0
RESULT_ASK_MAX_S = 60.0
TIMEOUT_CODE = 13


def retry_safe(verb: str, fields: dict[str, Any]) -> bool:
    """Whether re-sending ``verb`` after a lost reply is safe (see the module docstring)."""
    return verb in RETRY_SAFE_VERBS or (verb in BY_NAME and BY_NAME[verb].is_retry_safe(fields))


def resend_times(timeout_s: float, first_s: float = FIRST_ATTEMPT_S) -> list[float]:
    """Offsets (s after the first send) at which a retry-safe request is sent again: 2, 6, 14, ..."""
    times, at, step = [], first_s, first_s
    while at < timeout_s:
        times.append(at)
        step *= 2
        at += step
    return times


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised at a safe point like Ctrl-C (``sigint_at_safe_points``): the same
    orderly stop (running goals cancelled first), exit status 143 instead of 130."""


def default_owner(node: Node) -> str:
    """``'<node name> (pid N on HOST)'``: who sent a goal, as a refused goal's message names it."""
    return f"{node.get_name()} (pid {os.getpid()} on {socket.gethostname()})"


class ServiceCallError(RuntimeError):
    """A call that did not succeed; ``error_code`` is the response's (or TIMEOUT)."""

    def __init__(self, message: str, error_code: int = 0, response: Any = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.response = response


@dataclass
class RunPolicyOutcome:
    result: Any            # RunPolicy.Result
    accepted: bool
    status: int            # action_msgs/GoalStatus
    feedback_count: int = 0          # feedback messages received (== result.steps when none were lost)


@dataclass
class GenerateOutcome:
    result: Any            # Generate.Result (its ``text`` is always the whole generated text)
    accepted: bool
    status: int            # action_msgs/GoalStatus
    feedback_complete: bool = True   # every token's feedback arrived (False: some came late or never)


class FlashRTClient:
    """Typed access to one flashrt node's services and its generate action.

    ``lease_s``: the lease of every goal sent (0: none; see the module docstring);
    ``owner``: who the goals are from (default ``default_owner(node)``)."""

    def __init__(self, node: Node, namespace: str = "/flashrt", *, lease_s: float = DEFAULT_LEASE_S,
                 owner: str = "") -> None:
        self.node = node
        self.namespace = namespace.rstrip("/") or ""
        self.owner = owner or default_owner(node)
        self.leases = LeaseRenewer(node, self.namespace, lease_s)
        self._clients = {verb: node.create_client(srv, f"{self.namespace}/{name}", qos_profile=SERVICE_QOS)
                         for verb, (srv, name) in SERVICES.items()}
        self._generate = RaceFreeActionClient(node, Generate, f"{self.namespace}/generate")
        self._run_policy = RaceFreeActionClient(node, RunPolicy, f"{self.namespace}/run_policy")
        # Our own subscription to the action's feedback topic: rclpy's ActionClient drops a goal's
        # feedback callback as soon as its result arrives, and feedback travels on another topic,
        # so the last pieces can come after the result (and were silently lost).
        self._feedback_callbacks: dict[bytes, Callable[[Any], None]] = {}
        self._feedback_subs = [node.create_subscription(
            action.Impl.FeedbackMessage, f"{self.namespace}/{name}/_action/feedback",
            self._on_feedback, FEEDBACK_QOS) for action, name in ((Generate, "generate"), (RunPolicy, "run_policy"))]
        # ... and to its status: a goal listed there was accepted, even if its acceptance reply was lost.
        self._status_subs = [node.create_subscription(
            GoalStatusArray, f"{self.namespace}/{name}/_action/status",
            lambda msg, c=action_client: self._on_goal_status(c, msg), qos_profile_action_status_default)
            for action_client, name in ((self._generate, "generate"), (self._run_policy, "run_policy"))]
        self._sent_goal_ids: dict[int, Any] = {}     # goal request future -> goal id, until answered
        self._awaiting_acceptance: set[bytes] = set()
        self._listed: dict[bytes, tuple[Any, Any, Any, float]] = {}   # (client, id, stamp, first seen)
        self._recovery_timer: Any = None
        self._cancel_clients: dict[str, Any] = {}    # action name -> its cancel_goal service client
        # Spin the node ourselves only if no executor owns it when we first wait.
        self._own_executor: Any = None
        self._decided = False
        self._signal_pending: int | None = None     # see sigint_at_safe_points

    # --- services -------------------------------------------------------
    def request(self, verb: str, **fields: Any) -> Any:
        srv_type, _ = SERVICES[verb]
        req = srv_type.Request()
        for key, value in fields.items():
            if not hasattr(req, key):
                raise ValueError(f"{verb}: unknown field {key!r}")
            setattr(req, key, value)
        return req

    def wait_for(self, verb: str, timeout_s: float) -> bool:
        return self._clients[verb].wait_for_service(timeout_sec=timeout_s)

    def forget(self, verb: str, future: Future) -> None:
        """Abandon a request sent with call_async (its answer, if any, is dropped)."""
        self._clients[verb].remove_pending_request(future)

    def generate_ready(self) -> bool:
        """Whether the generate action server is up (non-blocking)."""
        return bool(self._generate.server_is_ready())

    def call_async(self, verb: str, **fields: Any) -> Future:
        """Send without waiting; the caller polls ``future.done()``."""
        return self._clients[verb].call_async(self.request(verb, **fields))

    def call(self, verb: str, *, timeout_s: float = 10.0, wait_s: float = 10.0,
             check: bool = True, **fields: Any) -> Any:
        """Call and wait; raises ServiceCallError unless the response succeeded.

        ``wait_s`` bounds finding the service, ``timeout_s`` the reply. A
        retry-safe request whose reply has not come is sent again (2 s, 6 s,
        14 s, ... after the first); the first reply to any copy is the answer.
        """
        client = self._clients[verb]
        deadline = time.monotonic() + wait_s
        while not client.wait_for_service(timeout_sec=min(0.2, wait_s)):
            self.raise_if_interrupted()
            if time.monotonic() > deadline:
                raise ServiceCallError(
                    f"service {client.srv_name} not available after {wait_s:.1f} s "
                    "(is the node running and active, and on the same ROS_DOMAIN_ID?)", TIMEOUT_CODE)
        request = self.request(verb, **fields)
        resends = resend_times(timeout_s) if retry_safe(verb, fields) else []
        futures = [client.call_async(request)]
        start = time.monotonic()
        try:
            while True:
                answered = next((f for f in futures if f.done()), None)
                if answered is not None:
                    response = answered.result()
                    break
                left = start + timeout_s - time.monotonic()
                if left <= 0:
                    response = None
                    break
                if resends and time.monotonic() - start >= resends[0]:
                    resends.pop(0)
                    futures.append(client.call_async(request))
                    continue
                next_event = min(left, (start + resends[0] - time.monotonic()) if resends else left)
                self._wait_any(futures, max(0.0, next_event))
        finally:
            for f in futures:
                if not f.done():
                    client.remove_pending_request(f)
        if response is None:
            sent = f" (sent {len(futures)} times)" if len(futures) > 1 else \
                ("" if retry_safe(verb, fields) else "; not re-sent: it may have been applied")
            raise ServiceCallError(f"{client.srv_name}: no response within {timeout_s:.1f} s "
                                   f"(TIMEOUT{sent})", TIMEOUT_CODE)
        if check and not response.success:
            raise ServiceCallError(f"{verb} failed: {response.message}",
                                   getattr(response, "error_code", 0), response)
        return response

    # --- generate action ------------------------------------------------
    def generate_async(self, prompt: str, *, feedback: Callable[[Any], None] | None = None,
                       wait_s: float = 10.0, **fields: Any) -> Future:
        """Send a goal; the future resolves to a ClientGoalHandle."""
        goal = Generate.Goal()
        goal.prompt = prompt
        goal.top_p = 1.0
        goal.lease_s, goal.owner = self.leases.lease_s, self.owner
        for key, value in fields.items():
            if not hasattr(goal, key):
                raise ValueError(f"generate: unknown goal field {key!r}")
            setattr(goal, key, value)
        if not self._generate.server_is_ready() and not self._wait_until(self._generate.server_is_ready, wait_s):
            raise ServiceCallError(
                f"action {self.namespace}/generate not available after {wait_s:.1f} s", TIMEOUT_CODE)
        return self._send_goal(self._generate, goal, feedback)

    def _send_goal(self, action_client: Any, goal: Any, feedback: Callable[[Any], None] | None) -> Future:
        """Send ``goal`` under a fresh id: feedback routed, lease renewed from now, id kept until accepted."""
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        if feedback is not None:
            self._feedback_callbacks[bytes(goal_id.uuid)] = feedback
        if goal.lease_s > 0:
            self.leases.hold(goal_id)
        return self._remember_goal_id(action_client.send_goal_async(goal, goal_uuid=goal_id), goal_id)

    def _remember_goal_id(self, future: Future, goal_id: Any) -> Future:
        """Keep a sent goal's id until its acceptance arrives (from its reply, or from the action's
        status topic if the reply was lost; to cancel it by id if neither comes)."""
        key = bytes(goal_id.uuid)
        self._sent_goal_ids[id(future)] = goal_id
        self._awaiting_acceptance.add(key)
        if self._recovery_timer is None:
            self._recovery_timer = self.node.create_timer(ACCEPTANCE_GRACE_S / 4, self.recover_lost_acceptances)

        def answered(f: Future) -> None:
            self._sent_goal_ids.pop(id(f), None)
            self._awaiting_acceptance.discard(key)
            self._listed.pop(key, None)
        future.add_done_callback(answered)
        return future

    def _on_goal_status(self, action_client: Any, msg: Any) -> None:
        """Note the goals of ours a status list names while they still wait for their acceptance."""
        now = time.monotonic()
        for status in msg.status_list:
            key = bytes(status.goal_info.goal_id.uuid)
            if key in self._awaiting_acceptance and key not in self._listed:
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
                action_client.accept_from_status(goal_id, stamp)

    def sent_goal_id(self, future: Future) -> Any:
        """The goal id of a ``generate_async`` / ``run_policy_async`` future still waiting for its
        acceptance (else None)."""
        return self._sent_goal_ids.get(id(future))

    def run_policy_ready(self) -> bool:
        """Whether the run_policy action server is up (non-blocking)."""
        return bool(self._run_policy.server_is_ready())

    def run_policy_async(self, *, feedback: Callable[[Any], None] | None = None, **fields: Any) -> Future:
        """Send a RunPolicy goal without waiting (check ``run_policy_ready`` first); resolves to a goal handle."""
        goal = RunPolicy.Goal(lease_s=self.leases.lease_s, owner=self.owner)
        for key, value in fields.items():
            if not hasattr(goal, key):
                raise ValueError(f"run_policy: unknown goal field {key!r}")
            setattr(goal, key, value)
        return self._send_goal(self._run_policy, goal, feedback)

    def forget_goal(self, goal: Any) -> None:
        """A goal ended (or was rejected, or its acceptance was lost): stop delivering its
        feedback (late pieces are dropped) and stop renewing its lease.

        ``goal``: its goal handle, or its goal id (a goal whose acceptance never arrived)."""
        goal_id = getattr(goal, "goal_id", goal)
        self._feedback_callbacks.pop(bytes(goal_id.uuid), None)
        self.leases.release(goal_id)

    def _on_feedback(self, msg: Any) -> None:
        callback = self._feedback_callbacks.get(bytes(msg.goal_id.uuid))
        if callback is not None:
            callback(msg.feedback)

    def generate(self, prompt: str, *, timeout_s: float = 600.0, wait_s: float = 10.0,
                 feedback: Callable[[Any], None] | None = None, feedback_grace_s: float = 5.0,
                 **fields: Any) -> GenerateOutcome:
        """Run one goal to its result; on KeyboardInterrupt cancel it first (see _cancel).

        Feedback and result travel on different topics, so the last feedback
        can arrive after the result. Once the result is in, this waits up to
        ``feedback_grace_s`` for the feedback of every token it reports
        (``feedback_complete`` says whether all came); ``result.text`` is the
        whole text in any case, so a caller that printed pieces can print the rest.
        """
        received: set[int] = set()

        def on_feedback(fb: Any) -> None:
            if int(fb.index) in received:
                return
            received.add(int(fb.index))
            if feedback is not None:
                feedback(fb)

        handle, wrapped = self._goal_result(
            "generate", self.generate_async(prompt, feedback=on_feedback, wait_s=wait_s, **fields),
            wait_s, timeout_s)
        if wrapped is None:
            return GenerateOutcome(result=None, accepted=False, status=0)
        expected = len(wrapped.result.token_ids)
        complete = self._wait_until(lambda: len(received) >= expected, feedback_grace_s)
        self.forget_goal(handle)
        return GenerateOutcome(result=wrapped.result, accepted=True, status=wrapped.status,
                               feedback_complete=complete)

    def _goal_result(self, action: str, sent: Future, wait_s: float, timeout_s: float) -> tuple[Any, Any]:
        """(goal handle, wrapped result) of a sent goal; (handle, None) when it was rejected.

        Ctrl-C while waiting cancels the goal first (its final result rides on the
        KeyboardInterrupt as ``.result``); no result within ``timeout_s`` cancels it too."""
        handle = self._wait(sent, wait_s)
        if handle is None:
            # Never re-sent: it may have been accepted. Cancel it by its id in case it was.
            goal_id = self._sent_goal_ids.get(id(sent))
            sent.cancel()
            if goal_id is not None:
                self.forget_goal(goal_id)
            cancelled = goal_id is not None and self._wait(self.cancel_goal_id(goal_id, action), wait_s) is not None
            raise ServiceCallError(
                f"{action}: no answer to the goal request within {wait_s:.1f} s (TIMEOUT); not re-sent, "
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
        while (left := deadline - time.monotonic()) > 0:
            answered = next((f for f in futures if f.done()), None)
            if answered is not None:
                return answered.result()
            if asking.due(handle.status, time.monotonic()):
                futures.append(handle.get_result_async())
            self._wait_any(futures, min(left, 0.2))
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

    def _cancel(self, handle: Any, wait_s: float) -> Any:
        """Cancel a goal and return its final result (the node stops at a committed boundary)."""
        if self._wait(handle.cancel_goal_async(), wait_s) is None:
            return None
        wrapped = self.wait_result(handle, wait_s)
        return wrapped.result if wrapped is not None else None

    # --- status, RunPolicy, parameters -------------------------------------
    def watch_status(self, callback: Callable[[Any], None]) -> Any:
        """Call ``callback(EngineStatus)`` for every ``~/status`` message (the latched last one first)."""
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        from flashrt_ros.msg import EngineStatus
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        return self.node.create_subscription(EngineStatus, f"{self.namespace}/status", callback, latched)

    def status(self, timeout_s: float = 10.0) -> Any:
        """The node's latest ``~/status`` (EngineStatus); ServiceCallError if none arrives in time."""
        got: list[Any] = []
        sub = self.watch_status(got.append)
        try:
            if not self._wait_until(lambda: bool(got), timeout_s):
                raise ServiceCallError(f"no {self.namespace}/status message within {timeout_s:.1f} s "
                                       "(is the node running, and on the same ROS_DOMAIN_ID?)", TIMEOUT_CODE)
            return got[-1]
        finally:
            self.node.destroy_subscription(sub)

    def run_policy(self, *, max_steps: int = 0, max_duration_s: float = 0.0, session: str = "",
                   rollback_on_cancel: bool = False, feedback: Callable[[Any], None] | None = None,
                   wait_s: float = 10.0, timeout_s: float = 1e6,
                   feedback_grace_s: float = 5.0, **goal_fields: Any) -> RunPolicyOutcome:
        """Run one RunPolicy goal to its result; on KeyboardInterrupt cancel it first (see _cancel).

        ``goal_fields``: the goal's other fields (``stale_timeout_s``, ``lease_s``, ``owner``).
        ``feedback`` gets each step's feedback once (the node sends one per step; here they
        arrive through our own subscription, so none is lost to the result arriving first),
        and every ``waiting`` message (``fb.state == "waiting"``: what the goal waits for).
        """
        if not self._wait_until(self.run_policy_ready, wait_s):
            raise ServiceCallError(
                f"action {self.namespace}/run_policy not available after {wait_s:.1f} s "
                "(is a policy node running, and on the same ROS_DOMAIN_ID?)", TIMEOUT_CODE)
        seen: set[int] = set()

        def on_feedback(fb: Any) -> None:
            if fb.state == "waiting":
                if feedback is not None:
                    feedback(fb)
            elif int(fb.steps) not in seen:
                seen.add(int(fb.steps))
                if feedback is not None:
                    feedback(fb)

        sent = self.run_policy_async(feedback=on_feedback, max_steps=int(max_steps),
                                     max_duration_s=float(max_duration_s), session=session,
                                     rollback_on_cancel=bool(rollback_on_cancel), **goal_fields)
        handle, wrapped = self._goal_result("run_policy", sent, wait_s, timeout_s)
        if wrapped is None:
            return RunPolicyOutcome(result=None, accepted=False, status=0)
        self._wait_until(lambda: len(seen) >= wrapped.result.steps, feedback_grace_s)
        self.forget_goal(handle)
        return RunPolicyOutcome(result=wrapped.result, accepted=True, status=wrapped.status,
                                feedback_count=len(seen))

    def get_parameters(self, names: list[str], timeout_s: float = 10.0) -> dict[str, Any]:
        """``{name: Python value}`` of the node's parameters (ServiceCallError for an unknown one)."""
        from rcl_interfaces.msg import ParameterType
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python
        values: dict[str, Any] = {}
        unknown: list[str] = []
        for name in names:       # one name per request: rclpy answers an undeclared one with no value
            answer = self._call_node_service(GetParameters, "get_parameters",
                                             GetParameters.Request(names=[name]), timeout_s).values
            if not answer or answer[0].type == ParameterType.PARAMETER_NOT_SET:
                unknown.append(name)
            else:
                values[name] = parameter_value_to_python(answer[0])
        if unknown:
            raise ServiceCallError(f"{self.namespace} has no parameter {', '.join(unknown)} "
                                   "(or it is unset)", 1, response=unknown)
        return values

    def set_parameter(self, name: str, value: Any, timeout_s: float = 10.0) -> None:
        """Set one parameter; ServiceCallError with the node's reason if it refuses."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter
        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        response = self._call_node_service(SetParameters, "set_parameters", request, timeout_s)
        result = response.results[0]
        if not result.successful:
            raise ServiceCallError(f"set {name} refused: {result.reason}", 1, response)

    def _call_node_service(self, srv_type: type, name: str, request: Any, timeout_s: float) -> Any:
        """Call one of the node's own rcl_interfaces services (idempotent requests only).

        A fresh client's first request can be answered before the server has matched the
        client's response reader, and that answer is lost; so an unanswered request is sent
        again after 2, 4, 8 ... s, within ``timeout_s``."""
        client = self.node.create_client(srv_type, f"{self.namespace}/{name}", qos_profile=SERVICE_QOS)
        try:
            if not self._wait_until(client.service_is_ready, timeout_s):
                raise ServiceCallError(f"service {self.namespace}/{name} not available after "
                                       f"{timeout_s:.1f} s (is the node running, and on the same "
                                       "ROS_DOMAIN_ID?)", TIMEOUT_CODE)
            deadline, window, response, sent = time.monotonic() + timeout_s, 2.0, None, 0
            while response is None and (left := deadline - time.monotonic()) > 0:
                future = client.call_async(request)
                sent += 1
                response = self._wait(future, min(window, left))
                if response is None:
                    client.remove_pending_request(future)
                window *= 2
            if response is None:
                seen = "still advertised" if client.service_is_ready() else "no longer advertised"
                raise ServiceCallError(f"{self.namespace}/{name}: no response within {timeout_s:.1f} s "
                                       f"(TIMEOUT; sent {sent} times, the service is {seen})", TIMEOUT_CODE)
            return response
        finally:
            self.node.destroy_client(client)

    # --- Ctrl-C ---------------------------------------------------------
    @contextlib.contextmanager
    def sigint_at_safe_points(self) -> Iterator[None]:
        """Ctrl-C (and SIGTERM) as a KeyboardInterrupt raised only by our own waits, between spin slices.

        Python raises it wherever the main thread is, rclpy's executor and action
        client included: landing there it can leave a task half-run or a request
        half-registered, and the cancel that follows the interrupt could then
        wait for good. Here the signal only marks it; a second signal before the
        next slice raises at once (for a stuck wait). SIGTERM takes the same
        orderly path (running goals are cancelled first) and raises ``Terminated``,
        so a CLI killed by a supervisor or ``timeout`` leaves no goal behind.
        Main thread only (signal handlers live there). A signal the process was
        started with ignored (a job started with ``&`` without job control) stays
        ignored, as Python itself leaves it.
        """
        def on_signal(signum: int, frame: Any) -> None:
            if self._signal_pending is not None:
                raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
            self._signal_pending = signum

        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, on_signal)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._signal_pending = None

    def raise_if_interrupted(self) -> None:
        """Raise the KeyboardInterrupt (``Terminated`` for SIGTERM) that ``sigint_at_safe_points``
        deferred, if any: a safe point."""
        signum, self._signal_pending = self._signal_pending, None
        if signum is not None:
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    # --- plumbing -------------------------------------------------------
    def _wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``condition`` (spinning our node if we own its executor) until true or timeout."""
        self._decide_executor()
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            self.raise_if_interrupted()
            if self._own_executor is not None:
                self._own_executor.spin_once(timeout_sec=0.05)
            else:
                time.sleep(0.01)
        self.raise_if_interrupted()
        return condition()

    def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Spin (if we own the executor) until ``condition()`` or the timeout; e.g. for watch_status."""
        return self._wait_until(condition, timeout_s)

    def close(self) -> None:
        """Shut down the executor this client made for itself, if any; call before destroying the node.

        Why: teardown in the order rclpy expects (executor, then node, then context), as
        ``flashrt bt run`` does, instead of leaving the executor to the garbage collector."""
        self.leases.close()
        if self._recovery_timer is not None:
            self.node.destroy_timer(self._recovery_timer)
            self._recovery_timer = None
        if self._own_executor is not None:
            self._own_executor.shutdown()
            self._own_executor = None

    def _decide_executor(self) -> None:
        """On the first wait: spin our node ourselves unless an executor already owns it."""
        if not self._decided:
            self._decided = True
            if self.node.executor is None:
                self._own_executor = SingleThreadedExecutor()
                self._own_executor.add_node(self.node)

    def _wait(self, future: Future, timeout_s: float) -> Any:
        """Wait for a future whether or not another thread spins our node."""
        self._wait_any([future], timeout_s)
        return future.result() if future.done() else None

    def _wait_any(self, futures: list[Future], timeout_s: float) -> None:
        """Wait until one of ``futures`` is done or ``timeout_s`` passed (spinning our node if we own it)."""
        self._decide_executor()
        deadline = time.monotonic() + timeout_s
        if self._own_executor is not None:
            # Short slices: a KeyboardInterrupt is raised between them, not after timeout_s.
            while not any(f.done() for f in futures) and (left := deadline - time.monotonic()) > 0:
                self.raise_if_interrupted()
                self._own_executor.spin_once(timeout_sec=min(left, 0.05))
        else:
            done = threading.Event()
            for f in futures:
                f.add_done_callback(lambda _f: done.set())
            while not done.is_set() and (left := deadline - time.monotonic()) > 0:
                self.raise_if_interrupted()
                done.wait(min(left, 0.05))
        self.raise_if_interrupted()
