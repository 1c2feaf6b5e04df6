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
  the first reply to any copy counts. A goal is never re-sent: if its
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
"""
from __future__ import annotations

import enum
import threading
import time
import weakref
from typing import Any, Callable

from flashrt_ros.client import ResultAsking, resend_times, retry_safe
from flashrt_ros.runtime.errors import ErrorCode

#: what rclpy and the client raise for a field of the wrong type or range (a tree's bad port value)
_BAD_FIELD = (ValueError, TypeError, AssertionError)
#: Capsule services answer in milliseconds, but one waits up to the node's boundary_timeout_s
#: (5 s by default) for a boundary, and a loaded machine adds its own delays: a deadline of a
#: few seconds failed healthy trees. Retry-safe requests are re-sent meanwhile (see above).
DEFAULT_TIMEOUT_S = 15.0
SETTLE_TIMEOUT_S = 30.0     # a halted goal that has not reported by then is given up on


class Progress(enum.Enum):
    """A request's state as a tree sees it (front-ends map it to their status type)."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


def describe_failure(verb: str, code: int, message: str) -> str:
    """``"<verb> failed (<ERROR_NAME>): <message>"``: what a tree shows for a refused request."""
    try:
        tag = f" ({ErrorCode(code).name})" if code else ""
    except ValueError:
        tag = f" (error {code})"
    return f"{verb} failed{tag}: {message}"


def _tagged(code: int, message: str) -> str:
    """``message`` with the error code's name, unless it already says it."""
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return message if not code or name in message else f"{message} (error {name})"


# --- halted goals, per client (or per halt scope) -----------------------------------------------
_halted: "weakref.WeakKeyDictionary[Any, list[GoalRequest]]" = weakref.WeakKeyDictionary()


class HaltScope:
    """Shared by clients whose requests wait for each other's halted goals (``client.halt_scope``)."""


def _scope(client: Any) -> Any:
    return getattr(client, "halt_scope", None) or client


def unsettled_goals(client: Any) -> int:
    """How many goals halted through ``client`` (or its halt scope) have not reported their result yet."""
    return len(_halted.get(_scope(client), ()))


def halted_goals_settled(client: Any) -> bool:
    """True once every goal halted through ``client`` (or its halt scope) has reported its result
    (or was given up)."""
    goals = _halted.get(_scope(client))
    if not goals:
        return True
    goals[:] = [g for g in goals if not g.settled()]
    return not goals


