"""Fake sensors: a checkpoint's inputs, published on the topics the node's parameters name.

Why: without a robot, a user still wants to drive the node end to end (and
everyone wrote this script first). What is published comes from the plan the
node itself builds on activate (``policy_inputs.input_plan`` over the policy's
features and the robot I/O parameters): the same topics, message types, joint
names and image sizes, so parameters the node would refuse are refused here with
the node's message (every problem at once). Frames and joint values come from
``robot_io.synthetic``. Publishers are reliable (they reach the node's default
best-effort subscriptions and reliable ones alike). ``flashrt fake-sensors``
(``cli/robot_tools.py``) runs ``FakeSensors``, as ``flashrt serve`` runs the node:
the CLI's way into this server-side module.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float32MultiArray

from flashrt_ros.interface.qos import resolve_topic
from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS, RobotIOConfig
from flashrt_ros.models.policy_features import ENV_STATE, IMAGES_PREFIX, STATE, FeatureSpec
from flashrt_ros.robot_io import synthetic
from flashrt_ros.ros.parameters import declare_parameters, read_config
from flashrt_ros.ros.policy_inputs import COMPRESSED_SUFFIX, input_plan
from flashrt_ros.runtime.errors import FlashRTError

PUBLISH_QOS = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE)


class Refused(ValueError):
    """The policy's features cannot be read, or the parameters cannot feed them (the message says why)."""


@dataclass
class FakeStream:
    """One topic: its message type, what it feeds, and how its ``i``-th message at time ``t`` is made."""

    topic: str
    msg_type: type
    feature: str
    what: str                                       # e.g. "rgb8 96x96", "joints [a, b] (position, velocity)"
    make: Callable[[int, float], Any]


