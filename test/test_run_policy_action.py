"""RunPolicy goals (exact max_steps, cancel at a boundary) and rollback_on_cancel for
RunPolicy and Generate (in-process node, real DDS)."""
from __future__ import annotations

import threading

import pytest
from rclpy.action import ActionClient
from rclpy.parameter import Parameter
from std_msgs.msg import Float32MultiArray

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.client.action_client import RaceFreeActionClient  # the peer is already spinning
from policy_io_harness import Feeder, RosHarness, wait_until

OBS = lambda i: Float32MultiArray(data=[0.01 * (i % 13), -0.2, 0.0, 0.05, 0.5, -0.5])  # noqa: E731


@pytest.fixture(scope="module")
def ros():
    harness = RosHarness()
    yield harness
    harness.close()


def _send(client: ActionClient, goal, feedback=None):
    assert client.wait_for_server(timeout_sec=30)
    future = client.send_goal_async(goal, feedback_callback=feedback)
    handle = wait_until(lambda: future.done() and future.result(), what="goal response")
    return handle


def _result(handle):
    future = handle.get_result_async()
    return wait_until(lambda: future.done() and future.result(), timeout=60, what="result").result


@pytest.fixture(scope="module")
def goal_node(ros, tmp_path_factory):
    node = ros.policy_node("runp", tmp_path_factory.mktemp("runp"), run_mode="goal")
    feeder = Feeder(ros.peer, "/runp/flashrt/observation", OBS)
    yield node
    feeder.stop()


def test_policy_steps_only_during_a_goal_and_max_steps_is_exact(ros, goal_node):
    actions = ros.collect(Float32MultiArray, "/runp/flashrt/action")
    wait_until(lambda: goal_node._policy_io.inputs.has_new(), what="observations at the node")
    assert goal_node._policy_io.steps == 0 and not actions           # run_mode=goal: idle
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/runp/flashrt/run_policy")
    feedback: list = []
    handle = _send(client, RunPolicy.Goal(max_steps=7), feedback.append)
    assert handle.accepted
    result = _result(handle)
    assert result.success and result.stop_reason == "max_steps" and result.steps == 7
    wait_until(lambda: len(actions) == 7, what="the goal's 7 actions")
    assert goal_node._policy_io.steps == 7
    assert feedback and feedback[-1].feedback.steps == 7 and len(feedback[-1].feedback.last_action) == 2


def test_a_goal_must_end_by_itself(ros, goal_node):
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/runp/flashrt/run_policy")
    result = _result(_send(client, RunPolicy.Goal()))
    assert not result.success and result.stop_reason == "error" and "max_steps" in result.message


@pytest.mark.parametrize("rollback", [True, False])
def test_cancel_stops_at_a_boundary_and_rolls_back_when_asked(ros, goal_node, rollback):
    goal_node.set_parameters([Parameter("rollback_on_cancel", value=rollback)])
    engine = goal_node._engine
    start = engine.position
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/runp/flashrt/run_policy")
    progressed = threading.Event()
    handle = _send(client, RunPolicy.Goal(max_duration_s=60.0),
                   lambda fb: fb.feedback.steps >= 3 and progressed.set())
    assert progressed.wait(30)
    handle.cancel_goal_async()
    result = _result(handle)
    assert result.success and result.stop_reason == "cancelled" and result.steps >= 3
    assert result.rolled_back is rollback
    expected = start if rollback else start + result.steps
    assert engine.position == expected
    assert not [c for c in engine.capsules.list() if c.name.startswith("goal-")]   # no capsule left behind


def test_a_cancelled_goal_sent_one_feedback_per_reported_step(ros, goal_node):
    from unique_identifier_msgs.msg import UUID

    from flashrt_ros.interface.qos import FEEDBACK_QOS
    goal_node.set_parameters([Parameter("rollback_on_cancel", value=False)])
    received: list = []
    ros.peer.create_subscription(RunPolicy.Impl.FeedbackMessage, "/runp/flashrt/run_policy/_action/feedback",
                                 received.append, FEEDBACK_QOS.profile())
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/runp/flashrt/run_policy")
    assert client.wait_for_server(timeout_sec=30)
    goal_id = UUID(uuid=list(range(16)))
    future = client.send_goal_async(RunPolicy.Goal(max_duration_s=60.0), goal_uuid=goal_id)
    handle = wait_until(lambda: future.done() and future.result(), what="goal response")
    mine = lambda: [m.feedback.steps for m in list(received) if list(m.goal_id.uuid) == list(range(16))]  # noqa: E731
    wait_until(lambda: len(mine()) >= 4, what="four feedback messages")
    handle.cancel_goal_async()
    result = _result(handle)
    assert result.stop_reason == "cancelled" and result.steps >= 4
    # feedback and result travel on different topics: wait for the feedback to catch up
    wait_until(lambda: len(mine()) >= result.steps, what=f"{result.steps} feedback messages")
    assert mine() == list(range(1, result.steps + 1))           # one per step, in order, none extra


def test_a_goal_runs_in_its_session(ros, goal_node):
    engine = goal_node._engine
    home, start = engine.capsules.sessions.current, engine.position
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/runp/flashrt/run_policy")
    result = _result(_send(client, RunPolicy.Goal(max_steps=3, session="episode2")))
    assert result.success and result.steps == 3
    assert engine.capsules.sessions.current == "episode2" and engine.position == 3   # a new session starts cold
    result = _result(_send(client, RunPolicy.Goal(max_steps=1, session=home)))
    assert result.success and engine.capsules.sessions.current == home
    assert engine.position == start + 1                                             # home continued where it was


def test_cancelled_generation_rolls_back_when_asked(ros, tmp_path):
    from flashrt_ros.ros.node import FlashRTNode
    node = FlashRTNode("flashrt", namespace="/genrb", parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            "engine_kind": "llm", "model": "random-llama-tiny", "device": "cpu", "max_context": 1024,
            "capsule_directory": str(tmp_path / "c"), "rollback_on_cancel": True}.items()])
    ros.executor.add_node(node)
    ros.nodes.append(node)
    node.trigger_configure()
    node.trigger_activate()
    client = RaceFreeActionClient(ros.peer, Generate, "/genrb/flashrt/generate")
    first = _result(_send(client, Generate.Goal(prompt="hello there", max_new_tokens=4, reset=True)))
    assert first.success
    start = node._engine.status()["position"]
    started = threading.Event()
    handle = _send(client, Generate.Goal(max_new_tokens=900), lambda fb: started.set())
    assert started.wait(60)
    handle.cancel_goal_async()
    result = _result(handle)
    assert result.stop_reason == "cancelled" and len(result.token_ids) < 900
    assert "rolled back" in result.message
    assert node._engine.status()["position"] == start
