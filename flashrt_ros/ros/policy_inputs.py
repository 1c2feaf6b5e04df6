"""The policy's inputs: which topic feeds which policy feature, and how its message becomes a tensor.

Why apart from the control loop (``policy_io.py``): this is decided once, on
activate, from the robot I/O parameters and the features the policy declares,
and it is where a configuration that cannot serve the policy is refused with a
message naming the parameter to change. Each route's converter (``robot_io``:
``images``, ``joints``) then runs on every message the loop takes.

Topics: camera topics (``sensor_msgs/Image``, or ``sensor_msgs/CompressedImage``
for a topic whose name ends in ``/compressed``, as image_transport names them),
one ``sensor_msgs/JointState`` or ``std_msgs/Float32MultiArray`` (both feed
``observation.state``), and a ``std_msgs/Float32MultiArray`` for
``observation.environment_state``. Their QoS (``input_qos``) and the receipt
time of a message (``receipt_time``) are defined here too.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float32MultiArray

from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.models.policy_features import ENV_STATE, STATE, FeatureSpec
from flashrt_ros.robot_io.images import (compressed_format_problem, compressed_image_feature, image_feature,
                                         image_problem)
from flashrt_ros.robot_io.joints import JointSelector, length_problem, state_from_array
from flashrt_ros.runtime.errors import InvalidArgument

#: (message type, the feature it feeds, message -> tensor, message -> why it is refused or None)
InputRoute = tuple[type, str, Callable[[Any], Any], Callable[[Any], str | None]]

RELIABILITY = {"best_effort": ReliabilityPolicy.BEST_EFFORT, "reliable": ReliabilityPolicy.RELIABLE}
_HISTORY = {"keep_last": HistoryPolicy.KEEP_LAST, "keep_all": HistoryPolicy.KEEP_ALL}
_DURABILITY = {"volatile": DurabilityPolicy.VOLATILE, "transient_local": DurabilityPolicy.TRANSIENT_LOCAL}
COMPRESSED_SUFFIX = "/compressed"


def receipt_time(info: Any) -> float:
    """When a message arrived, on this process's monotonic clock.

    The middleware's ``received_timestamp`` (system clock, ns) is moved onto the
    monotonic clock by its age now; without one (or with a clock step of a
    minute) the time of the call stands in.
    """
    now = time.monotonic()
    received_ns = int(info.get("received_timestamp") or 0) if info else 0
    if received_ns > 0:
        age = time.time() - received_ns * 1e-9
        if -0.05 < age < 60.0:
            return now - max(age, 0.0)
    return now


def image_feature_name(topic: str) -> str:
    """The default feature of a camera topic: ``observation.images.<last segment>``
    (``/cam/front/compressed`` -> ``front``)."""
    base = topic.rstrip("/")
    if base.endswith(COMPRESSED_SUFFIX):
        base = base[: -len(COMPRESSED_SUFFIX)]
    return "observation.images." + base.rsplit("/", 1)[-1]


def input_qos(io: RobotIOConfig, depth: int, deadline_s: float) -> QoSProfile:
    qos = QoSProfile(depth=depth, history=_HISTORY[io.qos_history],
                     reliability=RELIABILITY[io.qos_reliability],
                     durability=_DURABILITY[io.qos_durability])
    if deadline_s > 0:
        qos.deadline = Duration(seconds=deadline_s)
    return qos


def input_plan(io: RobotIOConfig, features: Mapping[str, FeatureSpec]) -> dict[str, InputRoute]:
    """topic -> (message type, feature, message -> tensor, message -> why it is refused).

    Every policy feature is served exactly once, with the declared size where the
    parameters fix it; otherwise one InvalidArgument naming every problem found and the
    parameter to change for each (a user fixes them all in one restart, not one per start).
    """
    plan, problems = _routes(io, features)
    if problems:
        raise one_error(problems)
    return plan


class InputProblems(InvalidArgument):
    """Every problem found, in one error (``problems``: each its own sentence)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(problems[0] if len(problems) == 1 else f"{len(problems)} problems: "
                         + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))


def one_error(problems: list[str]) -> InputProblems:
    """One InvalidArgument for all ``problems`` (numbered when there are several)."""
    return InputProblems(problems)


def problems_of(exc: InvalidArgument) -> list[str]:
    """The problems an error names (several for an ``InputProblems``)."""
    return list(getattr(exc, "problems", [str(exc)]))


