"""The RunPolicy action: run the policy loop for a bounded number of steps or time.

Why an action: a behaviour tree needs "drive with the policy until done, and
stop when I halt you" as one node. The goal runs on the control loop of
``PolicyTopics`` (so inputs, the stale-data stop and outputs are the same as in
continuous mode); with ``run_mode=goal`` the loop steps *only* while a goal
runs. Ending a goal takes ``PolicyTopics``'s tick lock, so a goal stops between two
committed policy steps, never inside one, and ``max_steps`` is exact.
Feedback: exactly one ``step`` message per step, in order (``steps`` counts 1,
2, ...), the last one published before the result, so a goal that reports
``steps = N`` sent N step messages (a step in flight when a cancel arrives is
finished and reported too); while the goal cannot step (inputs stale, missing,
in error) ``waiting`` messages say what for, at most one a second.

A goal never outlives its client or waits silently: with ``lease_s`` it ends
(``LEASE_EXPIRED``, the hold command published) once its client stops renewing
it (``goals.GoalBook``); after ``stale_timeout_s`` without a step it ends with the
code of why, in the words ``~/status`` used (``robot_io.input_verdict``):
``STALE_INPUTS`` (inputs missing, old, out of sync), ``INPUT_REJECTED`` (their
messages refused: an encoding, a JointState lacking joints) or ``INTERNAL`` (the
policy step raised). One goal at a time: a second is
accepted and aborted at once with ``BUSY`` and a message naming the running goal
and its owner (a rejection could carry no reason).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from flashrt_ros.action import RunPolicy
from flashrt_ros.interface.goals import GOAL_RETENTION_S, goal_id_hex
from flashrt_ros.interface.node_params import NodeConfig
from flashrt_ros.interface.qos import FEEDBACK_QOS
from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.robot_io.input_verdict import STOP_REASONS
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.goal_capsule import GoalCapsule
from flashrt_ros.ros.goals import GoalBook, RunningGoal
from flashrt_ros.ros.parameters import read_config
from flashrt_ros.runtime.errors import (Busy, FlashRTError, InputRejected, InvalidArgument, LeaseExpired,
                                        NotActive, StaleInputs)
from flashrt_ros.runtime.errors import ErrorCode

#: A goal that cannot step says so after this long, then once per ``WAITING_REPORT_S``.
WAITING_FIRST_REPORT_S = 0.5
WAITING_REPORT_S = 1.0
#: Stop reasons that end a goal with an error (the others succeed, or are a client's cancel).
_FAILED_STOPS = {"lease_expired": LeaseExpired, "stale_inputs": StaleInputs, "input_rejected": InputRejected,
                 "step_failed": FlashRTError}


class GoalRun:
    """One goal's progress, shared with the control tick (which calls ``admit``/``stepped``/``waiting``)."""

    def __init__(self, max_steps: int, max_duration_s: float, lease: RunningGoal | None = None,
                 stale_timeout_s: float = 0.0) -> None:
        self.max_steps = max_steps
        self.deadline = time.monotonic() + max_duration_s if max_duration_s > 0 else None
        self.lease = lease
        self.stale_timeout_s = stale_timeout_s          # <= 0: wait for ever
        self.steps = 0
        self.last_action: list[float] = []
        self.unreported: list[tuple[int, list[float]]] = []    # (steps, action) not yet sent as feedback
        self.waiting_since: float | None = None          # monotonic; None while the goal steps
        self.waiting_for = ""
        self.waiting_cause = "stale"                     # a key of input_verdict.STOP_REASONS
        self.stop_reason = ""
        self.stop_detail = ""
        self.changed = threading.Condition()

    def admit(self) -> bool:
        """May the tick step for this goal? (called under the tick lock, before every step)"""
        if self.stop_reason:
            return False
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.finish("max_duration")
            return False
        if self.lease is not None and self.lease.lease_expired(now):
            self.finish("lease_expired", f"its client did not renew the goal's {self.lease.lease_s:g} s lease "
                                         "(the client died, hangs, or does not send heartbeats)")
            return False
        return True

    def stepped(self, action: Any) -> None:
        with self.changed:
            self.steps += 1
            self.last_action = [float(a) for a in action.reshape(-1).tolist()]
            self.unreported.append((self.steps, self.last_action))
            self.waiting_since, self.waiting_for = None, ""
            if self.max_steps and self.steps >= self.max_steps:
                self.stop_reason = "max_steps"
            self.changed.notify_all()

    def waiting(self, what: str, cause: str = "stale") -> None:
        """A tick that may step for this goal could not (``what``: why, in the words of ~/status;
        ``cause``: stale | rejected | step_failed, which decides the code the goal may end with)."""
        with self.changed:
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
            self.waiting_for, self.waiting_cause = what, cause

    def waited_too_long(self, now: float) -> bool:
        """Past the stale bound: ends the goal with the stop reason of why it waited (stale_inputs, ...)."""
        with self.changed:
            since, what, cause = self.waiting_since, self.waiting_for, self.waiting_cause
        if since is None or self.stale_timeout_s <= 0 or now - since < self.stale_timeout_s:
            return False
        self.finish(STOP_REASONS.get(cause, "stale_inputs"),
                    f"no policy step for {now - since:.1f} s (stale_timeout_s {self.stale_timeout_s:g} s): {what}")
        return True

    def take_unreported(self) -> list[tuple[int, list[float]]]:
        """The steps taken since the last call, for feedback (one entry per step)."""
        with self.changed:
            taken, self.unreported = self.unreported, []
            return taken

    def finish(self, reason: str, detail: str = "") -> None:
        with self.changed:
            if not self.stop_reason:
                self.stop_reason, self.stop_detail = reason, detail
            self.changed.notify_all()