def suggested_parameters(features: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Robot I/O parameters that feed ``features`` from conventional topics: ``/joint_states`` with
    joints ``joint_1`` ... (position), ``/camera/<name>/image_raw``, ``/environment_state``. Used
    when the user gives none: the node must then be started with the same (printed) values."""
    params: dict[str, Any] = {"input_state_topic": ""}
    state = features.get(STATE)
    if state is not None:
        params["input_joint_state_topic"] = "/joint_states"
        params["input_joint_names"] = [f"joint_{i + 1}" for i in range(int(state.shape[0]))]
    if ENV_STATE in features:
        params["input_environment_state_topic"] = "/environment_state"
    cameras = sorted(name for name, spec in features.items() if spec.kind == "image")
    if cameras:
        short = [name[len(IMAGES_PREFIX):] if name.startswith(IMAGES_PREFIX) else name for name in cameras]
        params["input_image_topics"] = [f"/camera/{s}/image_raw" for s in short]
        params["input_image_features"] = cameras
    return params


def fake_streams(io: RobotIOConfig, features: Mapping[str, FeatureSpec], node_fqn: str,
                 stamp: Callable[[], Any], encoding: str = "rgb8",
                 image_size: tuple[int, int] | None = None) -> list[FakeStream]:
    """One stream per input the node subscribes to; InvalidArgument (every problem, the node's words)
    if the parameters cannot feed ``features``. ``image_size``: (width, height) of the frames
    (default: the feature's own; the node resizes and crops others)."""
    streams = []
    for topic, (msg_type, feature, _convert, _problem) in input_plan(io, features).items():
        spec = features[feature]
        topic = resolve_topic(topic, node_fqn)
        if msg_type is JointState:
            streams.append(_joint_stream(topic, feature, io, stamp))
        elif msg_type is Float32MultiArray:
            n = int(spec.shape[0])
            streams.append(FakeStream(topic, msg_type, feature, f"{n} values",
                                      lambda _i, t, n=n: Float32MultiArray(data=synthetic.joint_values(n, t))))
        else:
            width, height = image_size or (spec.shape[2], spec.shape[1])
            streams.append(_image_stream(topic, msg_type, feature, width, height, encoding, stamp))
    return streams


def _joint_stream(topic: str, feature: str, io: RobotIOConfig, stamp: Callable[[], Any]) -> FakeStream:
    names = list(io.input_joint_names)

    def make(_i: int, t: float) -> JointState:
        msg = JointState(name=names, position=synthetic.joint_values(len(names), t),
                         velocity=synthetic.joint_velocities(len(names), t), effort=[0.0] * len(names))
        msg.header.stamp = stamp()
        return msg
    return FakeStream(topic, JointState, feature,
                      f"joints [{', '.join(names)}] (position, velocity, effort)", make)


def _image_stream(topic: str, msg_type: type, feature: str, width: int, height: int, encoding: str,
                  stamp: Callable[[], Any]) -> FakeStream:
    if msg_type is CompressedImage or topic.rstrip("/").endswith(COMPRESSED_SUFFIX):
        frames = synthetic.compressed_cycle(height, width)

        def make_compressed(i: int, _t: float) -> CompressedImage:
            msg = CompressedImage(format="jpeg", data=frames[i % len(frames)])
            msg.header.stamp = stamp()
            return msg
        return FakeStream(topic, CompressedImage, feature, f"jpeg {width}x{height}", make_compressed)
    frames = synthetic.frame_cycle(height, width, encoding)
    step = width * synthetic.bytes_per_pixel(encoding)

    def make(i: int, _t: float) -> Image:
        msg = Image(height=height, width=width, encoding=encoding, step=step, data=frames[i % len(frames)])
        msg.header.stamp = stamp()
        return msg
    return FakeStream(topic, Image, feature, f"{encoding} {width}x{height}", make)


def publish_forever(node: Any, streams: list[FakeStream], rate_hz: float, duration_s: float = 0.0,
                    should_stop: Callable[[], bool] = lambda: False) -> tuple[int, bool]:
    """Publish every stream at ``rate_hz`` (on a fixed schedule: a late round does not shift the next)
    for ``duration_s`` (0: until ``should_stop`` or Ctrl-C); the rounds published, and whether
    Ctrl-C (KeyboardInterrupt) ended it."""
    publishers = [node.create_publisher(s.msg_type, s.topic, PUBLISH_QOS) for s in streams]
    period = 1.0 / rate_hz
    t0 = schedule = time.monotonic()
    rounds, interrupted = 0, False
    try:
        while not should_stop():
            now = time.monotonic()
            if duration_s and now - t0 >= duration_s:
                break
            for stream, pub in zip(streams, publishers):
                pub.publish(stream.make(rounds, now - t0))
            rounds += 1
            schedule += period
            now = time.monotonic()
            if schedule < now - period:                # fell behind by more than a period: resume from now
                schedule = now
            time.sleep(max(0.0, schedule - now))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for pub in publishers:
            node.destroy_publisher(pub)
    return rounds, interrupted


def policy_features(checkpoint: str | None = None, policy: str | None = None) -> dict[str, FeatureSpec]:
    """The features the policy reads: a LeRobot checkpoint's from its config.json alone (no weights),
    or any policy spec built as the node builds it (its weights loaded). Refused naming the problem."""
    try:
        if checkpoint:
            from flashrt_ros.models.lerobot.checkpoint import declared_input_features
            return declared_input_features(checkpoint)
        from flashrt_ros.models.policy_factory import make_policy
        return dict(make_policy(str(policy)).input_features())
    except FlashRTError as exc:
        raise Refused(str(exc)) from None


class FakeSensors:
    """An rclpy node (its own context) with the robot I/O parameters the node would read from the same
    ``-p`` flags and parameters file, and one stream per input; ``suggested`` holds the parameters used
    when none were given (the node must be started with them)."""

    def __init__(self, node_fqn: str, features: Mapping[str, FeatureSpec], params: list[str],
                 params_file: str | None, encoding: str = "rgb8", image_size: tuple[int, int] | None = None) -> None:
        import rclpy
        from rclpy.parameter import Parameter
        from rclpy.signals import SignalHandlerOptions

        self.suggested = {} if (params or params_file) else suggested_parameters(features)
        ros_args = ["flashrt", "--ros-args"] + [a for extra in params for a in ("-p", extra)]
        if params_file:
            ros_args += ["--params-file", params_file]
        self._context = rclpy.Context()
        try:
            # no rclpy signal handlers: Ctrl-C raises KeyboardInterrupt in the publishing loop
            rclpy.init(args=ros_args, context=self._context, signal_handler_options=SignalHandlerOptions.NO)
        except Exception as exc:  # noqa: BLE001 - rcl's own message on a malformed -p or file
            raise Refused(f"the parameters could not be read: {exc}") from None
        try:
            self.node = rclpy.create_node(
                f"flashrt_fake_sensors_{os.getpid()}", context=self._context, start_parameter_services=False,
                parameter_overrides=[Parameter(k, value=v) for k, v in self.suggested.items()])
        except Exception:
            rclpy.try_shutdown(context=self._context)
            raise
        try:
            declare_parameters(self.node, ROBOT_IO_PARAMS)
            io = read_config(self.node, RobotIOConfig)
            self.streams = fake_streams(io, features, node_fqn, lambda: self.node.get_clock().now().to_msg(),
                                        encoding=encoding, image_size=image_size)
        except (FlashRTError, ValueError, TypeError) as exc:
            self.close()
            raise Refused("these robot I/O parameters cannot feed the policy's inputs (the node would refuse "
                          f"them too): {exc}") from None

    def publish(self, rate_hz: float, duration_s: float = 0.0) -> tuple[int, bool]:
        """``publish_forever`` on this node's streams."""
        return publish_forever(self.node, self.streams, rate_hz, duration_s)

    def close(self) -> None:
        import rclpy
        self.node.destroy_node()
        rclpy.try_shutdown(context=self._context)
