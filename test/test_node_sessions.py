"""Sessions, pin/unpin and runtime parameters through a real node (subprocess; SmolLM2 on the CPU,
see test_node_services.py for why the tiny params file does not reach it)."""
from __future__ import annotations

import threading
import time

import pytest

from flashrt_ros.runtime.errors import ErrorCode
from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture

TURNS_A = ["the robot picks up", " and then it"]
TURNS_B = ["once upon a time", " so the king"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_node):  # noqa: F811
    """``(node, client)``: one tiny-Llama node for the whole module."""
    with active_node(tmp_path_factory.mktemp("sess"), "sess") as n:
        yield n, client_of(n, ros_node)


@pytest.fixture
def client(served):
    return served[1]


def turn(client, prompt: str, first: bool, **kw) -> list[int]:
    """One conversation turn: sampled (seeded on the first turn, the stream continues after)."""
    outcome = client.generate(prompt, max_new_tokens=10, use_chat_template=False, timeout_s=120,
                              temperature=0.8, top_k=20, seed=7 if first else 0, **kw)
    assert outcome.accepted and outcome.result.success, outcome.result.message
    return list(outcome.result.token_ids)


def latest_status(ros_node, topic: str, predicate, timeout: float = 30.0):  # noqa: F811
    """Wait for an EngineStatus on ``topic`` that satisfies ``predicate``; returns it (or the last one)."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from flashrt_ros.msg import EngineStatus
    seen: list = []
    hit = threading.Event()

    def on_status(msg):
        seen.append(msg)
        if predicate(msg):
            hit.set()

    qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
    sub = ros_node.create_subscription(EngineStatus, topic, on_status, qos)
    try:
        hit.wait(timeout)
    finally:
        ros_node.destroy_subscription(sub)
    return seen[-1] if seen else None


def set_parameter(ros_node, node_name: str, name: str, value):  # noqa: F811
    """Set one parameter of the node through its ~/set_parameters service; returns the result."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    client = ros_node.create_client(SetParameters, f"{node_name}/set_parameters")
    try:
        assert client.wait_for_service(timeout_sec=30)
        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        future = client.call_async(request)
        deadline = time.monotonic() + 30
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert future.done(), "no answer from set_parameters"
        return future.result().results[0]
    finally:
        ros_node.destroy_client(client)


def test_interleaved_conversations_match_each_run_alone(client, ros_node, served):  # noqa: F811
    alone_a = [turn(client, TURNS_A[0], True, reset=True), turn(client, TURNS_A[1], False)]
    alone_b = [turn(client, TURNS_B[0], True, reset=True), turn(client, TURNS_B[1], False)]
    assert alone_a != alone_b

    interleaved_a, interleaved_b = [], []
    interleaved_a.append(turn(client, TURNS_A[0], True, session="alice"))
    interleaved_b.append(turn(client, TURNS_B[0], True, session="bob"))
    client.call("snapshot", name="bob_mid")                 # tagged with the current session
    interleaved_a.append(turn(client, TURNS_A[1], False, session="alice"))
    interleaved_b.append(turn(client, TURNS_B[1], False, session="bob"))

    assert interleaved_a == alone_a
    assert interleaved_b == alone_b
    listed = client.call("list", session="bob").capsules
    assert [c.name for c in listed] == ["bob_mid"] and listed[0].session == "bob"
    assert all(not c.name.startswith(".") for c in client.call("list").capsules)   # parked ones hidden
    status = latest_status(ros_node, f"{served[0].namespace}/flashrt/status", lambda m: m.session == "bob")
    assert status is not None and status.session == "bob", status
    assert status.live_bytes > 0 and status.live_bytes <= status.arena_bytes


def test_a_bad_session_name_is_refused_and_changes_nothing(client):
    before = turn(client, "hello", True, session="carol")
    outcome = client.generate("x", max_new_tokens=2, session="../evil", timeout_s=60)
    assert outcome.accepted and not outcome.result.success
    assert outcome.result.error_code == int(ErrorCode.INVALID_NAME), outcome.result.message
    client.call("snapshot", name="carol_now", overwrite=True)
    assert client.call("list", session="carol").capsules[-1].name == "carol_now"   # still carol
    assert len(before) == 10


