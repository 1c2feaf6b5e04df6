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
* **Halt stops at a committed boundary.** Halting a service request abandons it
  (a request already delivered may still be applied: services cannot be
  recalled). Halting a goal cancels it: the node stops between two committed
  steps and, with ``rollback_on_cancel``, restores the state the goal started
  from. Until that cancelled goal has reported its result, every later request
  of the same client waits (RUNNING, bounded by its own timeout), so the next
  node of the tree acts on the boundary the goal stopped at, never on a state
  the cancel has not settled yet.
"""
from __future__ import annotations

import enum
import time
import weakref
from typing import Any, Callable

from flashrt_ros.runtime.errors import ErrorCode

DEFAULT_TIMEOUT_S = 2.0     # capsule services answer in milliseconds; a second is already generous
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


# --- halted goals, per client ------------------------------------------------------------------
_halted: "weakref.WeakKeyDictionary[Any, list[GoalRequest]]" = weakref.WeakKeyDictionary()


def halted_goals_settled(client: Any) -> bool:
    """True once every goal halted through ``client`` has reported its result (or was given up)."""
    goals = _halted.get(client)
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
        self.future: Any = None
        self.deadline: float | None = None
        self.response: Any = None
        self.message = ""
        self.error_code = 0

    def poll(self) -> Progress:
        """RUNNING while pending; SUCCESS/FAILURE once answered, refused or timed out."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
        if self.future is None:
            settled = halted_goals_settled(self.client)
            if not settled or not self.client.wait_for(self.verb, 0.0):   # 0: a readiness check, no sleep
                if now < self.deadline:
                    return Progress.RUNNING
                why = ("a halted goal did not report its result" if not settled
                       else "service not available")
                return self._fail(ErrorCode.TIMEOUT, f"{self.verb}: {why} within {self.timeout_s:g} s")
            self.future = self.client.call_async(self.verb, **self.fields)
        if self.future.cancelled():          # an rclpy future that was cancelled never becomes done
            return self._fail(ErrorCode.CANCELLED, f"{self.verb}: request cancelled")
        if self.future.done():
            return self._outcome()
        if now >= self.deadline:
            self.halt()
            return self._fail(ErrorCode.TIMEOUT, f"{self.verb}: no response within {self.timeout_s:g} s")
        return Progress.RUNNING

    def halt(self) -> None:
        """Stop waiting for the response (the server may still apply the request)."""
        if self.future is not None and not self.future.done():
            self.future.cancel()
            forget = getattr(self.client, "forget", None)      # drop it from rclpy's pending table
            if forget is not None:
                forget(self.verb, self.future)

    @property
    def pending(self) -> bool:
        return self.future is not None and not self.future.done() and not self.future.cancelled()

    def _outcome(self) -> Progress:
        exc = self.future.exception()
        if exc is not None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: {type(exc).__name__}: {exc}")
        self.response = self.future.result()
        if self.response is None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: empty response")
        if not self.response.success:
            code = int(getattr(self.response, "error_code", 0) or 0)
            return self._fail(code, describe_failure(self.verb, code, self.response.message))
        self.error_code, self.message = 0, self.response.message
        return Progress.SUCCESS

    def _fail(self, code: int, message: str) -> Progress:
        self.error_code, self.message = int(code), _tagged(code, message)
        return Progress.FAILURE


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
    acceptance; ``timeout_s`` (0: none) bounds the whole goal, after which it is
    cancelled and FAILS with TIMEOUT. ``result`` holds the action's result.
    """

    def __init__(self, client: Any, action: str, fields: dict[str, Any] | None = None, *,
                 timeout_s: float = 0.0, answer_timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_feedback: Callable[[Any], None] | None = None) -> None:
        self.client, self.action, self.fields = client, action, dict(fields or {})
        self.timeout_s, self.answer_timeout_s = timeout_s, answer_timeout_s
        self._ready, self._send = _action_calls(client, action, self.fields, on_feedback)
        self.started: float | None = None
        self.goal_future: Any = None
        self.handle: Any = None
        self.result_future: Any = None
        self.result: Any = None
        self.goal_status = 0            # action_msgs/GoalStatus of the finished goal
        self.message = ""
        self.error_code = 0
        self._cancel_sent = False
        self._halted_at: float | None = None

    def poll(self) -> Progress:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        waited = now - self.started
        if self.goal_future is None:
            settled = halted_goals_settled(self.client)
            if not settled or not self._ready():
                if waited < self.answer_timeout_s:
                    return Progress.RUNNING
                why = "a halted goal did not report its result" if not settled else "action server not available"
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: {why} within {self.answer_timeout_s:g} s")
            self.goal_future = self._send()
        if self.handle is None:
            if not self.goal_future.done():
                if waited < self.answer_timeout_s:
                    return Progress.RUNNING
                self.halt()
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: goal not answered within "
                                                     f"{self.answer_timeout_s:g} s")
            self.handle = self.goal_future.result()
            if self.handle is None or not self.handle.accepted:
                return self._fail(ErrorCode.BUSY, f"{self.action}: goal rejected (another goal is running, "
                                                  "or the node is not active with the right engine)")
            self.result_future = self.handle.get_result_async()
        if not self.result_future.done():
            if self.timeout_s and waited >= self.timeout_s:
                self.halt()
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: no result within {self.timeout_s:g} s "
                                                     "(goal cancelled)")
            return Progress.RUNNING
        wrapped = self.result_future.result()
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
        if self.result_future is not None and self.result_future.done():
            return
        self._halted_at = time.monotonic()
        self.settled()                     # sends the cancel now if the goal was already accepted
        _halted.setdefault(self.client, []).append(self)

    def settled(self) -> bool:
        """For a halted goal: has it reported its result (a cancel is sent once it is accepted)?"""
        if self._halted_at is not None and time.monotonic() - self._halted_at > SETTLE_TIMEOUT_S:
            return True                    # the node is gone or stuck; the next request's timeout says so
        if not self.goal_future.done():
            return False
        handle = self.goal_future.result()
        if handle is None or not handle.accepted:
            return True
        if self.result_future is None:
            self.result_future = handle.get_result_async()
        if not self._cancel_sent and not self.result_future.done():
            handle.cancel_goal_async()
            self._cancel_sent = True
        return self.result_future.done()

    @property
    def cancel_sent(self) -> bool:
        return self._cancel_sent

    def _fail(self, code: int, message: str) -> Progress:
        self.error_code, self.message = int(code), _tagged(code, message)
        return Progress.FAILURE


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
        return not status.busy, "policy paused" if not status.busy else "policy running"
    raise ValueError(f"unknown condition {condition!r} (inputs_fresh or policy_paused)")
