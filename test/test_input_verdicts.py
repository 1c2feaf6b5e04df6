"""The inputs' verdict as a user reads it (issue #50, items 2 and 3), against a real policy node
(CPU, ``run_mode: goal``, JointState input of six joints):

* an idle node (no goal) with its sensors publishing says ``fresh``, and ``stale`` once they stop;
* a JointState lacking joints is refused, not "no message yet": ``~/status``, the goal's waiting
  feedback, ``flashrt run-policy``'s lines and the goal's result (``INPUT_REJECTED``) all say the
  same text.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from sensor_msgs.msg import JointState

from flashrt_ros.runtime.errors import ErrorCode
from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from policy_io_harness import Feeder
from rosproc import ros_env
from waiting import wait_until

JOINTS = [f"j{i}" for i in range(1, 7)]
PARAMS = {"engine_kind": "policy", "policy": "gru", "device": "cpu", "control_rate_hz": "20.0",
          "run_mode": "goal", "status_period_s": "0.2", "max_observation_age_s": "1.0",
          "input_joint_state_topic": "/verdicts/joint_states",
          "input_joint_names": "[" + ", ".join(JOINTS) + "]"}


def joint_state(names):
    return lambda i: JointState(name=names, position=[0.01 * (i % 7)] * len(names))


@pytest.fixture(scope="module")
def node(tmp_path_factory, ros_node):  # noqa: F811
    with active_node(tmp_path_factory.mktemp("verdicts"), "verdicts", PARAMS) as n:
        client = client_of(n, ros_node)
        wait_until(lambda: client.run_policy_ready(), 60, "the node's action server")
        yield n, client


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", "/verdicts/flashrt", *args],
                          capture_output=True, text=True, env=ros_env(), timeout=300)


def fields(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)


def test_an_idle_node_with_publishing_sensors_says_its_inputs_are_fresh(node, ros_node):  # noqa: F811
    _n, client = node
    feeder = Feeder(ros_node, "/verdicts/joint_states", joint_state(JOINTS), period_s=0.05, msg_type=JointState)
    try:
        wait_until(lambda: client.status().inputs_state == "fresh", what="an idle node to report fresh inputs")
        r = cli("status")
        assert r.returncode == 0, r.stderr
        shown = fields(r.stdout)
        assert shown["inputs_state"] == "fresh" and shown["busy"] == "False", r.stdout
        assert int(shown["policy_steps"]) == 0, "no goal ran: the verdict came without a step"
    finally:
        feeder.stop()
    status = wait_until(lambda: (s := client.status()).inputs_state == "stale" and s, what="stale once fed no more")
    assert "stale: /verdicts/joint_states" in status.inputs_detail and status.policy_steps == 0


def test_a_joint_state_lacking_joints_is_reported_as_refused_with_one_text_everywhere(node, ros_node):  # noqa: F811
    _n, client = node
    feeder = Feeder(ros_node, "/verdicts/joint_states", joint_state(JOINTS[:3]), period_s=0.05,
                    msg_type=JointState)
    try:
        status = wait_until(lambda: (s := client.status()).inputs_state == "error" and s,
                            what="the refused joint states in ~/status")
        detail = status.inputs_detail
        assert detail.startswith("input messages refused: /verdicts/joint_states: JointState lacks joint(s) "
                                 "['j4', 'j5', 'j6'] of input_joint_names"), detail
        assert status.rejected_messages > 0
        waiting: list = []
        outcome = client.run_policy(max_steps=5, stale_timeout_s=1.5, wait_s=60,
                                    feedback=lambda fb: waiting.append(fb) if fb.state == "waiting" else None)
        result = outcome.result
        assert not result.success and result.error_code == ErrorCode.INPUT_REJECTED, result.message
        assert result.stop_reason == "input_rejected" and result.message.endswith(detail), result.message
        assert waiting and all(fb.waiting_for == detail for fb in waiting), [fb.waiting_for for fb in waiting]

        r = cli("run-policy", "--max-steps", "5", "--stale-timeout", "2")
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"after 0 steps: {detail}" in r.stdout, r.stdout
        assert "no message yet" not in r.stdout + r.stderr
        assert "error (INPUT_REJECTED): run_policy goal ended after 0 steps" in r.stderr and detail in r.stderr
    finally:
        feeder.stop()