def test_pin_and_unpin_over_ros(client):
    client.call("snapshot", name="keep", overwrite=True)
    pinned = client.call("pin", name="keep")
    assert pinned.capsule.pinned
    refused = client.call("drop", name="keep", check=False)
    assert not refused.success and refused.error_code == int(ErrorCode.PINNED), refused.message
    assert not client.call("unpin", name="keep").capsule.pinned
    assert client.call("drop", name="keep").success
    missing = client.call("pin", name="no_such_capsule", check=False)
    assert not missing.success and missing.error_code == int(ErrorCode.NOT_FOUND)


def test_runtime_parameters_apply_live_or_are_refused(client, ros_node, served):  # noqa: F811
    name = f"{served[0].namespace}/flashrt"
    assert set_parameter(ros_node, name, "max_new_tokens", 5).successful
    outcome = client.generate("count", max_new_tokens=0, use_chat_template=False, reset=True, timeout_s=60)
    assert outcome.result.success and len(outcome.result.token_ids) == 5   # random model: no stop token
    assert set_parameter(ros_node, name, "default_tier", "host").successful
    assert client.call("snapshot", name="tiered", overwrite=True).capsule.tier == "host"
    assert set_parameter(ros_node, name, "default_tier", "device").successful
    assert client.call("snapshot", name="tiered", overwrite=True).capsule.tier == "device"
    refused = set_parameter(ros_node, name, "boundary_timeout_s", 1.0)
    assert not refused.successful and "read-only" in refused.reason.lower(), refused.reason


def test_policy_status_reports_busy_live_bytes_and_session(tmp_path, ros_node):  # noqa: F811
    from std_msgs.msg import Float32MultiArray
    with active_node(tmp_path, "pstat", {"engine_kind": "policy", "policy": "gru", "device": "cpu",
                                          "qos_deadline_factor": "0.0"}) as n:
        client = client_of(n, ros_node)
        topic = f"{n.namespace}/flashrt/status"
        pub = ros_node.create_publisher(Float32MultiArray, f"{n.namespace}/flashrt/observation", 10)
        stop = threading.Event()

        def feed():
            while not stop.is_set():
                pub.publish(Float32MultiArray(data=[0.0, 0.1, 0.0, 0.0, 0.5, -0.5]))
                stop.wait(0.02)

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            running = latest_status(ros_node, topic, lambda m: m.busy and m.position > 0, timeout=60)
            assert running is not None and running.busy and running.position > 0, running
            assert running.session == "default" and 0 < running.live_bytes <= running.arena_bytes
            client.call("pause")
            paused = latest_status(ros_node, topic, lambda m: not m.busy, timeout=30)
            assert paused is not None and not paused.busy, paused
        finally:
            stop.set()
            feeder.join(5)
            ros_node.destroy_publisher(pub)


def test_close_session_frees_a_parked_session_and_refuses_the_current_one(client):
    first = turn(client, "the robot picks up", True, session="to_close", reset=True)
    turn(client, "once upon a time", True, session="keeper", reset=True)
    current = client.call("close_session", session="keeper", check=False)
    assert not current.success and current.error_code == int(ErrorCode.INVALID_ARGUMENT), current.message
    closed = client.call("close_session", session="to_close", check=False)
    assert closed.success, closed.message
    again = client.call("close_session", session="to_close", check=False)
    assert not again.success and again.error_code == int(ErrorCode.NOT_FOUND), again.message
    bad = client.call("close_session", session="../x", check=False)
    assert not bad.success and bad.error_code == int(ErrorCode.INVALID_NAME), bad.message
    # the closed session's transcript is gone: the same opening starts cold and draws the same tokens
    assert turn(client, "the robot picks up", True, session="to_close") == first
