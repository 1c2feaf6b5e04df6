"""A goal request sent again under its own id never starts a second goal, and a copy the node refuses because it
already knows the goal is reported as accepted (issue #55, item 2). Against a real rclpy action server (the node's
own kind: ``result_timeout`` = ``GOAL_RETENTION_S``) with the node's heartbeat beside it; the client's goal reply
and the action's status are dropped on purpose, so only a copy can answer the goal."""
from __future__ import annotations

import threading
import time

import pytest
from rclpy.action import ActionServer, GoalResponse

from policy_io_harness import RosHarness
from waiting import wait_until
from flashrt_ros.action import RunPolicy
from flashrt_ros.interface.goals import GOAL_RESEND_HORIZON_S, GOAL_RETENTION_S, goal_id_hex

NS = "/copies/flashrt"


class Server:
    """``run_policy`` on a real rclpy ActionServer: each goal runs ``run_s`` and succeeds; executions counted."""

    def __init__(self, harness: RosHarness) -> None:
        import rclpy
        from flashrt_ros.ros.node_beacon import NodeBeacon
        self.node = rclpy.create_node("flashrt", namespace="/copies")
        harness.executor.add_node(self.node)
        self.run_s = 0.0
        self.executed: list[str] = []
        self.running: set[str] = set()
        self._lock = threading.Lock()
        self.server = ActionServer(self.node, RunPolicy, "~/run_policy", execute_callback=self._execute,
                                   goal_callback=lambda _goal: GoalResponse.ACCEPT, result_timeout=GOAL_RETENTION_S)
        self.beacon = NodeBeacon(self.node, lambda: "active", lambda: sorted(self.running), period_s=0.2)

    def _execute(self, handle):
        goal = goal_id_hex(handle.goal_id)
        with self._lock:
            self.executed.append(goal)
            self.running.add(goal)
        time.sleep(self.run_s)
        with self._lock:
            self.running.discard(goal)
        handle.succeed()
        return RunPolicy.Result(success=True, message="ran", stop_reason="max_steps")

    def close(self, harness: RosHarness) -> None:
        self.beacon.destroy()
        harness.executor.remove_node(self.node)
        self.node.destroy_node()


@pytest.fixture(scope="module")
def harness():
    h = RosHarness()
    yield h
    h.close()


@pytest.fixture
def setup(harness):
    from flashrt_ros.client import FlashRTClient
    server = Server(harness)
    client = FlashRTClient(harness.peer, NS)
    action = client._run_policy
    sent: list[bytes] = []
    real_send, real_execute = action.send_goal_async, action.execute
    dropped = {"goal": 0}

    def send(goal, *args, **kwargs):
        sent.append(bytes(kwargs["goal_uuid"].uuid))
        return real_send(goal, *args, **kwargs)

    async def execute(taken_data):
        if "goal" in taken_data and dropped["goal"] == 0:       # the first goal reply never arrives
            dropped["goal"] += 1
            taken_data = {k: v for k, v in taken_data.items() if k != "goal"}
        return await real_execute(taken_data)
    object.__setattr__(action, "send_goal_async", send)
    object.__setattr__(action, "execute", execute)
    client._on_goal_status = lambda _client, _msg: None          # ... nor does the action's status
    wait_until(lambda: client.node_active() is True and client.run_policy_ready(), 60, "the server and its beat")
    yield server, client, sent, dropped
    client.close()
    server.close(harness)


@pytest.mark.parametrize("run_s", [0.0, 4.0], ids=["copy-after-the-end", "copy-while-running"])
def test_a_refused_copy_of_a_known_goal_is_its_acceptance_and_the_goal_runs_once(setup, run_s):
    """The first request's reply and the status are lost; the copy (2 s later, same id) is refused by rclpy as
    a tracked id. Running: the node's heartbeat lists the goal. Ended: the get-result probe finds the retained
    result. Either way the client reports the goal accepted with its result, and it ran once (before: "not
    accepted", and the lease released while the goal ran)."""
    server, client, sent, dropped = setup
    server.run_s = run_s
    outcome = client.run_policy(max_steps=1, wait_s=30.0, timeout_s=60.0, feedback_grace_s=0.0)
    assert dropped["goal"] == 1 and len(sent) >= 2 and len(set(sent)) == 1, (dropped, sent)
    assert outcome.accepted and outcome.result.success and outcome.result.message == "ran"
    assert server.executed == [sent[0].hex()]                      # one execution, under the one id


def test_a_copy_is_sent_only_inside_the_servers_retention():
    """A copy arriving after rclpy forgot the goal (``result_timeout``: 10 s by default) would be accepted as
    new and run twice; our servers keep goals ``GOAL_RETENTION_S`` and clients stop copying well before."""
    from flashrt_ros.client.goals import REQUEST_RESEND_MAX_S
    assert GOAL_RESEND_HORIZON_S + REQUEST_RESEND_MAX_S < GOAL_RETENTION_S / 2


def test_the_nodes_action_servers_keep_goals_for_the_retention(harness, monkeypatch):
    import rclpy
    from flashrt_ros.ros import generate_action, policy_action
    from flashrt_ros.ros.goals import GoalBook
    made = []

    class Capture:
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
    for module in (policy_action, generate_action):
        monkeypatch.setattr(module, "ActionServer", Capture)
    node = rclpy.create_node("retention_probe")
    try:
        policy_action.PolicyActionServer(node, None, lambda: None, lambda: None, GoalBook())
        generate_action.GenerateActionServer(node, None, lambda: None, lambda: False, lambda: None, GoalBook(),
                                             lambda: False)
    finally:
        node.destroy_node()
    assert [m["result_timeout"] for m in made] == [GOAL_RETENTION_S, GOAL_RETENTION_S]
