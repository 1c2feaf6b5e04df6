"""The policy on the robot's topics: sensor inputs, one engine step per tick, commands out.

Inputs (parameters, see ``robot_io_params``; which topic feeds which feature and
how, see ``policy_inputs``): any number of camera topics (``sensor_msgs/Image``,
or ``sensor_msgs/CompressedImage`` for a topic whose name ends in
``/compressed``, as image_transport names them), one ``sensor_msgs/JointState``
or a ``std_msgs/Float32MultiArray`` (both feed ``observation.state``), and a
``std_msgs/Float32MultiArray`` for ``observation.environment_state`` (e.g. a
task's target). Subscriptions default to the sensor-data profile (best effort,
keep last): they match best-effort cameras and default-QoS (reliable)
publishers alike. A deadline is requested only when ``qos_deadline_factor > 0``;
missed deadlines are counted and logged. Activation refuses inputs that cannot
serve the policy's declared features, naming the parameter to change.

Freshness is measured at receipt, never delayed by a step: the subscriptions
live in their own callback group (a step runs in the control group), and the
receipt time is the middleware's receive timestamp from the message info where
rclpy offers it. A message whose encoding cannot be converted is refused at
receipt (so is a JointState lacking a joint of ``input_joint_names``, or an
array of the wrong length): counted (``rejected_messages`` on ``~/status``),
logged the first time per topic and reason and then at most every 10 s
(``robot_io.refusals``), and reported as ``inputs_state: error`` with
the topic and why, the same text a waiting goal reports and, past its
``stale_timeout_s``, ends with (``INPUT_REJECTED``; ``robot_io.input_verdict``).

The control loop (``control_trigger: timer``) runs on a thread of its own
(``robot_io.control_thread``: a deadline clock, SCHED_FIFO where permitted, no
GC inside a tick), not on an executor timer: nothing the executor runs can
delay a command. It publishes from that thread; a change of the inputs' state
wakes the executor (a guard condition), which publishes ``~/status``.

One tick takes the latest sample of every input together
(``robot_io.freshness``). Stale-data stop: if any input is missing or older than
``max_observation_age_s`` (default derived per input: 2.5 control periods, or
2.5 of the input's measured period when longer), the policy is NOT
stepped (its state does not advance); the tick publishes ``hold_command`` (or
nothing when it is empty) and the state is reported on ``~/status`` and
``/diagnostics``; the first fresh tick steps again. The verdict is kept current
while the loop does not step too (``run_mode: goal`` with no goal, or paused):
each tick checks the inputs without converting them.

Language instruction (vision-language-action policies, e.g. SmolVLA): a
``std_msgs/String`` on ``~/instruction`` (reliable, transient local, depth 1) is
tokenised with the checkpoint's tokenizer and becomes the instruction at the
next boundary (``flashrt_ros.engine.vla``); a refused one is logged and changes
nothing.

Outputs: ``std_msgs/Float32MultiArray`` (default ``~/action``),
``std_msgs/Float64MultiArray`` (ros2_control forward command controller),
``sensor_msgs/JointState`` or ``trajectory_msgs/JointTrajectory`` (the action plus
the rest of the policy's planned chunk, one control period apart).

No tensor math here: ``flashrt_ros.robot_io`` converts.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.subscription import Subscription
from std_msgs.msg import String

from flashrt_ros.engine.replan_choice import ReplanWatch
from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.robot_io.command_stats import CommandGaps
from flashrt_ros.robot_io.refusals import InputRefusals
from flashrt_ros.robot_io import input_verdict
from flashrt_ros.robot_io.freshness import LatestInputs
from flashrt_ros.robot_io.input_verdict import InputVerdict
from flashrt_ros.ros.control_clock import ControlClock
from flashrt_ros.ros.policy_inputs import (input_plan, input_qos, one_error, problems_of,
                                          receipt_time)
from flashrt_ros.ros.policy_outputs import command_publisher
from flashrt_ros.runtime.errors import InvalidArgument

#: rclpy passes the message info (with the middleware's receive time) to two-argument callbacks
#: since Iron; on Humble a callback gets the message only.
_MESSAGE_INFO = hasattr(Subscription, "CallbackType")


class PolicyTopics:
    """Owns the input subscriptions, the command publisher and the control tick."""

    def __init__(self, node: Any, engine: Any, config: Any, io: RobotIOConfig, group: Any,
                 on_inputs_change: Callable[[], None] = lambda: None) -> None:
        self._node, self._io = node, io
        self.engine = engine                    # the node's PolicyEngine: features, step, planned actions
        self.action_dim = int(engine.policy.action_dim)
        self.period_s = 1.0 / config.control_rate_hz
        self.paused = False
        self.steps = 0
        self.deadline_misses = 0
        self.inputs_state, self.inputs_detail = "stale", "no message yet"
        self.goal: Any = None                   # a RunPolicy goal run (policy_action.GoalRun)
        self._lock = threading.Lock()           # goal admission vs. goal end
        self.refusals = InputRefusals(node.get_logger().error)       # refused input messages: count, why, log
        self.gaps = CommandGaps()                                    # gaps between published commands
        replan = getattr(engine, "replan", None)
        self._replan_watch = (ReplanWatch(self.period_s) if getattr(replan, "may_switch", False) else None)
        self._convert: dict[str, tuple[str, Callable[[Any], Any]]] = {}   # topic -> (feature, convert)
        self._subs: list[Any] = []
        # refuses inputs that cannot serve the policy, and outputs that cannot take its action, all
        # problems in one error; keyed by the resolved topic names, so that a stale input is named
        # as a user finds it (/robot1/flashrt/observation, not ~/observation)
        problems: list[str] = []
        plan: dict[str, Any] = {}
        try:
            plan = {node.resolve_topic_name(topic): route
                    for topic, route in input_plan(io, engine.features).items()}
        except InvalidArgument as exc:
            problems += problems_of(exc)
        try:
            self._pub, self._publish = command_publisher(node, io, self.action_dim, self.period_s,
                                                         lambda: self.engine.planned_actions())
        except InvalidArgument as exc:
            problems.append(str(exc))
        try:
            self.inputs = LatestInputs(list(plan) or ["(none)"], io.max_observation_age_s,   # keyed by topic
                                       io.sync_tolerance_s, control_period_s=self.period_s,
                                       ceiling_s=io.max_observation_age_ceiling_s)
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise one_error(problems)
        # ~/status on a change of the inputs' state is published by the executor, never by the control thread
        self._status_changed = node.create_guard_condition(on_inputs_change, callback_group=group)

        # Receipt is never queued behind a step: the inputs have a group of their own.
        self._input_group = MutuallyExclusiveCallbackGroup()
        qos = input_qos(io, config.qos_depth, config.qos_deadline_factor * self.period_s)
        events = SubscriptionEventCallbacks(deadline=self._on_deadline_missed)
        for topic, (msg_type, feature, convert, problem) in plan.items():
            self._convert[topic] = (feature, convert)
            self._subs.append(node.create_subscription(
                msg_type, topic, self._receiver(topic, problem), qos,
                callback_group=self._input_group,
                event_callbacks=events if qos.deadline.nanoseconds > 0 else None))
        if hasattr(engine.policy, "write_instruction"):
            self._subs.append(node.create_subscription(
                String, "~/instruction", self._on_instruction,
                QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL), callback_group=group))
        # timer: the control loop on its own thread; inputs: the inputs step, a timer watches freshness
        self._clock = ControlClock(node, self.period_s, io, group, self._tick, self._on_timer)

    # --- inputs -----------------------------------------------------------------
    def _receiver(self, topic: str, problem: Callable[[Any], str | None]) -> Callable[..., None]:
        def receive(msg: Any, info: Any = None) -> None:
            received = receipt_time(info)
            reason = problem(msg)
            if reason:
                self.refusals.refuse(topic, reason)
                return
            self.refusals.accepted(topic)
            header = getattr(msg, "header", None)
            stamp = (header.stamp.sec + header.stamp.nanosec * 1e-9
                     if header is not None and (header.stamp.sec or header.stamp.nanosec) else None)
            self.inputs.put(topic, msg, received, stamp)
            if self._io.control_trigger == "inputs" and self.inputs.has_new():
                self._tick()
        if _MESSAGE_INFO:
            return lambda msg, info: receive(msg, info)
        return lambda msg: receive(msg)

    def _on_instruction(self, msg: Any) -> None:
        from flashrt_ros.engine.vla import set_instruction
        try:
            set_instruction(self.engine, msg.data)
        except Exception as exc:  # noqa: BLE001 - a bad instruction must not stop the node
            self._node.get_logger().error(f"instruction refused: {exc}")

    def _on_deadline_missed(self, event: Any) -> None:
        self.deadline_misses += 1
        self._node.get_logger().warning(
            f"input deadline missed ({event.total_count} in total on one topic)",
            throttle_duration_sec=1.0)

    # --- the control tick ----------------------------------------------------------
    def _on_timer(self) -> None:
        """Lock-step (``control_trigger: inputs``): inputs trigger steps, the timer watches freshness."""
        with self._lock:
            take = self.inputs.take(time.monotonic(), consume=False, require_new=True)
            if take.ok:
                if self._idle:
                    self._set_inputs(input_verdict.FRESH)     # idle, inputs ready: say so
                return
            verdict = self._not_ready(take)
            if self.goal is not None and not self.paused:
                self.goal.waiting(verdict.detail if verdict else take.reason,
                                  verdict.cause if verdict else "stale")
            if verdict is not None:
                self._set_inputs(verdict)

    @property
    def _idle(self) -> bool:
        """The loop does not step now: paused, or ``run_mode: goal`` with no goal."""
        return self.paused or (self.goal is None and self._io.run_mode != "continuous")

    def _may_step(self) -> bool:
        if self.paused:
            return False
        goal = self.goal
        if goal is not None:
            return goal.admit()
        return self._io.run_mode == "continuous"

    def _tick(self) -> None:
        with self._lock:
            may_step = self._may_step()
            take = self.inputs.take(time.monotonic(), consume=may_step,
                                    require_new=self._io.control_trigger == "inputs")
            mark = self._clock.mark
            mark(2)
            if not take.ok:
                verdict = self._not_ready(take)
                if may_step and self.goal is not None:
                    self.goal.waiting(verdict.detail if verdict else take.reason,
                                      verdict.cause if verdict else "stale")
                if verdict is not None:            # None: waiting for new samples, not a fault
                    self._set_inputs(verdict)
                    if may_step and self._io.hold_command:
                        self._publish_hold()
                return
            if not may_step:                       # idle or paused: the inputs are fresh all the same
                self.gaps.idle()
                self._set_inputs(input_verdict.FRESH)
                return
            observation, refused = self._observation(take.values)
            mark(3)
            if refused:
                self._set_inputs(input_verdict.rejected(refused))
                if self.goal is not None:
                    self.goal.waiting(self.inputs_detail, "rejected")
                return
            try:
                replans = self.engine.next_step_replans() if self._replan_watch is not None else None
                began = time.perf_counter()
                action = self.engine.step(observation)
                mark(4)
                self._publish(action)
                self.gaps.published(time.monotonic())
                mark(5)
                self._watch_replans(replans, time.perf_counter() - began)
            except Exception as exc:  # noqa: BLE001 - a failing step must not stop the loop
                self._set_inputs(input_verdict.step_failed(exc))   # logged once per reason
                if self.goal is not None:
                    self.goal.waiting(self.inputs_detail, "step_failed")
                return
            self.steps += 1
            self._set_inputs(input_verdict.FRESH, stepping=True)
            if self.goal is not None:
                self.goal.stepped(action)

    def _watch_replans(self, replanned: bool | None, took_s: float) -> None:
        """``replan: auto`` that chose sync: switch to planning beside the loop once replanning steps cost the rate
        (``engine.replan_choice.ReplanWatch``); here, between two steps, the switch runs at once."""
        if self._replan_watch is None:
            return
        reason = self._replan_watch.observe(replanned, took_s)
        if reason:
            self._replan_watch = None
            try:
                self.engine.switch_replan(reason)
                self._node.get_logger().warning(f"replan {reason}")
            except Exception as exc:  # noqa: BLE001 - the loop goes on planning in the step
                self._node.get_logger().error(f"replan auto could not switch to async: {exc}")

    def _observation(self, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The policy's observation from the taken messages, and ``{topic: why}`` for messages that
        passed the receipt check but cannot be converted (e.g. an image's data shorter than its size)."""
        observation: dict[str, Any] = {}
        refused: dict[str, str] = {}
        for topic, (feature, convert) in self._convert.items():
            try:
                observation[feature] = convert(values[topic])
            except InvalidArgument as exc:
                self.refusals.refuse(topic, str(exc))
                refused[topic] = str(exc)
        return observation, refused

    def _not_ready(self, take: Any) -> InputVerdict | None:
        """The verdict on a take that may not step; None while it only waits for new samples."""
        if not take.stale:
            return None
        return input_verdict.not_ready(take.stale, take.reason, self.refusals.reasons())

    def _set_inputs(self, verdict: InputVerdict, stepping: bool = False) -> None:
        """Record the inputs' verdict; log and publish ~/status only when it changes (an error
        also when its reason changes), never once per tick."""
        state, detail = verdict.state, verdict.detail
        changed = state != self.inputs_state or (state == "error" and detail != self.inputs_detail)
        self.inputs_state, self.inputs_detail = state, detail
        if changed:
            log = self._node.get_logger()
            if state == "fresh":
                log.info("policy inputs fresh" + (": stepping" if stepping else ""))
            elif state == "error":
                log.error(f"policy inputs error: {detail}")
            else:
                log.warning(f"policy inputs {state}: {detail}")
            self._status_changed.trigger()

    # --- outputs -------------------------------------------------------------------
    def hold(self) -> None:
        """Publish ``hold_command`` once (a goal ended with nobody to decide: its client is gone)."""
        if self._io.hold_command:
            self._publish_hold()

    def _publish_hold(self) -> None:
        try:
            self._publish(self._io.hold_command, planned=())
            self.gaps.published(time.monotonic())
        except InvalidArgument as exc:
            self._node.get_logger().error(f"hold_command not published: {exc}",
                                          throttle_duration_sec=5.0)

    # --- RunPolicy goals ---------------------------------------------------------------
    def start_goal(self, run: Any) -> None:
        """Attach a goal. Lock-step (``control_trigger: inputs``): inputs that arrived while no
        goal ran and were never stepped on are stepped on now; otherwise a ``run_mode: goal``
        loop with a simulator that waits for a command would never start again."""
        with self._lock:
            self.goal = run
        if self._io.control_trigger == "inputs" and self.inputs.has_new():
            self._tick()

    def state_replaced(self) -> None:
        """The policy's state was restored, reset, rolled back or switched (at a boundary): with
        ``inputs_after_restore: discard`` the inputs held now no longer count as new."""
        if self._io.inputs_after_restore == "discard":
            self.inputs.discard_pending()

    def end_goal(self, run: Any) -> None:
        """Detach a goal; waits for a step in flight, so the goal ends at a committed boundary. A chunk
        still being planned beside the loop is dropped: nothing planned before a goal's end reaches
        the robot after it."""
        with self._lock:
            run.finish("ended")
            if self.goal is run:
                self.goal = None
        self.drop_pending_plan()

    def drop_pending_plan(self) -> None:
        """Forget a chunk planned beside the loop and not merged yet (a halt or a pause)."""
        drop = getattr(self.engine, "drop_pending", None)
        if drop is not None:
            drop()

    # --- status ----------------------------------------------------------------------
    @property
    def steps_continuously(self) -> bool:
        """The loop steps without a goal (``run_mode: continuous``, not paused)."""
        return self._io.run_mode == "continuous" and not self.paused

    def status(self) -> dict[str, Any]:
        limits = self.inputs.limits()
        out = {"paused": self.paused, "inputs_state": self.inputs_state, "inputs_detail": self.inputs_detail,
               "policy_steps": self.steps, "deadline_misses": self.deadline_misses,
               "rejected_messages": self.refusals.count, "command_gap_max_ms": round(self.gaps.max_ms, 2),
               "command_gap_p99_ms": round(self.gaps.p99_ms(), 2),
               "max_observation_age_s": round(max(limits.values()), 4),
               "input_age_limits_s": {topic: round(v, 4) for topic, v in limits.items()},
               "input_periods_s": {topic: round(v, 4) for topic, v in self.inputs.periods().items()}}
        return {**out, **self._clock.status()}

    def destroy(self) -> None:
        self._clock.stop(self.engine)
        with self._lock:
            if self.goal is not None:
                self.goal.finish("deactivated")
        self._node.destroy_guard_condition(self._status_changed)
        for sub in self._subs:
            self._node.destroy_subscription(sub)
        self._node.destroy_publisher(self._pub)