class PolicyActionServer:
    """``~/run_policy`` on a policy node (see the module docstring)."""

    def __init__(self, node: Any, group: Any, policy_io: Callable[[], Any], engine: Callable[[], Any],
                 goals: GoalBook, shutting_down: Callable[[], bool] = lambda: False) -> None:
        self._node, self._policy_io, self._engine = node, policy_io, engine
        self._goals, self._shutting_down = goals, shutting_down
        self._busy = threading.Lock()
        self._server = ActionServer(node, RunPolicy, "~/run_policy", execute_callback=self._execute,
                                    goal_callback=self._on_goal,
                                    cancel_callback=lambda _g: CancelResponse.ACCEPT,
                                    feedback_pub_qos_profile=FEEDBACK_QOS.profile(), callback_group=group,
                                    result_timeout=GOAL_RETENTION_S)   # a late copy of a goal never runs twice

    def _on_goal(self, goal: Any) -> GoalResponse:
        if self._policy_io() is None:
            self._node.get_logger().warning("run_policy goal rejected: no active policy loop")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT           # a second goal is aborted with BUSY, naming the first

    def _execute(self, goal_handle: Any) -> Any:
        result = RunPolicy.Result()
        if not self._busy.acquire(blocking=False):
            running = self._goals.running("run_policy")
            who = running.describe() if running is not None else "another goal"
            return self._fail(goal_handle, result, Busy(
                f"a run_policy goal is already running: {who}; end it with `flashrt cancel "
                f"{running.goal_id if running is not None else '--all'}`"))
        lease = self._goals.begin("run_policy", goal_id_hex(goal_handle.goal_id.uuid),
                                  goal_handle.request.owner, goal_handle.request.lease_s)
        try:
            return self._run(goal_handle, result, lease)
        finally:
            self._goals.end(lease)
            self._busy.release()

    def _stale_timeout(self, goal: Any) -> float:
        """The goal's bound on waiting for fresh inputs (0: the node's default; < 0: none)."""
        if goal.stale_timeout_s:
            return float(goal.stale_timeout_s)
        return read_config(self._node, RobotIOConfig).goal_stale_timeout_s

    def _run(self, goal_handle: Any, result: Any, lease: RunningGoal) -> Any:
        goal = goal_handle.request
        io, engine = self._policy_io(), self._engine()
        try:
            if io is None or engine is None:
                raise NotActive("the policy node is not active")
            if goal.max_steps == 0 and goal.max_duration_s <= 0:
                raise InvalidArgument("set max_steps or max_duration_s (a goal must end by itself)")
            if goal.lease_s < 0:
                raise InvalidArgument(f"lease_s must be >= 0 (0: no lease), got {goal.lease_s:g}")
            config, io_config = read_config(self._node, NodeConfig, check=False), read_config(self._node, RobotIOConfig)
            tier = config.default_tier
            take_capsule = bool(goal.rollback_on_cancel or io_config.rollback_on_cancel)
            # goal.session made live and the start capsule taken at one boundary: if the capsule
            # is refused (no room), the switch is undone and nothing changed
            capsule = engine.capsules.enter_session(
                goal.session, lambda: GoalCapsule(engine, tier) if take_capsule else None,
                timeout=config.boundary_timeout_s)
        except Exception as exc:  # noqa: BLE001 - errors become the result
            return self._fail(goal_handle, result, exc)
        run = GoalRun(int(goal.max_steps), float(goal.max_duration_s),
                      lease if goal.lease_s > 0 else None, self._stale_timeout(goal))
        io.start_goal(run)
        reported_wait = 0.0              # how long the goal had waited at the last waiting feedback

        def report() -> None:
            nonlocal reported_wait
            for steps, action in run.take_unreported():
                goal_handle.publish_feedback(RunPolicy.Feedback(state="step", steps=steps, last_action=action))
                reported_wait = 0.0
            since = run.waiting_since
            waited = time.monotonic() - since if since is not None else 0.0
            lease.steps, lease.state = run.steps, (f"waiting: {run.waiting_for}" if since is not None
                                                   else "stepping")
            if since is not None and waited >= max(WAITING_FIRST_REPORT_S, reported_wait + WAITING_REPORT_S):
                reported_wait = waited
                goal_handle.publish_feedback(RunPolicy.Feedback(
                    state="waiting", steps=run.steps, last_action=run.last_action,
                    waiting_for=run.waiting_for, waiting_s=waited))

        while True:
            with run.changed:
                if not run.stop_reason and not run.unreported:
                    run.changed.wait(timeout=0.05)
            report()
            if goal_handle.is_cancel_requested:
                run.finish("cancelled")
            elif self._shutting_down():
                run.finish("shutdown")
            elif self._policy_io() is not io:
                run.finish("deactivated")
            if not run.stop_reason:
                run.admit()                      # ends the goal on max_duration or an expired lease
            if not run.stop_reason:
                run.waited_too_long(time.monotonic())
            if run.stop_reason:
                break
        io.end_goal(run)                         # waits for an in-flight step: a committed boundary
        report()                                 # that step too: step feedback count == result.steps
        if run.stop_reason in ("lease_expired", "shutdown"):
            io.hold()                            # no client (or no node) to decide: hold the robot
        result.steps, result.stop_reason = run.steps, run.stop_reason
        if capsule is not None:
            try:
                if run.stop_reason == "cancelled":
                    capsule.restore()
                    result.rolled_back = True
                else:
                    capsule.discard()
            except Exception as exc:  # noqa: BLE001
                return self._fail(goal_handle, result, exc)
        failure = _FAILED_STOPS.get(run.stop_reason)
        if failure is not None or run.stop_reason == "shutdown":
            error = (failure(f"run_policy goal ended after {run.steps} steps: {run.stop_detail}")
                     if failure is not None else
                     FlashRTError(f"run_policy goal ended after {run.steps} steps: the node is shutting down",
                                  ErrorCode.CANCELLED))
            self._node.get_logger().warning(str(error))
            conv.fill_error(result, error)
            goal_handle.abort()
            return result
        conv.fill_ok(result, f"{run.steps} steps, stop: {run.stop_reason}"
                     + (", rolled back to the goal's start" if result.rolled_back else ""))
        if run.stop_reason == "cancelled":
            goal_handle.canceled()
        elif run.stop_reason == "deactivated":
            goal_handle.abort()
        else:
            goal_handle.succeed()
        return result

    def _fail(self, goal_handle: Any, result: Any, exc: BaseException) -> Any:
        conv.fill_error(result, exc, self._node.get_logger())
        result.stop_reason = "error"
        goal_handle.abort()
        return result

    def destroy(self) -> None:
        self._server.destroy()
