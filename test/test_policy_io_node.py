"""The policy node on robot topics: QoS that matches by default, the stale-data stop,
JointState / Image inputs, ros2_control-style outputs (in-process, real DDS)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.duration import Duration
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.models.policy_features import FeatureSpec
from flashrt_ros.msg import EngineStatus
from policy_io_harness import GENEROUS_AGE_S, Feeder, RosHarness, wait_until

OBS = lambda i: Float32MultiArray(data=[0.01 * (i % 13), -0.2, 0.0, 0.05, 0.5, -0.5])  # noqa: E731
LATCHED = QoSProfile(depth=1, durability=1, reliability=ReliabilityPolicy.RELIABLE)


@pytest.fixture(scope="module")
def ros():
    harness = RosHarness()
    yield harness
    harness.close()


def _status(ros, ns):
    return ros.collect(EngineStatus, f"/{ns}/flashrt/status", QoSProfile(depth=50, durability=1))


def test_default_qos_and_best_effort_publishers_both_drive_the_policy(ros, tmp_path):
    ros.policy_node("qos", tmp_path)
    actions = ros.collect(Float32MultiArray, "/qos/flashrt/action")
    reliable = Feeder(ros.peer, "/qos/flashrt/observation", OBS, QoSProfile(depth=10))
    wait_until(lambda: len(actions) >= 5, what="actions from a default-QoS (reliable) publisher")
    reliable.stop()
    before = len(actions)
    best_effort = Feeder(ros.peer, "/qos/flashrt/observation", OBS, qos_profile_sensor_data)
    wait_until(lambda: len(actions) >= before + 5, what="actions from a best-effort publisher")
    best_effort.stop()


def test_stale_inputs_stop_the_policy_and_fresh_inputs_resume_it(ros, tmp_path):
    # the node's own freshness rule (derived: 2.5 control periods here), at a control period long enough that
    # a loaded machine's scheduling delays do not make fresh inputs look stale
    ros.policy_node("stale", tmp_path, control_rate_hz=4.0, max_observation_age_s=0.0,
                    max_observation_age_ceiling_s=1.0)              # above the 2.5-period floor (0.625 s)
    status = _status(ros, "stale")
    diagnostics = ros.collect(DiagnosticArray, "/diagnostics")
    actions = ros.collect(Float32MultiArray, "/stale/flashrt/action")
    feeder = Feeder(ros.peer, "/stale/flashrt/observation", OBS)
    wait_until(lambda: len(actions) >= 5 and status and status[-1].inputs_state == "fresh",
               what="a stepping policy with fresh inputs")
    feeder.stop()                                        # the sensor dies
    after_stop = len(actions)
    wait_until(lambda: status[-1].inputs_state == "stale", what="the stale report on ~/status")
    assert "max_observation_age_s" in status[-1].inputs_detail
    # actions stop: none for two seconds (8 control periods) ...
    wait_until(lambda: _stable(actions, len(actions), hold_s=2.0), timeout=30, what="actions to stop")
    # ... within 2.5 control periods of the last observation: at most 2 ticks after it
    # (+1 for an action already in flight when the feeder stopped)
    assert len(actions) - after_stop <= 3, (after_stop, len(actions))
    # the policy state did not advance while stale
    seen = len(status)
    wait_until(lambda: len(status) >= seen + 3, what="three more status messages")
    assert len({s.position for s in status[seen - 1:]}) == 1
    assert any(s.level == DiagnosticStatus.WARN and "policy stopped" in s.message
               for d in list(diagnostics) for s in d.status if s.name.startswith("stale/flashrt"))
    # fresh data: the policy steps again
    stopped_at = len(actions)
    feeder = Feeder(ros.peer, "/stale/flashrt/observation", OBS)
    wait_until(lambda: len(actions) >= stopped_at + 5 and status[-1].inputs_state == "fresh",
               what="the policy to resume on fresh data")
    feeder.stop()


def _stable(items: list, n: int, hold_s: float = 1.0) -> bool:
    """True when ``items`` keeps length ``n`` for ``hold_s`` seconds."""
    import time
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        if len(items) != n:
            return False
        time.sleep(0.02)
    return True


def test_hold_command_is_published_while_inputs_are_stale(ros, tmp_path):
    ros.policy_node("hold", tmp_path, hold_command=[0.25, -0.25], output_type="float64_array",
                    output_topic="/hold/forward_controller/commands")
    commands = ros.collect(Float64MultiArray, "/hold/forward_controller/commands")
    wait_until(lambda: len(commands) >= 3, what="hold commands before any observation")
    assert all(list(c.data) == [0.25, -0.25] for c in commands)
    feeder = Feeder(ros.peer, "/hold/flashrt/observation", OBS)
    wait_until(lambda: any(list(c.data) != [0.25, -0.25] for c in commands), what="policy commands")
    feeder.stop()
    n = len(commands)
    wait_until(lambda: len(commands) >= n + 3 and list(commands[-1].data) == [0.25, -0.25],
               what="hold commands after the sensor stopped")


def test_deadline_only_when_asked_and_misses_are_reported(ros, tmp_path):
    ros.policy_node("deadline", tmp_path, qos_deadline_factor=2.0, qos_reliability="reliable")
    status = _status(ros, "deadline")
    actions = ros.collect(Float32MultiArray, "/deadline/flashrt/action")
    offered = QoSProfile(depth=10, deadline=Duration(seconds=0.05))
    feeder = Feeder(ros.peer, "/deadline/flashrt/observation", OBS, offered)
    wait_until(lambda: len(actions) >= 5, what="actions from a publisher offering a deadline")
    feeder.stop()
    wait_until(lambda: status and status[-1].deadline_misses > 0, what="deadline misses on ~/status")


def test_joint_state_in_trajectory_out(ros, tmp_path):
    ros.policy_node("arm", tmp_path, policy="transformer",
                    input_joint_state_topic="/arm/joint_states",
                    input_joint_names=["a", "b", "c"], input_joint_fields=["position", "velocity"],
                    output_type="joint_trajectory", output_topic="/arm/jtc/joint_trajectory",
                    output_joint_names=["j1", "j2"])
    status = _status(ros, "arm")
    trajectories = ros.collect(JointTrajectory, "/arm/jtc/joint_trajectory")

    def joints(i, names=("c", "x", "a", "b")):
        return JointState(name=list(names), position=[0.1 * i, 9.0, 0.2, 0.3][:len(names)],
                          velocity=[0.0, 9.0, 0.1, 0.1][:len(names)])
    feeder = Feeder(ros.peer, "/arm/joint_states", joints, qos_profile_sensor_data, msg_type=JointState)
    wait_until(lambda: len(trajectories) >= 5, what="trajectories")
    feeder.stop()
    traj = trajectories[-1]
    assert traj.joint_names == ["j1", "j2"] and len(traj.points) >= 1
    times = [p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec for p in traj.points]
    assert times[0] == pytest.approx(0.05) and times == sorted(times)
    assert all(len(p.positions) == 2 for p in traj.points)
    assert max(len(t.points) for t in trajectories) > 1          # the planned chunk is published
    bad = Feeder(ros.peer, "/arm/joint_states", lambda i: joints(i, ("a", "b")),
                 qos_profile_sensor_data, msg_type=JointState)
    wait_until(lambda: status[-1].inputs_state == "error" and "'c'" in status[-1].inputs_detail,
               what="a missing joint reported as an error")
    bad.stop()


class _ImagePolicy:
    """Declares a camera and a state; records what the engine is stepped with."""

    input_features = staticmethod(lambda: {
        "observation.images.front": FeatureSpec((3, 8, 8), "image"),
        "observation.state": FeatureSpec((2,), "state")})
    action_dim = 2


class _RecordingEngine:
    def __init__(self) -> None:
        self.policy = _ImagePolicy()
        self.features = self.policy.input_features()      # as PolicyEngine.features
        self.seen: list = []

    def step(self, observation):
        self.seen.append({k: v.clone() for k, v in observation.items()})
        return torch.tensor([0.5, -0.5])


def test_camera_and_state_reach_the_policy_as_declared_features(ros):
    from flashrt_ros.ros.policy_io import PolicyTopics
    engine = _RecordingEngine()
    io = RobotIOConfig(input_state_topic="/cam_test/state", input_image_topics=("/cam_test/front",),
                       output_topic="/cam_test/action", max_observation_age_s=GENEROUS_AGE_S)
    policy_io = PolicyTopics(ros.peer, engine, SimpleNamespace(control_rate_hz=20.0, qos_depth=1,
                                                           qos_deadline_factor=0.0), io, None)
    bgr = np.zeros((12, 16, 3), np.uint8)
    bgr[:, :, 0] = 255                                                  # pure blue in BGR order

    def frame(i):
        return Image(height=12, width=16, encoding="bgr8", step=48, data=bgr.tobytes())
    camera = Feeder(ros.peer, "/cam_test/front", frame, qos_profile_sensor_data, msg_type=Image)
    state = Feeder(ros.peer, "/cam_test/state", lambda i: Float32MultiArray(data=[1.0, 2.0]))
    try:
        wait_until(lambda: engine.seen, what="a policy step with camera and state")
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    obs = engine.seen[-1]
    image = obs["observation.images.front"]
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32
    # blue (BGR channel 0) arrives as RGB channel 2; 12x16 -> scaled to 8x11, centre-cropped to 8x8
    assert torch.allclose(image[2], torch.ones(8, 8), atol=1e-6)
    assert torch.allclose(image[:2], torch.zeros(2, 8, 8), atol=1e-6)
    assert obs["observation.state"].tolist() == [1.0, 2.0]


def test_inputs_that_do_not_serve_the_policy_fail_activation(ros, tmp_path):
    from flashrt_ros.ros.node import FlashRTNode
    from rclpy.parameter import Parameter
    node = FlashRTNode("flashrt", namespace="/badio", parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            "engine_kind": "policy", "policy": "gru", "device": "cpu",
            "capsule_directory": str(tmp_path / "c"), "input_state_topic": "",
            "input_image_topics": ["/badio/cam"]}.items()])
    try:
        node.trigger_configure()
        node.trigger_activate()
        assert not node._active
    finally:
        node._release_engine()
        node.destroy_node()


class _SlowEngine(_RecordingEngine):
    """A policy whose every step takes ``step_s`` (longer than a control period)."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s

    def step(self, observation):
        import time
        time.sleep(self.step_s)
        return super().step(observation)


