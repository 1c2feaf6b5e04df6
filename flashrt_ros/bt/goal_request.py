"""One action goal from a tree, from send to result; ``halt()`` cancels it, and later requests of
the same client (or halt scope) wait until a halted goal has reported its result (see ``requests.py``)."""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable

from flashrt_ros.bt.progress import BAD_FIELD, DEFAULT_TIMEOUT_S, Progress, describe_failure, tagged
from flashrt_ros.client import ResultAsking
from flashrt_ros.interface.errors import ErrorCode

SETTLE_TIMEOUT_S = 30.0     # a halted goal that has not reported by then is given up on


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

    Lost replies: a goal is never sent under a new id (it may have been accepted);
    the client sends a request that nothing answers or lists again under the
    goal's own id (``client.goals``). One whose
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
            active = getattr(self.client, "node_active", lambda: None)()   # None: not heard (test doubles too)
            if not settled or not self._ready() or active is False:
                if waited < self.answer_limit_s:
                    return Progress.RUNNING
                if active is False and settled and self._ready():
                    state = self.client.node_watch.heard().lifecycle_state or "starting"
                    return self._fail(ErrorCode.NOT_ACTIVE, f"{self.action}: node {self.client.namespace} is {state}, "
                                                            f"not active, after {self.answer_limit_s:g} s")
                why = "a halted goal did not report its result" if not settled else "action server not available"
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: {why} within {self.answer_limit_s:g} s")
            self.fields = self._fields()
            if self.fields is None:
                self.error_code, self.message = 0, f"{self.action}: nothing left to run"
                return Progress.SUCCESS
            try:
                self.goal_future = _action_calls(self.client, self.action, self.fields, self._on_feedback)[1]()
            except Exception as exc:  # noqa: BLE001 - e.g. a goal field rclpy refuses
                return self._fail(ErrorCode.INVALID_ARGUMENT if isinstance(exc, BAD_FIELD)
                                  else ErrorCode.INTERNAL, f"{self.action}: {type(exc).__name__}: {exc}")
            sent_goal_id = getattr(self.client, "sent_goal_id", None)      # test doubles may lack it
            self.goal_id = sent_goal_id(self.goal_future) if sent_goal_id is not None else None
        gone = self._node_gone()
        if gone:
            self._forget_goal()
            return self._fail(ErrorCode.NODE_GONE, f"{self.action}: {gone}")
        if self.handle is None:
            if not self.goal_future.done():
                if waited < self.answer_limit_s:
                    return Progress.RUNNING
                self.halt()                # acceptance lost: cancelled by its id (see settled)
                what = ("a cancel by its id was sent in case it was accepted" if self._id_cancel is not None
                        else "its id is unknown, so it could not be cancelled")
                return self._fail(ErrorCode.TIMEOUT, f"{self.action}: goal not answered within "
                                                     f"{self.answer_limit_s:g} s (never sent under a new id; {what})")
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

    def _node_gone(self) -> str | None:
        """Why the goal's node can no longer answer (it died or restarted: ``client.node_watch``), or None."""
        gone = getattr(self.client, "goal_node_gone", None)          # test doubles may lack it
        if gone is None or any(f.done() for f in self.result_futures):
            return None
        goal_id = self.handle.goal_id if self.handle is not None else self.goal_id
        return gone(goal_id)

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
        self.error_code, self.message = int(code), tagged(code, message)
        return Progress.FAILURE
