"""Parameters of the robot I/O (policy topics, QoS, stale-data stop, RunPolicy, rollback).

Why a second table beside ``parameters.PARAMS``: these are read when the policy
loop starts (activate), several are string/number arrays, and they belong to
one concept (what the policy node reads and writes on the robot's topics). The
node declares them all at start-up so ``-p`` overrides and YAML files apply.
Declaring, checking and documenting them is ``parameters.py``'s, as for ``PARAMS``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rclpy.exceptions import ParameterUninitializedException

from flashrt_ros.ros.parameters import ParamDef, check_value
from flashrt_ros.ros.parameters import markdown_table as parameters_table

OUTPUT_TYPES = ("float32_array", "float64_array", "joint_state", "joint_trajectory")

ROBOT_IO_PARAMS: tuple[ParamDef, ...] = (
    ParamDef("input_state_topic", "~/observation", "std_msgs/Float32MultiArray feeding "
             "observation.state (ignored when input_joint_state_topic is set; empty = none).", True),
    ParamDef("input_joint_state_topic", "", "sensor_msgs/JointState feeding observation.state "
             "(empty = none).", True),
    ParamDef("input_joint_names", [], "Joints (in policy order) taken from the JointState; a "
             "listed joint missing from a message is an error.", True, array_of=str),
    ParamDef("input_joint_fields", ["position"], "JointState fields concatenated into "
             "observation.state, field-major (position, velocity, effort).", True, array_of=str),
    ParamDef("input_environment_state_topic", "", "std_msgs/Float32MultiArray feeding "
             "observation.environment_state (e.g. a task target; empty = none).", True),
    ParamDef("input_image_topics", [], "Camera topics: sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, "
             "mono8, mono16, yuv422_yuy2/yuyv, uyvy/yuv422), or sensor_msgs/CompressedImage (JPEG/PNG) "
             "for a topic ending in /compressed; resized (aspect kept) and centre-cropped to the "
             "policy's image feature.", True, array_of=str),
    ParamDef("input_image_features", [], "Policy feature per image topic (default "
             "observation.images.<last topic segment>, /compressed not counted).", True, array_of=str),
    ParamDef("qos_reliability", "best_effort", "Reliability of the input subscriptions: best_effort "
             "(sensor-data profile: matches every publisher) or reliable.", True,
             choices=("best_effort", "reliable")),
    ParamDef("qos_history", "keep_last", "History of the input subscriptions (depth: qos_depth).",
             True, choices=("keep_last", "keep_all")),
    ParamDef("qos_durability", "volatile", "Durability of the input subscriptions.", True,
             choices=("volatile", "transient_local")),
    ParamDef("output_qos_reliability", "reliable", "Reliability of the command publisher "
             "(reliable reaches reliable and best-effort subscribers).", True,
             choices=("best_effort", "reliable")),
    ParamDef("output_qos_depth", 10, "History depth of the command publisher.", True,
             int_range=(1, 1000)),
    ParamDef("max_observation_age_s", 0.0, "An input older than this stops the policy (0 = 1.5 "
             "control periods).", True, float_range=(0.0, 3600.0)),
    ParamDef("sync_tolerance_s", 0.0, "Largest spread of the stamps of one tick's inputs (header "
             "stamp, else receipt time; 0 = no check).", True, float_range=(0.0, 3600.0)),
    ParamDef("hold_command", [], "Command published on every stale tick (empty = publish "
             "nothing).", True, array_of=float),
    ParamDef("control_trigger", "timer", "timer: step at control_rate_hz on the latest inputs; "
             "inputs: step once per new set of inputs (lock-step with a simulator).", True,
             choices=("timer", "inputs")),
    ParamDef("output_type", "float32_array", "Command message type.", True, choices=OUTPUT_TYPES),
    ParamDef("output_topic", "~/action", "Command topic (ros2_control: /<controller>/commands or "
             "/<controller>/joint_trajectory).", True),
    ParamDef("output_joint_names", [], "Commanded joints (names for JointState / "
             "JointTrajectory; for arrays, checks the action size).", True, array_of=str),
    ParamDef("run_mode", "continuous", "continuous: the policy steps whenever active and not "
             "paused; goal: only while a RunPolicy goal runs.", True, choices=("continuous", "goal")),
    ParamDef("rollback_on_cancel", False, "A cancelled Generate or RunPolicy goal restores the "
             "capsule taken when the goal was accepted. Settable live: read when a goal starts "
             "(RunPolicy goals can also ask for it themselves)."),
    ParamDef("inputs_after_restore", "keep", "keep: after a restore, reset, rollback or session switch the "
             "policy steps on the inputs it already holds (the world went on); discard: only on inputs that "
             "arrive after it (a lock-step world restored too publishes its restored observation).", True,
             choices=("keep", "discard")),
    ParamDef("goal_stale_timeout_s", 10.0, "A RunPolicy goal that could not step for this long "
             "(inputs missing, stale, out of sync or in error) ends with STALE_INPUTS (INPUT_REJECTED when "
             "their messages were refused), naming what it waited for (0 = wait for ever). Settable live: read when a goal starts; a goal's own "
             "stale_timeout_s overrides it.", float_range=(0.0, 86400.0)),
)


_DEFAULTS: dict[str, Any] = {p.name: tuple(p.default) if p.array_of is not None else p.default
                             for p in ROBOT_IO_PARAMS}


@dataclass(frozen=True)
class RobotIOConfig:
    """Typed view of ``ROBOT_IO_PARAMS`` (arrays as tuples); every default is the table's."""

    input_state_topic: str = _DEFAULTS["input_state_topic"]
    input_joint_state_topic: str = _DEFAULTS["input_joint_state_topic"]
    input_joint_names: tuple[str, ...] = _DEFAULTS["input_joint_names"]
    input_joint_fields: tuple[str, ...] = _DEFAULTS["input_joint_fields"]
    input_environment_state_topic: str = _DEFAULTS["input_environment_state_topic"]
    input_image_topics: tuple[str, ...] = _DEFAULTS["input_image_topics"]
    input_image_features: tuple[str, ...] = _DEFAULTS["input_image_features"]
    qos_reliability: str = _DEFAULTS["qos_reliability"]
    qos_history: str = _DEFAULTS["qos_history"]
    qos_durability: str = _DEFAULTS["qos_durability"]
    output_qos_reliability: str = _DEFAULTS["output_qos_reliability"]
    output_qos_depth: int = _DEFAULTS["output_qos_depth"]
    max_observation_age_s: float = _DEFAULTS["max_observation_age_s"]
    sync_tolerance_s: float = _DEFAULTS["sync_tolerance_s"]
    hold_command: tuple[float, ...] = _DEFAULTS["hold_command"]
    control_trigger: str = _DEFAULTS["control_trigger"]
    output_type: str = _DEFAULTS["output_type"]
    output_topic: str = _DEFAULTS["output_topic"]
    output_joint_names: tuple[str, ...] = _DEFAULTS["output_joint_names"]
    run_mode: str = _DEFAULTS["run_mode"]
    rollback_on_cancel: bool = _DEFAULTS["rollback_on_cancel"]
    inputs_after_restore: str = _DEFAULTS["inputs_after_restore"]
    goal_stale_timeout_s: float = _DEFAULTS["goal_stale_timeout_s"]


assert {f.name for f in fields(RobotIOConfig)} == {p.name for p in ROBOT_IO_PARAMS}


def read_robot_io_config(node: Any) -> RobotIOConfig:
    """The declared values (None for an unset array -> empty), checked against the table."""
    values: dict[str, Any] = {}
    for p in ROBOT_IO_PARAMS:
        try:
            value = node.get_parameter(p.name).value
        except ParameterUninitializedException:      # an array declared by type and never set
            value = None
        if p.array_of is not None:
            value = tuple(value or ())
        reason = check_value(p, value)
        if reason:
            raise ValueError(reason)
        values[p.name] = value
    return RobotIOConfig(**values)


def markdown_table() -> str:
    """The table of docs/robot_io.md."""
    return parameters_table(ROBOT_IO_PARAMS)