# --- one service request -----------------------------------------------------------------------
class ServiceRequest:
    """One service call in flight: sent by the first ``poll()``, never waited on."""

    def __init__(self, client: Any, verb: str, fields: dict[str, Any] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.client, self.verb, self.fields, self.timeout_s = client, verb, dict(fields or {}), timeout_s
        self.futures: list[Any] = []       # the request and its re-sent copies (retry-safe verbs only)
        self.sent_at: float | None = None
        self.deadline: float | None = None
        self.response: Any = None
        self.message = ""
        self.error_code = 0
        self._resends = resend_times(timeout_s) if retry_safe(verb, self.fields) else []

    @property
    def future(self) -> Any:
        """The first request's future (None before it is sent)."""
        return self.futures[0] if self.futures else None

    def poll(self) -> Progress:
        """RUNNING while pending; SUCCESS/FAILURE once answered, refused or timed out."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
        if not self.futures:
            settled = halted_goals_settled(self.client)
            if not settled or not self.client.wait_for(self.verb, 0.0):   # 0: a readiness check, no sleep
                if now < self.deadline:
                    return Progress.RUNNING
                why = ("a halted goal did not report its result" if not settled
                       else "service not available")
                return self._fail(ErrorCode.TIMEOUT, f"{self.verb}: {why} within {self.timeout_s:g} s")
            try:
                self.futures.append(self.client.call_async(self.verb, **self.fields))
            except Exception as exc:  # noqa: BLE001 - e.g. a field rclpy refuses: a FAILURE, never a raise
                return self._fail(ErrorCode.INVALID_ARGUMENT if isinstance(exc, _BAD_FIELD)
                                  else ErrorCode.INTERNAL, f"{self.verb}: {type(exc).__name__}: {exc}")
            self.sent_at = now
        answered = next((f for f in self.futures if f.done() and not f.cancelled()), None)
        if answered is not None:
            self._forget_others(answered)
            return self._outcome(answered)
        if all(f.cancelled() for f in self.futures):   # an rclpy future that was cancelled never becomes done
            return self._fail(ErrorCode.CANCELLED, f"{self.verb}: request cancelled")
        if now >= self.deadline:
            self.halt()
            sent = f", sent {len(self.futures)} times" if len(self.futures) > 1 else (
                "" if retry_safe(self.verb, self.fields) else "; not re-sent: it may have been applied")
            return self._fail(ErrorCode.TIMEOUT,
                              f"{self.verb}: no response within {self.timeout_s:g} s (error TIMEOUT{sent})")
        if self._resends and now - self.sent_at >= self._resends[0]:
            self._resends.pop(0)                       # a lost reply: send the same request again
            self.futures.append(self.client.call_async(self.verb, **self.fields))
        return Progress.RUNNING

    def halt(self) -> None:
        """Stop waiting for the response (the server may still apply the request)."""
        self._forget_others(None)

    def _forget_others(self, keep: Any) -> None:
        for f in self.futures:
            if f is not keep and not f.done():
                f.cancel()
                _forget_pending(self.client, self.verb, f)

    @property
    def pending(self) -> bool:
        return any(not f.done() and not f.cancelled() for f in self.futures)

    def _outcome(self, future: Any) -> Progress:
        exc = future.exception()
        if exc is not None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: {type(exc).__name__}: {exc}")
        self.response = future.result()
        if self.response is None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: empty response")
        success, code, message = response_status(self.response)
        if not success:
            return self._fail(code, describe_failure(self.verb, code, message))
        self.error_code, self.message = 0, message
        return Progress.SUCCESS

    def _fail(self, code: int, message: str) -> Progress:
        self.error_code, self.message = int(code), _tagged(code, message)
        return Progress.FAILURE


def response_status(response: Any) -> tuple[bool, int, str]:
    """(success, error code, message) of a flashrt response, or of rclpy's SetParameters answer
    (``results[]``: a refused parameter is INVALID_ARGUMENT with the node's reason)."""
    results = getattr(response, "results", None)
    if results is not None and not hasattr(response, "success"):
        refused = [r.reason for r in results if not r.successful]
        if refused:
            return False, int(ErrorCode.INVALID_ARGUMENT), "; ".join(refused)
        return True, 0, "set"
    return bool(response.success), int(getattr(response, "error_code", 0) or 0), response.message


def _forget_pending(client: Any, verb: str, future: Any) -> None:
    """Drop an abandoned request from the rclpy client's pending table (else it leaks)."""
    forget = getattr(client, "forget", None)      # test doubles may not have it
    if forget is not None:
        forget(verb, future)


# --- one action goal ---------------------------------------------------------------------------
def _action_calls(client: Any, action: str, fields: dict[str, Any],
                  on_feedback: Callable[[Any], None] | None) -> tuple[Callable[[], bool], Callable[[], Any]]:
    """(is the server ready?, send the goal) for ``action`` on ``client``."""
    if action == "run_policy":
        return client.run_policy_ready, lambda: client.run_policy_async(feedback=on_feedback, **fields)
    if action == "generate":
        rest = {k: v for k, v in fields.items() if k != "prompt"}
        return client.generate_ready, lambda: client.generate_async(fields.get("prompt", ""),
                                                                    feedback=on_feedback, **rest)
    raise ValueError(f"unknown action {action!r} (run_policy or generate)")


class GoalRequest:
    """One action goal (``run_policy`` or ``generate``) from send to result; ``halt()`` cancels it.

    ``answer_timeout_s`` bounds the wait for the server and for the goal's
    acceptance (so does ``timeout_s`` where it is shorter); ``timeout_s`` (0:
    none) bounds the whole goal, after which it is cancelled and FAILS with
    TIMEOUT. ``result`` holds the action's result.

    Lost replies: a goal is never re-sent (it may have been accepted). One whose
    acceptance has not arrived within the answer bound is cancelled by its goal
    id, in case it runs all the same; later requests then wait only for the
    node's answer to that cancel. A result reply that may have been lost is
    asked for again as ``client.ResultAsking`` says (read-only).
    """

    def __init__(self, client: Any, action: str, fields: dict[str, Any] | Callable[[], dict | None] | None = None,
                 *, timeout_s: float = 0.0, answer_timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_feedback: Callable[[Any], None] | None = None) -> None:
        self.client, self.action = client, action
        self.fields: dict[str, Any] | None = None
        # A callable is read when the goal is sent (after any halted goal settled); None: nothing to run.
        self._fields = fields if callable(fields) else (lambda f=dict(fields or {}): f)
        self._user_feedback = on_feedback
        self.waiting_for = ""           # RunPolicy: what the goal waits for (its latest waiting feedback)
        self.timeout_s, self.answer_timeout_s = timeout_s, answer_timeout_s
        self._ready = _action_calls(client, action, {}, None)[0]
        self.started: float | None = None
        self.goal_future: Any = None
        self.goal_id: Any = None        # known while the acceptance is awaited (None from test doubles)
        self.handle: Any = None
        self.result_future: Any = None  # the get-result request that answered (else the first one)
        self.result_futures: list[Any] = []
        self.result: Any = None
        self.goal_status = 0            # action_msgs/GoalStatus of the finished goal
        self.message = ""
        self.error_code = 0
        self._cancel_sent = False
        self._cancel_lock = threading.Lock()     # the tick's settled() and the acceptance callback
        self._halted_at: float | None = None
        self._result_asking: ResultAsking | None = None
        self._acceptance_lost = False
        self._id_cancel: Any = None     # the cancel-by-id request of a goal whose acceptance was lost

    def _on_feedback(self, feedback: Any) -> None:
        """Each feedback message (from the executor): keeps ``waiting_for`` current, then the caller's."""
        if getattr(feedback, "state", "") == "waiting":
            self.waiting_for = f"{feedback.waiting_for} (for {feedback.waiting_s:.1f} s)"
        else:
            self.waiting_for = ""
        if self._user_feedback is not None:
            self._user_feedback(feedback)

    @property
    def answer_limit_s(self) -> float:
        """How long the server and the goal's acceptance may take."""
        return min(self.answer_timeout_s, self.timeout_s) if self.timeout_s else self.answer_timeout_s

    def poll(self) -> Progress:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        waited = now - self.started
        if self.goal_future is None:
            settled = halted_goals_settled(self.client)
            if not settled or not self._ready():
                if waited < self.answer_limit_s:
                    return Progress.RUNNING
                why = "a halted goal did not report its result" if not settled else "action server not available"
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: {why} within {self.answer_limit_s:g} s")
            self.fields = self._fields()
            if self.fields is None:
                self.error_code, self.message = 0, f"{self.action}: nothing left to run"
                return Progress.SUCCESS
            try:
                self.goal_future = _action_calls(self.client, self.action, self.fields, self._on_feedback)[1]()
            except Exception as exc:  # noqa: BLE001 - e.g. a goal field rclpy refuses
                return self._fail(ErrorCode.INVALID_ARGUMENT if isinstance(exc, _BAD_FIELD)
                                  else ErrorCode.INTERNAL, f"{self.action}: {type(exc).__name__}: {exc}")
            sent_goal_id = getattr(self.client, "sent_goal_id", None)      # test doubles may lack it
            self.goal_id = sent_goal_id(self.goal_future) if sent_goal_id is not None else None
        if self.handle is None:
            if not self.goal_future.done():
                if waited < self.answer_limit_s:
                    return Progress.RUNNING
                self.halt()                # acceptance lost: cancelled by its id (see settled)
                what = ("a cancel by its id was sent in case it was accepted" if self._id_cancel is not None
                        else "its id is unknown, so it could not be cancelled")
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: goal not answered within "
                                                     f"{self.answer_limit_s:g} s (not re-sent; {what})")
            self.handle = self.goal_future.result()
            if self.handle is None or not self.handle.accepted:
                self._forget_goal()
                return self._fail(ErrorCode.BUSY, f"{self.action}: goal rejected (another goal is running, "
                                                  "or the node is not active with the right engine)")
            self._ask_result(now)
        wrapped = self._answered_result(now)
        if wrapped is None:
            if self.timeout_s and waited >= self.timeout_s:
                self.halt()
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: no result within {self.timeout_s:g} s "
                                                     "(goal cancelled)")
            return Progress.RUNNING
        self.result, self.goal_status = wrapped.result, int(getattr(wrapped, "status", 0))
        if not self.result.success:
            code = int(self.result.error_code)
            return self._fail(code, describe_failure(self.action, code, self.result.message))
        self.error_code, self.message = 0, self.result.message
        return Progress.SUCCESS

    def halt(self) -> None:
        """Cancel the goal (at the node's next committed boundary); later requests wait for its result."""
        if self._halted_at is not None or self.goal_future is None:
            return
        if any(f.done() for f in self.result_futures):
            return
        self._halted_at = time.monotonic()
        self.settled()                     # sends the cancel now if the goal was already accepted
        if not self.goal_future.done():    # ... else the moment it is accepted, ticked or not
            self.goal_future.add_done_callback(self._cancel_when_accepted)
        _halted.setdefault(_scope(self.client), []).append(self)

    def settled(self) -> bool:
        """For a halted goal: has it reported its result (a cancel is sent once it is accepted)?

        One whose acceptance did not arrive within the answer bound is cancelled
        by its id instead, and counts as settled once the node answered that cancel.
        """
        now = time.monotonic()
        if self._halted_at is not None and now - self._halted_at > SETTLE_TIMEOUT_S:
            return True                    # the node is gone or stuck; the next request's timeout says so
        if self._acceptance_lost:
            return self._id_cancel is None or self._id_cancel.done()
        if not self.goal_future.done():
            if self.started is not None and now - self.started >= self.answer_limit_s:
                self._cancel_by_id()
                return self._id_cancel is None or self._id_cancel.done()
            return False
        if self.handle is None:
            self.handle = self.goal_future.result()
        if self.handle is None or not self.handle.accepted:
            self._forget_goal()
            return True
        if not self.result_futures:
            self._ask_result(now)
        wrapped = self._answered_result(now)
        if wrapped is None:
            self._send_cancel(self.handle)
        return wrapped is not None

    def _cancel_when_accepted(self, future: Any) -> None:
        """Done callback of a goal halted before its acceptance arrived: cancel it once accepted."""
        if future.cancelled() or future.exception() is not None:
            return                         # cancelled by its id (acceptance lost), or never sent
        handle = future.result()
        if handle is not None and handle.accepted:
            self._send_cancel(handle)

    def _send_cancel(self, handle: Any) -> None:
        """Ask the node to cancel the goal, once (the tick and the executor may both get here)."""
        with self._cancel_lock:
            if self._cancel_sent:
                return
            self._cancel_sent = True
        handle.cancel_goal_async()

    @property
    def cancel_sent(self) -> bool:
        return self._cancel_sent

    def _cancel_by_id(self) -> None:
        """The goal's acceptance never arrived: it may run all the same, so cancel it by its id."""
        self._acceptance_lost = True
        self.goal_future.cancel()
        self._forget_goal()
        if self.goal_id is not None:
            self._id_cancel = self.client.cancel_goal_id(self.goal_id, action=self.action)
            self._cancel_sent = True

    def _forget_goal(self) -> None:
        """The goal ended (or its acceptance was lost): the client drops its feedback callback and
        stops renewing its lease."""
        forget = getattr(self.client, "forget_goal", None)     # test doubles may lack it
        goal = self.handle if self.handle is not None else self.goal_id
        if forget is not None and goal is not None:
            forget(goal)

    def _ask_result(self, now: float) -> None:
        if self._result_asking is None:
            self._result_asking = ResultAsking(now)
        self.result_futures.append(self.handle.get_result_async())
        if self.result_future is None:
            self.result_future = self.result_futures[0]

    def _answered_result(self, now: float) -> Any:
        """The wrapped result once a get-result request answered, else None (re-asking after a lost reply)."""
        answered = next((f for f in self.result_futures if f.done()), None)
        if answered is not None:
            self.result_future = answered
            self._forget_goal()
            return answered.result()
        if self._result_asking.due(getattr(self.handle, "status", 0), now):   # a reply may be lost
            self._ask_result(now)
        return None

    def reported_steps(self) -> int | None:
        """Steps a finished run_policy goal kept (0 if it was rolled back); None before its result."""
        if self.result_future is None or not self.result_future.done():
            return None
        result = self.result_future.result().result
        return 0 if result.rolled_back else int(result.steps)

    def _fail(self, code: int, message: str) -> Progress:
        self.error_code, self.message = int(code), _tagged(code, message)
        return Progress.FAILURE


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