class _LogRecordingNode:
    """The peer node with its logger replaced by a recorder (to count log lines)."""

    def __init__(self, node) -> None:
        self._node = node
        self.lines: list[tuple[str, str]] = []
        record = lambda level: lambda msg, **_kw: self.lines.append((level, msg))  # noqa: E731
        self._logger = SimpleNamespace(info=record("info"), warning=record("warning"),
                                       error=record("error"))

    def get_logger(self):
        return self._logger

    def __getattr__(self, name):
        return getattr(self._node, name)


def _camera_and_state_io(ros, prefix: str, engine, states: list, camera: str = "front", **io_fields):
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

    from flashrt_ros.ros.policy_io import PolicyTopics
    io = RobotIOConfig(input_state_topic=f"/{prefix}/state", input_image_topics=(f"/{prefix}/{camera}",),
                       output_topic=f"/{prefix}/action", **io_fields)
    node = _LogRecordingNode(ros.peer)
    holder: dict = {}
    policy_io = PolicyTopics(node, engine, SimpleNamespace(control_rate_hz=20.0, qos_depth=1,
                                                       qos_deadline_factor=0.0), io,
                         MutuallyExclusiveCallbackGroup(),
                         on_inputs_change=lambda: states.append((holder["io"].inputs_state,
                                                                 holder["io"].inputs_detail)))
    holder["io"] = policy_io
    return policy_io, node


