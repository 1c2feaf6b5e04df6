"""The policy on the robot's topics: sensor inputs, one engine step per tick, commands out.

Inputs (parameters, see ``robot_io_params``): any number of ``sensor_msgs/Image``
topics, one ``sensor_msgs/JointState`` or a ``std_msgs/Float32MultiArray``
(both feed ``observation.state``). Subscriptions default to the sensor-data
profile (best effort, keep last): they match best-effort cameras and
default-QoS (reliable) publishers alike. A deadline is requested only when
``qos_deadline_factor > 0``; missed deadlines are counted and logged.

One tick takes the latest sample of every input together
(``robot_io.freshness``). Stale-data stop: if any input is missing or older than
``max_observation_age_s`` (default 1.5 control periods), the policy is NOT
stepped (its state does not advance); the tick publishes ``hold_command`` (or
nothing when it is empty) and the state is reported on ``~/status`` and
``/diagnostics``; the first fresh tick steps again.

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

from builtin_interfaces.msg import Duration as DurationMsg
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_ros.models.policy_features import STATE
from flashrt_ros.robot_io.commands import command_values, trajectory_points
from flashrt_ros.robot_io.freshness import LatestInputs
from flashrt_ros.robot_io.images import image_feature
from flashrt_ros.robot_io.joints import JointSelector, state_from_array
from flashrt_ros.robot_io.policy_adapter import PolicyStepper
from flashrt_ros.ros.robot_io_params import RobotIOConfig
from flashrt_ros.runtime.errors import InvalidArgument

_RELIABILITY = {"best_effort": ReliabilityPolicy.BEST_EFFORT, "reliable": ReliabilityPolicy.RELIABLE}
_HISTORY = {"keep_last": HistoryPolicy.KEEP_LAST, "keep_all": HistoryPolicy.KEEP_ALL}
_DURABILITY = {"volatile": DurabilityPolicy.VOLATILE, "transient_local": DurabilityPolicy.TRANSIENT_LOCAL}


def input_qos(io: RobotIOConfig, depth: int, deadline_s: float) -> QoSProfile:
    qos = QoSProfile(depth=depth, history=_HISTORY[io.qos_history],
                     reliability=_RELIABILITY[io.qos_reliability],
                     durability=_DURABILITY[io.qos_durability])
    if deadline_s > 0:
        qos.deadline = Duration(seconds=deadline_s)
    return qos


class PolicyIO:
    """Owns the input subscriptions, the command publisher and the control tick."""

    def __init__(self, node: Any, engine: Any, config: Any, io: RobotIOConfig, group: Any,
                 on_inputs_change: Callable[[], None] = lambda: None) -> None:
        self._node, self._io, self._on_change = node, io, on_inputs_change
        self.stepper = PolicyStepper(engine)
        self.period_s = 1.0 / config.control_rate_hz
        max_age = io.max_observation_age_s or 1.5 * self.period_s
        self.paused = False
        self.steps = 0
        self.deadline_misses = 0
        self.inputs_state, self.inputs_detail = "stale", "no message yet"
        self.goal: Any = None                   # a RunPolicy goal run (policy_action.GoalRun)
        self._lock = threading.Lock()           # goal admission vs. goal end
        self._convert: dict[str, Callable[[Any], Any]] = {}
        self._subs: list[Any] = []

        qos = input_qos(io, config.qos_depth, config.qos_deadline_factor * self.period_s)
        events = SubscriptionEventCallbacks(deadline=self._on_deadline_missed)
        for topic, (msg_type, feature, convert) in self._input_plan().items():
            self._convert[feature] = convert
            self._subs.append(node.create_subscription(
                msg_type, topic, self._receiver(feature), qos, callback_group=group,
                event_callbacks=events if qos.deadline.nanoseconds > 0 else None))
        if hasattr(engine.policy, "write_instruction"):
            self._subs.append(node.create_subscription(
                String, "~/instruction", self._on_instruction,
                QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL), callback_group=group))
        self.inputs = LatestInputs(list(self._convert), max_age, io.sync_tolerance_s)
        self._publish = self._make_publisher()
        self._timer = node.create_timer(self.period_s, self._on_timer, callback_group=group)

    # --- inputs -----------------------------------------------------------------
    def _input_plan(self) -> dict[str, tuple[type, str, Callable[[Any], Any]]]:
        """topic -> (message type, feature, message -> tensor); every policy feature served once."""
        io, features = self._io, self.stepper.features
        plan: dict[str, tuple[type, str, Callable[[Any], Any]]] = {}
        if io.input_joint_state_topic:
            selector = JointSelector(io.input_joint_names, io.input_joint_fields)
            plan[io.input_joint_state_topic] = (JointState, STATE, lambda m: selector.select(
                m.name, {"position": m.position, "velocity": m.velocity, "effort": m.effort}))
        elif io.input_state_topic:
            plan[io.input_state_topic] = (Float32MultiArray, STATE, lambda m: state_from_array(m.data))
        names = list(io.input_image_features) or [
            "observation.images." + t.rstrip("/").rsplit("/", 1)[-1] for t in io.input_image_topics]
        if len(names) != len(io.input_image_topics):
            raise InvalidArgument(f"input_image_features names {len(names)} features for "
                                  f"{len(io.input_image_topics)} input_image_topics")
        for topic, name in zip(io.input_image_topics, names):
            spec = features.get(name)
            if spec is None or spec.kind != "image":
                raise InvalidArgument(f"image topic {topic} feeds {name!r}, which is not an image "
                                      f"feature of the policy (it has {sorted(features)})")
            plan[topic] = (Image, name, lambda m, shape=spec.shape: image_feature(
                m.data, m.height, m.width, m.step, m.encoding, shape))
        served = {feature for _t, feature, _c in plan.values()}
        if served != set(features):
            raise InvalidArgument(f"policy features {sorted(features)} but inputs serve "
                                  f"{sorted(served)}: set input_* parameters for "
                                  f"{sorted(set(features) - served)}")
        return plan

    def _receiver(self, feature: str) -> Callable[[Any], None]:
        def receive(msg: Any) -> None:
            header = getattr(msg, "header", None)
            stamp = (header.stamp.sec + header.stamp.nanosec * 1e-9
                     if header is not None and (header.stamp.sec or header.stamp.nanosec) else None)
            self.inputs.put(feature, msg, time.monotonic(), stamp)
            if self._io.control_trigger == "inputs" and self.inputs.has_new():
                self._tick()
        return receive

    def _on_instruction(self, msg: Any) -> None:
        from flashrt_ros.engine.vla import set_instruction
        try:
            set_instruction(self.stepper.engine, msg.data)
        except Exception as exc:  # noqa: BLE001 - a bad instruction must not stop the node
            self._node.get_logger().error(f"instruction refused: {exc}")

    def _on_deadline_missed(self, event: Any) -> None:
        self.deadline_misses += 1
        self._node.get_logger().warning(
            f"input deadline missed ({event.total_count} in total on one topic)",
            throttle_duration_sec=1.0)

    # --- the control tick ----------------------------------------------------------
    def _on_timer(self) -> None:
        if self._io.control_trigger == "timer":
            self._tick()
        else:                          # lock-step: inputs trigger steps, the timer watches freshness
            with self._lock:
                self._report_stale(self.inputs.take(time.monotonic(), consume=False), hold=False)

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
            if not take.ok:
                self._report_stale(take, hold=may_step)
                return
            if not may_step:
                return
            try:
                observation = {name: self._convert[name](msg) for name, msg in take.values.items()}
                action = self.stepper.step(observation)
                self._publish(action)
            except Exception as exc:  # noqa: BLE001 - bad input must not stop the loop
                self._set_inputs("error", str(exc))
                self._node.get_logger().error(f"policy step failed: {exc}", throttle_duration_sec=1.0)
                return
            self.steps += 1
            self._set_inputs("fresh", "")
            if self.goal is not None:
                self.goal.stepped(action)

    def _report_stale(self, take: Any, hold: bool) -> None:
        """A tick that may not step: report stale inputs and, if asked, publish the hold command."""
        if not take.stale:             # waiting for new samples / out of sync: not a fault
            return
        self._set_inputs("stale", take.reason)
        if hold and self._io.hold_command:
            self._publish_hold()

    def _set_inputs(self, state: str, detail: str) -> None:
        changed = state != self.inputs_state
        self.inputs_state, self.inputs_detail = state, detail
        if changed:
            log = self._node.get_logger()
            if state == "fresh":
                log.info("policy inputs fresh: stepping")
            else:
                log.warning(f"policy inputs {state}: {detail}")
            self._on_change()

    # --- outputs -------------------------------------------------------------------
    def _make_publisher(self) -> Callable[[Any], None]:
        io = self._io
        qos = QoSProfile(depth=io.output_qos_depth, reliability=_RELIABILITY[io.output_qos_reliability])
        joints = list(io.output_joint_names)
        kind = io.output_type
        if kind in ("joint_state", "joint_trajectory") and not joints:
            raise InvalidArgument(f"output_type {kind} needs output_joint_names")
        n = len(joints) or self.stepper.action_dim
        if n != self.stepper.action_dim:
            raise InvalidArgument(f"output_joint_names names {n} joints but the policy's action has "
                                  f"{self.stepper.action_dim} values")
        msg_type = {"float32_array": Float32MultiArray, "float64_array": Float64MultiArray,
                    "joint_state": JointState, "joint_trajectory": JointTrajectory}[kind]
        pub = self._node.create_publisher(msg_type, io.output_topic, qos)
        self._pub = pub
        stamp = lambda: self._node.get_clock().now().to_msg()  # noqa: E731

        def publish(action: Any, planned: Any = None) -> None:
            values = command_values(action, n)
            if kind in ("float32_array", "float64_array"):
                pub.publish(msg_type(data=values))
            elif kind == "joint_state":
                msg = JointState(name=joints, position=values)
                msg.header.stamp = stamp()
                pub.publish(msg)
            else:
                if planned is None:
                    planned = self.stepper.planned_actions()
                msg = JointTrajectory(joint_names=joints)
                msg.header.stamp = stamp()
                msg.points = [JointTrajectoryPoint(positions=p, time_from_start=_duration(t))
                              for p, t in trajectory_points(action, planned, self.period_s)]
                pub.publish(msg)
        return publish

    def _publish_hold(self) -> None:
        try:
            self._publish(self._io.hold_command, planned=())
        except InvalidArgument as exc:
            self._node.get_logger().error(f"hold_command not published: {exc}",
                                          throttle_duration_sec=5.0)

    # --- RunPolicy goals ---------------------------------------------------------------
    def start_goal(self, run: Any) -> None:
        with self._lock:
            self.goal = run

    def end_goal(self, run: Any) -> None:
        """Detach a goal; waits for a step in flight, so the goal ends at a committed boundary."""
        with self._lock:
            run.finish("ended")
            if self.goal is run:
                self.goal = None

    # --- status ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"inputs_state": self.inputs_state, "inputs_detail": self.inputs_detail,
                "policy_steps": self.steps, "deadline_misses": self.deadline_misses}

    def destroy(self) -> None:
        with self._lock:
            if self.goal is not None:
                self.goal.finish("deactivated")
        self._node.destroy_timer(self._timer)
        for sub in self._subs:
            self._node.destroy_subscription(sub)
        self._node.destroy_publisher(self._pub)


def _duration(seconds: float) -> DurationMsg:
    sec = int(seconds)
    return DurationMsg(sec=sec, nanosec=int(round((seconds - sec) * 1e9)))