def run_policy_fields(max_steps: int, max_duration_s: float, session: str, rollback_on_cancel: bool,
                      budget: StepBudget | None) -> dict[str, Any] | Callable[[], dict[str, Any] | None]:
    """A RunPolicy goal's fields; with a budget, read at send time (None: no step left to run)."""
    def fields(steps: int) -> dict[str, Any]:
        return dict(max_steps=int(steps), max_duration_s=float(max_duration_s), session=session,
                    rollback_on_cancel=bool(rollback_on_cancel))
    if budget is None or not max_steps:
        return fields(max_steps)

    def at_send() -> dict[str, Any] | None:
        steps = budget.steps_to_send(int(max_steps))
        return fields(steps) if steps > 0 else None
    return at_send


# --- the node's ~/status, for condition nodes --------------------------------------------------
class StatusWatch:
    """The latest ``~/status`` of one node (transient-local: the last message arrives on subscribing)."""

    def __init__(self, client: Any) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        from flashrt_ros.msg import EngineStatus
        qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                         reliability=ReliabilityPolicy.RELIABLE)
        self.latest: Any = None
        self._sub = client.node.create_subscription(EngineStatus, f"{client.namespace}/status",
                                                    self._on_status, qos)

    def _on_status(self, msg: Any) -> None:
        self.latest = msg


_watches: "weakref.WeakKeyDictionary[Any, StatusWatch]" = weakref.WeakKeyDictionary()


def status_watch(client: Any) -> StatusWatch:
    """One ``StatusWatch`` per client (created on first use)."""
    watch = _watches.get(client)
    if watch is None:
        watch = _watches[client] = StatusWatch(client)
    return watch


def check_status(status: Any, condition: str) -> tuple[bool, str]:
    """Evaluate ``condition`` (``inputs_fresh`` or ``policy_paused``) on an EngineStatus; (holds, why)."""
    if status is None:
        return False, "no ~/status received yet"
    if status.lifecycle_state != "active":
        return False, f"node is {status.lifecycle_state}"
    if status.engine_kind != "policy":
        return False, f"{condition} applies to a policy node (this one hosts {status.engine_kind})"
    if condition == "inputs_fresh":
        return status.inputs_state == "fresh", f"inputs {status.inputs_state}: {status.inputs_detail}".rstrip(": ")
    if condition == "policy_paused":
        return status.paused, "policy paused" if status.paused else "policy not paused"
    raise ValueError(f"unknown condition {condition!r} (inputs_fresh or policy_paused)")