def _rgb_frame(i, encoding="rgb8"):
    return Image(height=8, width=8, encoding=encoding, step=24, data=bytes(8 * 8 * 3))


def test_a_step_longer_than_a_period_never_makes_fresh_inputs_stale(ros):
    # Inputs are published every 50 ms and may be 0.3 s old; each step takes 0.6 s. Were receipt
    # queued behind the step (one callback group), every tick after a step would see inputs
    # >= 0.6 s old and report them stale, the first slow step after start included. A stale
    # report is only allowed where the publishers themselves were late by more than 0.3 s
    # (a loaded test machine can stall their threads).
    engine = _SlowEngine(step_s=0.6)
    states: list = []
    policy_io, _node = _camera_and_state_io(ros, "slow", engine, states, max_observation_age_s=0.3)
    camera = Feeder(ros.peer, "/slow/front", _rgb_frame, qos_profile_sensor_data, period_s=0.05,
                    msg_type=Image)
    state = Feeder(ros.peer, "/slow/state", lambda i: Float32MultiArray(data=[1.0, 2.0]), period_s=0.05)
    try:
        wait_until(lambda: len(engine.seen) >= 5, timeout=60, what="five slow steps")
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    fresh_at = next(i for i, (s, _d) in enumerate(states) if s == "fresh")
    stale_reports = sum(s == "stale" for s, _d in states[fresh_at:])
    late = sum(b - a > 0.3 for feeder in (camera, state) for a, b in zip(feeder.times, feeder.times[1:]))
    assert len(engine.seen) >= 5 and stale_reports <= late, (late, states)


