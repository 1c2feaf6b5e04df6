"""The RunPolicy action: run the policy loop for a bounded number of steps or time.

Why an action: a behaviour tree needs "drive with the policy until done, and
stop when I halt you" as one node. The goal runs on the control loop of
``PolicyIO`` (so inputs, the stale-data stop and outputs are the same as in
continuous mode); with ``run_mode=goal`` the loop steps *only* while a goal
runs. Ending a goal takes ``PolicyIO``'s tick lock, so a goal stops between two
committed policy steps, never inside one, and ``max_steps`` is exact.
Feedback follows the steps (coalesced if the action server lags behind).
One goal at a time; a second is rejected.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from flashrt_ros.action import RunPolicy
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.goal_capsule import GoalCapsule
from flashrt_ros.runtime.errors import InvalidArgument, NotActive


class GoalRun:
    """One goal's progress, shared with the control tick (which calls ``admit``/``stepped``)."""

    def __init__(self, max_steps: int, max_duration_s: float) -> None:
        self.max_steps = max_steps
        self.deadline = time.monotonic() + max_duration_s if max_duration_s > 0 else None
        self.steps = 0
        self.last_action: list[float] = []
        self.stop_reason = ""
        self.changed = threading.Condition()

    def admit(self) -> bool:
        """May the tick step for this goal? (called under the tick lock)"""
        if self.stop_reason:
            return False
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.finish("max_duration")
            return False
        return True

    def stepped(self, action: Any) -> None:
        with self.changed:
            self.steps += 1
            self.last_action = [float(a) for a in action.reshape(-1).tolist()]
            if self.max_steps and self.steps >= self.max_steps:
                self.stop_reason = "max_steps"
            self.changed.notify_all()

    def finish(self, reason: str) -> None:
        with self.changed:
            self.stop_reason = self.stop_reason or reason
            self.changed.notify_all()


class PolicyActionServer:
    """``~/run_policy`` on a policy node (see the module docstring)."""

    def __init__(self, node: Any, group: Any, policy_io: Callable[[], Any],
                 engine: Callable[[], Any]) -> None:
        self._node, self._policy_io, self._engine = node, policy_io, engine
        self._busy = threading.Lock()
        self._server = ActionServer(node, RunPolicy, "~/run_policy", execute_callback=self._execute,
                                    goal_callback=self._on_goal,
                                    cancel_callback=lambda _g: CancelResponse.ACCEPT,
                                    callback_group=group)

    def _on_goal(self, goal: Any) -> GoalResponse:
        if self._policy_io() is None:
            self._node.get_logger().warning("run_policy goal rejected: no active policy loop")
            return GoalResponse.REJECT
        if self._busy.locked():
            self._node.get_logger().warning("run_policy goal rejected: a goal is already running")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _execute(self, goal_handle: Any) -> Any:
        result = RunPolicy.Result()
        if not self._busy.acquire(blocking=False):
            return self._fail(goal_handle, result, InvalidArgument("a run_policy goal is already running"))
        try:
            return self._run(goal_handle, result)
        finally:
            self._busy.release()

    def _run(self, goal_handle: Any, result: Any) -> Any:
        goal = goal_handle.request
        io, engine = self._policy_io(), self._engine()
        try:
            if io is None or engine is None:
                raise NotActive("the policy node is not active")
            if goal.max_steps == 0 and goal.max_duration_s <= 0:
                raise InvalidArgument("set max_steps or max_duration_s (a goal must end by itself)")
            if goal.session:           # park the current session, make goal.session live (at a boundary)
                engine.capsules.switch_session(goal.session,
                                               timeout=self._node.get_parameter("boundary_timeout_s").value)
            capsule = (GoalCapsule(engine, self._node.get_parameter("default_tier").value)
                       if goal.rollback_on_cancel or self._node.get_parameter("rollback_on_cancel").value
                       else None)
        except Exception as exc:  # noqa: BLE001 - errors become the result
            return self._fail(goal_handle, result, exc)
        run = GoalRun(int(goal.max_steps), float(goal.max_duration_s))
        io.start_goal(run)
        reported = 0
        while True:
            with run.changed:
                if not run.stop_reason and run.steps == reported:
                    run.changed.wait(timeout=0.05)
            if run.steps != reported:
                reported = run.steps
                goal_handle.publish_feedback(RunPolicy.Feedback(steps=reported,
                                                                last_action=run.last_action))
            if goal_handle.is_cancel_requested:
                run.finish("cancelled")
            elif self._policy_io() is not io:
                run.finish("deactivated")
            if not run.stop_reason:
                run.admit()                      # ends the goal on max_duration while inputs are stale
            if run.stop_reason:
                break
        io.end_goal(run)                         # waits for an in-flight step: a committed boundary
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
