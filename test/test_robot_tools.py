"""``flashrt fake-sensors`` and ``flashrt watch-commands`` (issue #50, item 7): a checkpoint driven
without a robot, as the README's quick start does it, and the parts they are made of."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from flashrt_ros.interface.qos import resolve_topic
from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.models.lerobot.checkpoint import declared_input_features
from flashrt_ros.models.policy_features import FeatureSpec
from flashrt_ros.robot_io import synthetic
from flashrt_ros.robot_io.command_stats import summarize
from flashrt_ros.robot_io.images import image_feature
from flashrt_ros.ros.fake_sensors import fake_streams, suggested_parameters
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.sim.arm_policy import TRAINED
from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from rosproc import ros_env, start_python, stop, wait_for_text, with_ctrl_c
from waiting import wait_until

CAMERAS = {"observation.images.top": FeatureSpec((3, 24, 32), "image"),
           "observation.images.wrist": FeatureSpec((3, 24, 32), "image"),
           "observation.state": FeatureSpec((5,), "state")}


def test_the_checkpoints_features_are_read_as_the_loaded_policy_declares_them():
    from flashrt_ros.models.lerobot import load_lerobot_policy
    for kind in ("act", "diffusion"):
        assert declared_input_features(TRAINED[kind]) == dict(load_lerobot_policy(TRAINED[kind]).input_features())


def test_a_config_with_cameras_gives_image_features_without_reading_weights(tmp_path):
    config = {"type": "act", "input_features": {
        "observation.state": {"type": "STATE", "shape": [5]},
        "observation.images.top": {"type": "VISUAL", "shape": [3, 24, 32]}},
        "output_features": {"action": {"type": "ACTION", "shape": [5]}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert declared_input_features(tmp_path) == {"observation.state": FeatureSpec((5,), "state"),
                                                 "observation.images.top": FeatureSpec((3, 24, 32), "image")}
    with pytest.raises(InvalidArgument, match="has no config.json"):
        declared_input_features(tmp_path / "missing")


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "mono8", "mono16", "yuyv", "uyvy"])
def test_synthetic_frames_convert_as_a_cameras_would_and_move(encoding):
    frames = synthetic.frame_cycle(24, 32, encoding)
    step = 32 * synthetic.bytes_per_pixel(encoding)
    a, b = (image_feature(f, 24, 32, step, encoding, (3, 24, 32)) for f in frames[:2])
    assert a.shape == (3, 24, 32) and 0.0 <= float(a.min()) and float(a.max()) <= 1.0
    assert not torch.equal(a, b), "consecutive frames differ, as a camera's do"


def test_fake_streams_follow_the_nodes_plan_and_refuse_what_the_node_would():
    params = suggested_parameters(CAMERAS)
    assert params["input_image_topics"] == ["/camera/top/image_raw", "/camera/wrist/image_raw"]
    assert params["input_joint_names"] == ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5"]
    io = RobotIOConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})
    streams = {s.topic: s for s in fake_streams(io, CAMERAS, "/robot1/flashrt", lambda: _Stamp())}
    assert set(streams) == {"/joint_states", "/camera/top/image_raw", "/camera/wrist/image_raw"}
    frame = streams["/camera/top/image_raw"].make(3, 0.1)
    assert (frame.encoding, frame.width, frame.height, len(frame.data)) == ("rgb8", 32, 24, 32 * 24 * 3)
    joints = streams["/joint_states"].make(0, 1.0)
    assert list(joints.name) == params["input_joint_names"] and len(joints.position) == 5
    io = RobotIOConfig(input_state_topic="~/obs", input_image_topics=("cam",))
    assert resolve_topic("~/obs", "/robot1/flashrt") == "/robot1/flashrt/obs"
    assert resolve_topic("cam", "/robot1/flashrt") == "/robot1/cam"
    with pytest.raises(InvalidArgument, match=r"^\d problems: .*input_image_features.*missing"):
        fake_streams(io, CAMERAS, "/robot1/flashrt", lambda: _Stamp())


class _Stamp:
    sec = nanosec = 0


def test_command_statistics_name_rate_gaps_and_age():
    receipts = [i * 0.1 for i in range(11)] + [1.5]                 # 10 Hz, then one 0.5 s gap
    s = summarize(receipts, now=1.7, delays=[0.001, 0.003])
    assert s.count == 12 and s.rate_hz == pytest.approx(11 / 1.5)
    assert s.gap_p50_ms == pytest.approx(100) and s.gap_max_ms == pytest.approx(500) and s.age_s == pytest.approx(0.2)
    assert "gaps p50 100.0 ms" in s.line() and "max 500.0 ms" in s.line() and "stamp to receipt" in s.line()
    window = summarize([2.0, 2.1], now=2.2, before=1.5)
    assert window.gap_max_ms == pytest.approx(500), "the gap into the window counts"
    assert summarize([], now=3.0, before=1.5).line() == "no message (latest 1.5 s ago)"


def test_fake_sensors_drive_a_checkpoint_node_and_watch_commands_sees_its_rate(tmp_path, ros_node):  # noqa: F811
    ckpt = TRAINED["act"]
    fake_log, watch_log = tmp_path / "fake.log", tmp_path / "watch.log"
    fake = start_python(with_ctrl_c("flashrt_ros.cli", "--node", "/quick/flashrt", "fake-sensors", "--checkpoint",
                                    str(ckpt), "--rate", "30"), fake_log)
    try:
        assert wait_for_text(fake_log, "start the node with the same:", 60, fake), fake_log.read_text()
        flags = fake_log.read_text().split("start the node with the same:\n", 1)[1].splitlines()[0].strip()
        assert flags == ('-p input_joint_state_topic:=/joint_states -p "input_joint_names:=[joint_1, joint_2, '
                         'joint_3, joint_4]" -p input_environment_state_topic:=/environment_state')
        params = {"engine_kind": "policy", "policy": f"lerobot:{ckpt}", "device": "cpu", "run_mode": "goal",
                  "control_rate_hz": "20.0", "status_period_s": "0.2", "max_observation_age_s": "0.5",
                  "input_joint_state_topic": "/joint_states", "input_environment_state_topic": "/environment_state",
                  "input_joint_names": "[joint_1, joint_2, joint_3, joint_4]", "output_type": "float64_array",
                  "output_topic": "/quick/commands"}
        with active_node(tmp_path, "quick", params) as node:
            client = client_of(node, ros_node)
            wait_until(lambda: client.status().inputs_state == "fresh", what="fresh fake inputs on an idle node")
            watch = start_python(with_ctrl_c("flashrt_ros.cli", "watch-commands", "/quick/commands", "--type",
                                             "std_msgs/msg/Float64MultiArray"), watch_log)
            try:
                assert wait_for_text(watch_log, "watching /quick/commands", 60, watch), watch_log.read_text()
                # a first short goal until the watcher sees commands: the node's publisher has matched it
                wait_until(lambda: client.run_policy(max_steps=3, wait_s=60).result.success
                           and " Hz (" in watch_log.read_text(), what="the watcher to see the node's commands")
                warmup = sum(int(m) for m in re.findall(r" Hz \((\d+) in ", watch_log.read_text()))
                run = subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", "/quick/flashrt",
                                      "run-policy", "--max-steps", "60", "--quiet"], capture_output=True, text=True,
                                     env=ros_env(), timeout=300)
                assert run.returncode == 0 and "60 steps, stop: max_steps" in run.stdout, run.stdout + run.stderr
                assert wait_for_text(watch_log, "no message (latest", 60, watch), watch_log.read_text()   # the stream ended
            finally:
                stop(watch)
            text = watch_log.read_text()
            whole = [line for line in text.splitlines() if line.startswith("whole run: ")]
            counted = int(re.search(r"\((\d+) in ", whole[0]).group(1)) if whole else -1
            assert counted >= warmup + 60 and "gaps p50" in whole[0], text
            assert any(line.startswith("last 1 s: ") and " Hz (" in line for line in text.splitlines()), text
    finally:
        stop(fake)
    assert "published" in fake_log.read_text()


def test_make_checkpoint_writes_a_camera_act_that_loads_and_refuses_to_overwrite(tmp_path):
    from flashrt_ros.models.lerobot.factory import load_lerobot_policy

    def make(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "make-checkpoint", *args],
                              capture_output=True, text=True, env=ros_env(), timeout=300)
    r = make(str(tmp_path / "ck"), "--joints", "5", "--cameras", "top,wrist", "--image-size", "64x48")
    assert r.returncode == 0 and "wrote an ACT checkpoint" in r.stdout, r.stdout + r.stderr
    features = dict(load_lerobot_policy(tmp_path / "ck").input_features())
    assert features == {"observation.state": FeatureSpec((5,), "state"),
                        "observation.images.top": FeatureSpec((3, 48, 64), "image"),
                        "observation.images.wrist": FeatureSpec((3, 48, 64), "image")}
    again = make(str(tmp_path / "ck"), "--joints", "5", "--cameras", "top")
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    small = make(str(tmp_path / "small"), "--joints", "2", "--cameras", "top", "--image-size", "16x16")
    assert small.returncode == 2 and "at least 32x32" in small.stderr and "Traceback" not in small.stderr
