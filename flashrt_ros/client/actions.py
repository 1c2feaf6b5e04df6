"""The node's two actions as calls: ``generate`` / ``generate_async`` and ``run_policy`` /
``run_policy_async``, each run to its result (Ctrl-C cancels it first) or sent without waiting.

Feedback and result travel on different topics, so the last feedback can arrive
after the result: the blocking calls wait briefly for it, and say whether all came.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rclpy.task import Future

from flashrt_ros.client.action_client import RaceFreeActionClient
from flashrt_ros.client.core import TIMEOUT_CODE, ServiceCallError
from flashrt_ros.client.goals import GoalCalls
from flashrt_ros.interface.actions import GENERATE, RUN_POLICY


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


class ActionCalls(GoalCalls):
    """Generate and RunPolicy goals of the node."""

    def _setup_actions(self) -> None:
        self._generate = RaceFreeActionClient(self.node, GENERATE.action, f"{self.namespace}/{GENERATE.name}")
        self._run_policy = RaceFreeActionClient(self.node, RUN_POLICY.action, f"{self.namespace}/{RUN_POLICY.name}")
        self._follow_goals(((GENERATE.action, GENERATE.name, self._generate),
                            (RUN_POLICY.action, RUN_POLICY.name, self._run_policy)))

    def generate_ready(self) -> bool:
        """Whether the generate action server is up (non-blocking)."""
        return bool(self._generate.server_is_ready())

    def generate_async(self, prompt: str, *, feedback: Callable[[Any], None] | None = None,
                       wait_s: float = 10.0, **fields: Any) -> Future:
        """Send a goal (``fields``: the other goal fields of ``interface.actions.GENERATE``, their
        defaults from there); the future resolves to a ClientGoalHandle."""
        goal = GENERATE.goal_message(**{"prompt": prompt, "lease_s": self.leases.lease_s, "owner": self.owner,
                                        **fields})
        if not self._generate.server_is_ready() and not self._wait_until(self._generate.server_is_ready, wait_s):
            raise ServiceCallError(
                f"action {self.namespace}/generate not available after {wait_s:.1f} s", TIMEOUT_CODE)
        self.wait_node_active(wait_s, "generate")
        return self._send_goal(self._generate, goal, feedback)

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
        try:
            complete = self._wait_until(lambda: len(received) >= expected, feedback_grace_s)
        except KeyboardInterrupt as interrupt:
            interrupt.result = wrapped.result          # interrupted after the goal had ended
            raise
        self.forget_goal(handle)
        return GenerateOutcome(result=wrapped.result, accepted=True, status=wrapped.status,
                               feedback_complete=complete)

    def run_policy_ready(self) -> bool:
        """Whether the run_policy action server is up (non-blocking)."""
        return bool(self._run_policy.server_is_ready())

    def run_policy_async(self, *, feedback: Callable[[Any], None] | None = None, **fields: Any) -> Future:
        """Send a RunPolicy goal without waiting (check ``run_policy_ready`` first); resolves to a goal handle."""
        goal = RUN_POLICY.goal_message(**{"lease_s": self.leases.lease_s, "owner": self.owner, **fields})
        return self._send_goal(self._run_policy, goal, feedback)

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
        self.wait_node_active(wait_s, "run_policy")
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
        try:
            self._wait_until(lambda: len(seen) >= wrapped.result.steps, feedback_grace_s)
        except KeyboardInterrupt as interrupt:
            interrupt.result = wrapped.result          # interrupted after the goal had ended
            raise
        self.forget_goal(handle)
        return RunPolicyOutcome(result=wrapped.result, accepted=True, status=wrapped.status,
                                feedback_count=len(seen))
