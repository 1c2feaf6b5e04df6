"""A SmolVLA policy node takes its language instruction from ``~/instruction`` (std_msgs/String), in-process DDS."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import Float32MultiArray, String

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.interface.robot_io_params import RobotIOConfig
from policy_io_harness import Feeder, RosHarness, wait_until
from test_smolvla_capsules import tiny_policy

WORDS = ["[UNK]", "pick", "up", "the", "red", "cube", "stack", "it"]


@pytest.fixture(scope="module")
def ros():
    harness = RosHarness()
    yield harness
    harness.close()


def word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def test_an_instruction_on_the_topic_becomes_the_policys_instruction(ros, tmp_path):
    from flashrt_ros.ros.policy_io import PolicyTopics
    policy = tiny_policy()
    policy.tokenizer_file = word_tokenizer(tmp_path / "tokenizer.json")
    engine = PolicyEngine(policy, directory=str(tmp_path / "caps"))
    io = RobotIOConfig(input_state_topic="/vla_topic/state", input_image_topics=("/vla_topic/top",),
                       output_topic="/vla_topic/action")
    policy_io = PolicyTopics(ros.peer, engine, SimpleNamespace(control_rate_hz=20.0, qos_depth=1,
                                                           qos_deadline_factor=0.0), io, None)
    actions = ros.collect(Float32MultiArray, "/vla_topic/action")
    frame = Image(height=24, width=40, encoding="rgb8", step=120, data=bytes(range(256)) * 11 + bytes(64))
    camera = Feeder(ros.peer, "/vla_topic/top", lambda i: frame, msg_type=Image)
    state = Feeder(ros.peer, "/vla_topic/state", lambda i: Float32MultiArray(data=[0.1, 0.2, 0.3, 0.4]))
    topic = ros.peer.resolve_topic_name("~/instruction")
    pub = ros.peer.create_publisher(String, topic, QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                                              durability=DurabilityPolicy.TRANSIENT_LOCAL))
    try:
        wait_until(lambda: len(actions) >= 3, what="actions before any instruction")
        pub.publish(String(data="pick up the red cube"))
        wait_until(lambda: int(engine.arena[policy.LANG_LEN]) == 5, what="the instruction in the arena")
        assert engine.arena[policy.LANG][:5].tolist() == [1, 2, 3, 4, 5]
        before = len(actions)
        wait_until(lambda: len(actions) >= before + 3, what="actions under the new instruction")
    finally:
        camera.stop()
        state.stop()
        policy_io.destroy()
        engine.close()
    assert all(torch.isfinite(torch.tensor(a.data)).all() for a in actions)
