"""The behaviour tree against a real policy node (subprocess): pause guard, snapshot, rollback, restore."""
from __future__ import annotations

import importlib.util
import time

import py_trees
import pytest
from py_trees.common import Status

from flashrt_ros.bt import PolicyPaused, Restore, Rollback, Snapshot
from node_fixtures import ros_node  # noqa: F401 - fixture
from rosproc import REPO, NodeUnderTest
from waiting import scaled


@pytest.fixture(scope="module")
def policy_node(tmp_path_factory):
    n = NodeUnderTest(tmp_path_factory.mktemp("bt"), "bt", {
        "engine_kind": "policy", "policy": "gru", "device": "cpu", "qos_deadline_factor": "0.0"})
    n.wait_active()
    yield n
    assert n.stop() == 0, n.log.read_text()
    assert "Traceback" not in n.log.read_text(), n.log.read_text()


@pytest.fixture(scope="module")
def client(policy_node, ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient
    return FlashRTClient(ros_node, f"{policy_node.namespace}/flashrt")


@pytest.fixture(scope="module")
def run_tree(policy_node, ros_node):  # noqa: F811
    """Tick a tree at 50 Hz while feeding the policy observations; returns the max tick time."""
    from std_msgs.msg import Float32MultiArray
    pub = ros_node.create_publisher(Float32MultiArray, f"{policy_node.namespace}/flashrt/observation", 10)

    def run(root: py_trees.behaviour.Behaviour, timeout_s: float = 60.0) -> float:
        worst, deadline, i = 0.0, time.monotonic() + scaled(timeout_s), 0
        while time.monotonic() < deadline:
            pub.publish(Float32MultiArray(data=[0.1 * (i % 7), -0.2, 0.0, 0.05, 0.5, -0.5]))
            t0 = time.perf_counter()
            root.tick_once()
            worst = max(worst, time.perf_counter() - t0)
            if root.status is not Status.RUNNING:
                break
            i += 1
            time.sleep(0.02)
        return worst

    # DDS discovery between processes takes a moment: feed observations until the
    # policy answers with actions, so the tree starts on a policy that is really stepping.
    actions = []
    sub = ros_node.create_subscription(Float32MultiArray, f"{policy_node.namespace}/flashrt/action",
                                       actions.append, 10)
    deadline = time.monotonic() + scaled(60)
    while not actions and time.monotonic() < deadline:
        pub.publish(Float32MultiArray(data=[0.0, 0.0, 0.0, 0.0, 0.5, -0.5]))
        time.sleep(0.02)
    assert actions, "the policy node never published an action"
    yield run
    ros_node.destroy_subscription(sub)
    ros_node.destroy_publisher(pub)


def _failures(root):
    return [(b.name, b.status, b.feedback_message) for b in root.iterate()]


def test_tree_snapshots_rolls_back_and_restores(client, run_tree):
    before = Snapshot("snapshot before", client, "bt_before", overwrite=True)
    after = Snapshot("snapshot after", client, "bt_after", overwrite=True)
    rollback = Rollback("undo two steps", client, 2)
    restore = Restore("restore before", client, "bt_before", verify=True)
    root = py_trees.composites.Sequence("interrupt and resume", memory=True, children=[
        py_trees.timers.Timer("let the policy run", duration=0.5), before,
        py_trees.timers.Timer("keep running", duration=0.3), after, rollback, restore])

    run_tree(root)      # that ticks never wait on a response is proven with a fake client in
    assert root.status is Status.SUCCESS, _failures(root)    # test_policy_bt_behaviours, not by timing
    assert 0 < before.response.capsule.position < after.response.capsule.position
    assert rollback.response.position >= 0
    assert restore.response.capsule.position == before.response.capsule.position


def test_failed_service_is_failure_with_the_node_message(client, run_tree):
    missing = Restore("restore missing", client, "bt_never_taken")
    run_tree(missing)
    assert missing.status is Status.FAILURE
    assert "NOT_FOUND" in missing.feedback_message and "bt_never_taken" in missing.feedback_message


def test_example_tree_runs_interrupt_cycles_against_the_node(policy_node):
    spec = importlib.util.spec_from_file_location("bt_example", REPO / "examples" / "interrupt_and_resume.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # a condition, not a time budget: run until two cycles succeeded and the world moved (or 120 s)
    counts = example.run(f"{policy_node.namespace}/flashrt", seconds=120.0,
                         until=lambda c: c["succeeded"] >= 2 and c["world_steps"] > 30)
    assert counts["succeeded"] >= 2 and counts["failed"] == 0
    assert counts["world_steps"] > 30, "the node's actions must drive the simulated world"


# Runs last: a node that mishandles Trigger responses dies here, and would take the tests above with it.
def test_pause_guard_holds_the_policy_still_then_resumes_it(client, run_tree):
    p1 = Snapshot("paused 1", client, "bt_p1", overwrite=True)
    p2 = Snapshot("paused 2", client, "bt_p2", overwrite=True)
    resumed = Snapshot("resumed", client, "bt_resumed", overwrite=True)
    while_paused = py_trees.composites.Sequence("while paused", memory=True, children=[
        p1, py_trees.timers.Timer("hold", duration=0.3), p2])
    root = py_trees.composites.Sequence("pause and resume", memory=True, children=[
        py_trees.timers.Timer("let the policy run", duration=0.3),
        PolicyPaused("pause guard", client, while_paused),
        py_trees.timers.Timer("running again", duration=0.3), resumed])

    run_tree(root)
    assert root.status is Status.SUCCESS, _failures(root)
    assert p1.response.capsule.position == p2.response.capsule.position, "the paused policy must not step"
    assert resumed.response.capsule.position > p2.response.capsule.position, "the resumed policy must step"