def _routes(io: RobotIOConfig, features: Mapping[str, FeatureSpec]) -> tuple[dict[str, InputRoute], list[str]]:
    """The routes that could be built and every problem found on the way."""
    plan: dict[str, InputRoute] = {}
    problems: list[str] = []
    accept = lambda _m: None  # noqa: E731
    state = features.get(STATE)
    if io.input_joint_state_topic:
        try:
            selector = JointSelector(io.input_joint_names, io.input_joint_fields)
        except InvalidArgument as exc:
            problems.append(f"input_joint_names / input_joint_fields: {exc}")
            selector = None
        if selector is not None:
            if state is not None and tuple(state.shape) != (selector.size,):
                problems.append(
                    f"the policy's {STATE} has shape {tuple(state.shape)} but input_joint_names x "
                    f"input_joint_fields give {len(selector.joint_names)} x {len(selector.fields)} = "
                    f"{selector.size} values: set input_joint_names (and input_joint_fields) so "
                    f"that they give {state.shape[0] if state.shape else 0}")
            plan[io.input_joint_state_topic] = (
                JointState, STATE,
                lambda m, s=selector: s.select(m.name, _joint_arrays(m)),
                lambda m, s=selector: s.problem(m.name, _joint_arrays(m)))
    elif io.input_state_topic:
        plan[io.input_state_topic] = (Float32MultiArray, STATE, lambda m: state_from_array(m.data),
                                      _length_check(features.get(STATE), STATE) or accept)
    if io.input_environment_state_topic:
        plan[io.input_environment_state_topic] = (
            Float32MultiArray, ENV_STATE, lambda m: state_from_array(m.data),
            _length_check(features.get(ENV_STATE), ENV_STATE) or accept)
    names = list(io.input_image_features) or [image_feature_name(t) for t in io.input_image_topics]
    images = sorted(n for n, spec in features.items() if spec.kind == "image")
    if len(names) != len(io.input_image_topics):
        problems.append(f"input_image_features names {len(names)} features for "
                        f"{len(io.input_image_topics)} input_image_topics: give one per topic")
    else:
        for topic, name in zip(io.input_image_topics, names):
            spec = features.get(name)
            if spec is None or spec.kind != "image":
                problems.append(f"image topic {topic} feeds {name!r}, which is not an image feature "
                                f"of the policy (its image features: {images}): set "
                                "input_image_features to one name per input_image_topics entry")
                continue
            if topic.rstrip("/").endswith(COMPRESSED_SUFFIX):
                plan[topic] = (CompressedImage, name, lambda m, shape=spec.shape: compressed_image_feature(
                    m.data, m.format, shape), lambda m: compressed_format_problem(m.format))
            else:
                plan[topic] = (Image, name, lambda m, shape=spec.shape: image_feature(
                    m.data, m.height, m.width, m.step, m.encoding, shape, bool(m.is_bigendian)),
                    lambda m: image_problem(m.height, m.width, m.step, m.encoding, len(m.data)))
    served = [feature for _t, feature, _c, _p in plan.values()]
    twice = sorted({f for f in served if served.count(f) > 1})
    if twice:
        problems.append(f"{twice} fed by more than one topic: give each entry of "
                        "input_image_topics its own input_image_features name")
    # a feature whose input is set but wrong is reported above, not again as missing
    named = set(served) | ({STATE} if io.input_joint_state_topic else set())
    if len(names) != len(io.input_image_topics):
        named |= set(names)
    missing = sorted(set(features) - named)
    if missing:
        hints = []
        if STATE in missing:
            hints.append(f"{STATE}: set input_joint_state_topic and input_joint_names (or "
                         "input_state_topic)")
        if ENV_STATE in missing:
            hints.append(f"{ENV_STATE}: set input_environment_state_topic")
        if any(features[m].kind == "image" for m in missing):
            hints.append("cameras: add their topics to input_image_topics and name the features "
                         "in input_image_features")
        problems.append(f"the policy observes {sorted(features)} but the inputs serve "
                        f"{sorted(served)}; missing {missing}: " + "; ".join(hints))
    extra = sorted(set(served) - set(features))
    if extra:
        problems.append(f"inputs serve {extra}, which the policy does not observe "
                        f"(it observes {sorted(features)}): clear input_state_topic "
                        "(set it to '') or remove the topic from input_image_topics")
    return plan, problems


def _joint_arrays(msg: Any) -> dict[str, Any]:
    return {"position": msg.position, "velocity": msg.velocity, "effort": msg.effort}


def _length_check(spec: FeatureSpec | None, feature: str) -> Callable[[Any], str | None] | None:
    """A Float32MultiArray's receipt check against the feature's size (None: the policy does not
    observe ``feature``, reported by the plan as an extra input)."""
    if spec is None:
        return None
    expected = int(spec.shape[0])
    return lambda m: length_problem(len(m.data), expected, feature)