def test_receipt_time_comes_from_the_middleware_when_it_has_one():
    import time

    from flashrt_ros.ros.policy_io import receipt_time
    before = time.monotonic()
    received_ns = time.time_ns() - 500_000_000                     # arrived 0.5 s ago
    assert receipt_time({"received_timestamp": received_ns}) == pytest.approx(before - 0.5, abs=0.05)
    assert receipt_time({"received_timestamp": 0}) >= before          # no stamp: now
    assert receipt_time(None) >= before
    assert receipt_time({"received_timestamp": received_ns - 3_600 * 10**9}) >= before   # clock step


def test_unsupported_encoding_is_refused_once_counted_and_reported(ros):
    engine = _RecordingEngine()
    states: list = []
    policy_io, node = _camera_and_state_io(ros, "bayer", engine, states)
    camera = Feeder(ros.peer, "/bayer/front", lambda i: _rgb_frame(i, "bayer_rggb8"),
                    qos_profile_sensor_data, msg_type=Image)
    state = Feeder(ros.peer, "/bayer/state", lambda i: Float32MultiArray(data=[1.0, 2.0]))
    try:
        wait_until(lambda: policy_io.refusals.count >= 20, what="20 refused frames")
        status = policy_io.status()
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    assert not engine.seen                                             # never stepped on it
    assert status["inputs_state"] == "error" and "'bayer_rggb8' is not supported" in status["inputs_detail"]
    assert status["rejected_messages"] >= 20
    errors = [msg for level, msg in node.lines if level == "error"]
    refusals = [m for m in errors if "/bayer/front refused" in m]
    assert len(refusals) == 1, errors                                 # logged once, not per frame
    assert len(errors) <= 2, errors                                   # + the one state change


@pytest.mark.parametrize("frame, cause", [
    (Image(height=8, width=8, encoding="rgb8", step=16, data=bytes(16 * 8)),
     "rgb8 image 8x8: step 16 is shorter than one row of pixels (8 x 3 = 24 bytes)"),
    (Image(height=8, width=7, encoding="yuyv", step=14, data=bytes(14 * 8)),
     "yuyv packs two pixels in 4 bytes and needs an even width (got 7)"),
    (Image(height=8, width=8, encoding="rgb8", step=24, data=bytes(24 * 7)),
     "rgb8 image 8x8 with step 24 needs 192 bytes of data, got 168"),
], ids=["step-shorter-than-a-row", "yuyv-odd-width", "data-too-short"])
def test_a_malformed_frame_is_refused_at_receipt_while_idle_with_its_cause(ros, frame, cause):
    """Frames the node cannot read used to pass as fresh while the node idled (status and InputsFresh said
    fresh, nothing counted), were refused only inside a goal, then logged on every tick with a self-
    contradicting text. Now: refused at receipt, counted, the idle status says error with the real cause."""
    engine = _RecordingEngine()
    states: list = []
    policy_io, node = _camera_and_state_io(ros, "bad", engine, states, run_mode="goal")     # idle: no goal
    camera = Feeder(ros.peer, "/bad/front", lambda i: frame, qos_profile_sensor_data, msg_type=Image)
    state = Feeder(ros.peer, "/bad/state", lambda i: Float32MultiArray(data=[1.0, 2.0]))
    try:
        wait_until(lambda: policy_io.refusals.count >= 20 and policy_io.status()["inputs_state"] == "error",
                   what="20 refused frames and the error on the idle status")
        status = policy_io.status()
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    assert not engine.seen
    assert status["inputs_detail"] == f"input messages refused: /bad/front: {cause}", status["inputs_detail"]
    refusals = [m for level, m in node.lines if level == "error" and m.startswith("input /bad/front")]
    assert len(refusals) == 1, refusals                                # the first; repeats at most every 10 s


def test_repeated_refusals_are_logged_once_then_at_most_every_period():
    from flashrt_ros.robot_io.refusals import InputRefusals
    lines: list[str] = []
    refusals = InputRefusals(lines.append, period_s=10.0)
    for t in range(25):                                                 # one bad frame a second
        refusals.refuse("/cam", "bad step", now=float(t))
    refusals.refuse("/cam", "odd width", now=25.0)                     # another cause: its own first line
    assert refusals.count == 26 and refusals.reasons() == {"/cam": "odd width"}
    assert len(lines) == 4 and "refused: bad step" in lines[0] and "odd width" in lines[3]
    assert "(10 more since the last line)" in lines[1] and "(10 more since the last line)" in lines[2]
    refusals.accepted("/cam")
    assert refusals.reasons() == {}


