"""py_trees RunPolicy, Reset and SwitchSession against a real policy node (CPU, run_mode=goal)."""
from __future__ import annotations

import time

import py_trees
import pytest
from py_trees.common import Status

from bt_harness import POLICY_PARAMS, ObservationFeed, wait_until
from flashrt_ros.bt import Reset, RunPolicy, Snapshot, SwitchSession
from node_fixtures import ros_node  # noqa: F401 - fixture
from rosproc import NodeUnderTest


@pytest.fixture(scope="module")
def policy_node(tmp_path_factory):
    n = NodeUnderTest(tmp_path_factory.mktemp("btpy"), "btpy", POLICY_PARAMS)
    n.wait_active()
    yield n
    assert n.stop() == 0, n.log.read_text()
    assert "Traceback" not in n.log.read_text(), n.log.read_text()


@pytest.fixture(scope="module")
def client(policy_node, ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient
    feed = ObservationFeed(ros_node, policy_node)
    c = FlashRTClient(ros_node, f"{policy_node.namespace}/flashrt")
    wait_until(lambda: c.run_policy_ready() and c.wait_for("snapshot", 0.0), 60, "the node's servers")
    yield c
    feed.close(ros_node)


def tick_until(root: py_trees.behaviour.Behaviour, done=None, timeout_s: float = 60.0) -> None:
    """Tick at ~100 Hz until the root finished (or ``done()``); generous deadline for a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        root.tick_once()
        if (done is not None and done()) or (done is None and root.status is not Status.RUNNING):
            return
        time.sleep(0.01)
    raise AssertionError(f"tree still {root.status} after {timeout_s:g} s: "
                         f"{[(b.name, b.status, b.feedback_message) for b in root.iterate()]}")


def snapshot_position(client, name: str) -> int:
    b = Snapshot(f"snapshot {name}", client, name, overwrite=True)
    tick_until(b)
    assert b.status is Status.SUCCESS, b.feedback_message
    return int(b.response.capsule.position)


def test_run_policy_runs_exactly_max_steps(client):
    start = snapshot_position(client, "py_start")
    run = RunPolicy("run 5", client, max_steps=5)
    tick_until(run)
    assert run.status is Status.SUCCESS, run.feedback_message
    assert run.result.steps == 5 and run.result.stop_reason == "max_steps"
    assert snapshot_position(client, "py_after") == start + 5, "run_mode=goal: no step outside the goal"


@pytest.mark.parametrize("rollback", [False, True])
def test_halt_stops_at_a_committed_boundary_and_rolls_back_when_asked(client, rollback):
    start = snapshot_position(client, "py_halt_start")
    run = RunPolicy("run long", client, max_steps=100000, rollback_on_cancel=rollback)
    tick_until(run, done=lambda: run.steps >= 3)
    assert run.status is Status.RUNNING
    run.stop(Status.INVALID)                   # what a higher-priority branch does to it
    after = snapshot_position(client, "py_halt_after")   # waits until the cancelled goal reported
    result = run.request.result_future.result().result
    assert result.stop_reason == "cancelled" and result.rolled_back is rollback and result.steps >= 3
    if rollback:
        assert after == start
        assert client.call("verify", name="py_halt_start", against_live=True).matches_live
    else:
        assert after == start + result.steps, "the state is exactly the goal's last committed step"


def test_failing_goal_fails_the_behaviour_with_the_error_code(client):
    run = RunPolicy("no limit", client)          # neither max_steps nor max_duration_s: refused by the node
    tick_until(run)
    assert run.status is Status.FAILURE
    assert run.error_code == 10 and "INVALID_ARGUMENT" in run.feedback_message


def test_reset_and_switch_session(client):
    tick_until(RunPolicy("warm", client, max_steps=3))
    before = snapshot_position(client, "py_sess_a")
    assert before > 0
    switch = SwitchSession("to b", client, "py_b")
    tick_until(switch)
    assert switch.status is Status.SUCCESS, switch.feedback_message
    assert switch.response.previous_session == "default"
    assert snapshot_position(client, "py_in_b") == 0, "a new session starts empty"
    tick_until(RunPolicy("in b", client, max_steps=2))
    reset = Reset("reset b", client)
    tick_until(reset)
    assert reset.status is Status.SUCCESS, reset.feedback_message
    assert snapshot_position(client, "py_b_reset") == 0
    back = SwitchSession("back", client, "default")
    tick_until(back)
    assert back.status is Status.SUCCESS and back.response.previous_session == "py_b"
    assert client.call("verify", name="py_sess_a", against_live=True).matches_live, \
        "the parked session comes back exactly"
    bad = SwitchSession("bad", client, "")
    tick_until(bad)
    assert bad.status is Status.FAILURE and bad.error_code == 10