@pytest.mark.parametrize("fields, parameter", [
    (dict(input_state_topic="", input_joint_state_topic="/v/joints", input_joint_names=("a", "b", "c")),
     "input_joint_names"),
    (dict(input_image_features=("observation.images.top",)), "input_image_features"),
    (dict(input_image_topics=()), "input_image_topics"),
])
def test_inputs_that_cannot_serve_the_policy_are_refused_naming_the_parameter(ros, fields, parameter):
    from flashrt_ros.ros.policy_io import PolicyTopics
    from flashrt_ros.runtime.errors import InvalidArgument
    base = dict(input_state_topic="/v/state", input_image_topics=("/v/front",), output_topic="/v/action")
    base.update(fields)
    with pytest.raises(InvalidArgument, match=parameter):
        PolicyTopics(ros.peer, _RecordingEngine(), SimpleNamespace(control_rate_hz=20.0, qos_depth=1,
                                                               qos_deadline_factor=0.0),
                 RobotIOConfig(**base), None)


def test_compressed_camera_topic_feeds_the_feature_of_its_base_name(ros):
    import io as iolib

    from PIL import Image as PILImage
    from sensor_msgs.msg import CompressedImage
    engine = _RecordingEngine()
    policy_io, _node = _camera_and_state_io(ros, "jpeg", engine, [], camera="front/compressed")
    buf = iolib.BytesIO()
    PILImage.new("RGB", (16, 12), (0, 0, 255)).save(buf, format="PNG")
    frame = lambda i: CompressedImage(format="bgr8; png compressed bgr8", data=buf.getvalue())  # noqa: E731
    camera = Feeder(ros.peer, "/jpeg/front/compressed", frame, qos_profile_sensor_data,
                    msg_type=CompressedImage)
    state = Feeder(ros.peer, "/jpeg/state", lambda i: Float32MultiArray(data=[1.0, 2.0]))
    try:
        wait_until(lambda: engine.seen, what="a step on a compressed frame")
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    image = engine.seen[-1]["observation.images.front"]
    assert torch.allclose(image[2], torch.ones(8, 8)) and torch.allclose(image[:2], torch.zeros(2, 8, 8))


def test_every_input_and_output_problem_is_named_in_one_start(ros):
    # three mistakes at once: a user fixes them in one restart, not one per start (issue #50)
    from flashrt_ros.ros.policy_io import PolicyTopics
    from flashrt_ros.runtime.errors import InvalidArgument
    io = RobotIOConfig(input_state_topic="", input_joint_state_topic="/all/joints", input_joint_names=("a", "b", "c"),
                       input_image_topics=("/all/front",), input_image_features=("observation.images.top",),
                       output_type="joint_state", output_topic="/all/action", output_joint_names=("j1",))
    with pytest.raises(InvalidArgument) as refused:
        PolicyTopics(ros.peer, _RecordingEngine(), SimpleNamespace(control_rate_hz=20.0, qos_depth=1,
                                                               qos_deadline_factor=0.0), io, None)
    text = str(refused.value)
    assert text.startswith("4 problems: (1) ") and "(4) output_joint_names names 1 joints" in text, text
    assert "input_joint_names (and input_joint_fields) so that they give 2" in text, text
    assert "'observation.images.top', which is not an image feature" in text, text


def test_a_state_array_of_the_wrong_length_is_refused_at_receipt_naming_the_sizes(ros):
    engine = _RecordingEngine()
    states: list = []
    policy_io, node = _camera_and_state_io(ros, "short", engine, states)
    camera = Feeder(ros.peer, "/short/front", _rgb_frame, qos_profile_sensor_data, msg_type=Image)
    state = Feeder(ros.peer, "/short/state", lambda i: Float32MultiArray(data=[1.0, 2.0, 3.0]))
    try:
        wait_until(lambda: policy_io.refusals.count >= 5, what="refused state arrays")
        status = policy_io.status()
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
    assert not engine.seen
    assert status["inputs_state"] == "error" and status["inputs_detail"] == (
        "input messages refused: /short/state: the message has 3 values but the policy's observation.state "
        "takes 2"), status
