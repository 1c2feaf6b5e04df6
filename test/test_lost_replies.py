"""Lost replies (Fast DDS "failed to send response (timeout)", ros2/ros2#1253): our client and CLI
never hang, re-send a changing verb only under its request id, and cancel a goal whose acceptance was lost.

The server here is a stand-in on real DDS whose replies are dropped on purpose: services of
the node's types, and the Generate action's services and topics, served by hand.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from action_msgs.msg import GoalStatus, GoalStatusArray
from action_msgs.srv import CancelGoal
from rclpy.qos import qos_profile_action_status_default

from flashrt_ros.action import Generate
from flashrt_ros.client import TIMEOUT_CODE, FlashRTClient, ServiceCallError
from flashrt_ros.srv import ListCapsules, Rollback
from policy_io_harness import RosHarness
from waiting import wait_until

NS = "/lossy/flashrt"


class LossyServer:
    """Serves ``list`` (drops the first reply), ``rollback`` (drops every reply) and a Generate
    action whose goal replies (``drop_goal_replies``) or first result reply can be dropped.

    An accepted goal ends at once; its SUCCEEDED status is published after the goal reply, or
    (``publish_status`` False) never reaches the client: rclpy drops a status message it takes
    before the goal's acceptance (no handle to update yet), which a goal that ends at once can be."""

    def __init__(self, node) -> None:
        self.node = node
        self.received: dict[str, list] = {"list": [], "rollback": [], "send_goal": [], "cancel": [],
                                          "get_result": []}
        self.drop_goal_replies = True
        self.publish_status = True
        self.lose_first_goal_request = False     # as if it never arrived: no reply, no status
        self.accept_goals = True
        self._lock = threading.Lock()
        self._lossy(ListCapsules, f"{NS}/list", "list", drop=lambda n: n == 1, fill=self._list)
        self._lossy(Rollback, f"{NS}/rollback", "rollback", drop=lambda n: True, fill=lambda r: None)
        impl = Generate.Impl
        self._lossy(impl.SendGoalService, f"{NS}/generate/_action/send_goal", "send_goal",
                    drop=lambda n: self.drop_goal_replies or self._lost(n), fill=self._accept,
                    after=self._goal_replied)
        self._lossy(CancelGoal, f"{NS}/generate/_action/cancel_goal", "cancel", drop=lambda n: False,
                    fill=lambda r: None)
        self._lossy(impl.GetResultService, f"{NS}/generate/_action/get_result", "get_result",
                    drop=lambda n: n == 1, fill=self._result)
        self.status_pub = node.create_publisher(GoalStatusArray, f"{NS}/generate/_action/status",
                                                qos_profile_action_status_default)
        self.feedback_pub = node.create_publisher(impl.FeedbackMessage, f"{NS}/generate/_action/feedback", 10)

    def _lossy(self, srv_type, name: str, key: str, drop, fill, after=lambda: None) -> None:
        service = self.node.create_service(srv_type, name, lambda req, resp: self._answer(key, req, resp, fill))
        send = service.send_response

        def send_or_drop(response, header):
            with self._lock:
                n = len(self.received[key])
            if not drop(n):
                send(response, header)
            after()
        service.send_response = send_or_drop       # the executor sends through this attribute

    def _answer(self, key: str, request, response, fill):
        with self._lock:
            self.received[key].append(request)
        fill(response)
        return response

    @staticmethod
    def _list(response) -> None:
        response.success, response.message = True, "0 capsules"

    def _lost(self, n: int) -> bool:
        return self.lose_first_goal_request and n == 1

    def _accept(self, response) -> None:
        response.accepted = self.accept_goals

    def _goal_replied(self) -> None:
        with self._lock:
            n = len(self.received["send_goal"])
        if not self.publish_status or self._lost(n) or not self.accept_goals:
            return
        status = GoalStatusArray()
        status.status_list.append(GoalStatus(status=GoalStatus.STATUS_SUCCEEDED))
        status.status_list[0].goal_info.goal_id = self.received["send_goal"][-1].goal_id
        self.status_pub.publish(status)

    @staticmethod
    def _result(response) -> None:
        response.status = GoalStatus.STATUS_SUCCEEDED
        response.result.success, response.result.message = True, "0 tokens"
        response.result.stop_reason = "max_new_tokens"


@pytest.fixture(scope="module")
def ros():
    harness = RosHarness()
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def server(ros):
    import rclpy
    node = rclpy.create_node("lossy_server")
    ros.executor.add_node(node)
    yield LossyServer(node)
    ros.executor.remove_node(node)
    node.destroy_node()


@pytest.fixture(scope="module")
def client(ros, server):
    return FlashRTClient(ros.peer, NS)


def test_a_lost_reply_of_a_safe_verb_is_resent_and_answered(server, client):
    response = client.call("list", timeout_s=60.0, wait_s=60.0)
    assert response.success and response.message == "0 capsules"
    assert len(server.received["list"]) == 2          # the first reply was dropped, the copy answered


def test_a_lost_reply_of_a_changing_verb_is_resent_under_its_request_id(server, client):
    """rollback is not safe to repeat, so every copy carries the first request's id: the node answers a copy
    with the first answer and never rolls back twice (its ledger: test_request_ids.py). This stand-in drops every
    reply, so the call ends in TIMEOUT, bounded, having sent copies under one id."""
    server.received["rollback"].clear()
    start = time.monotonic()
    with pytest.raises(ServiceCallError) as err:
        client.call("rollback", steps=2, timeout_s=5.0, wait_s=60.0)
    assert err.value.error_code == TIMEOUT_CODE and "TIMEOUT" in str(err.value)
    assert "sent 2 times" in str(err.value), str(err.value)
    assert time.monotonic() - start < 60.0            # bounded (generous bound: only "it returned")
    wait_until(lambda: len(server.received["rollback"]) >= 2, what="the rollback and its copy at the server")
    ids = {r.request_id for r in server.received["rollback"]}
    assert len(ids) == 1 and len(next(iter(ids))) == 32, ids


def test_a_goal_whose_acceptance_is_lost_is_cancelled_by_id_never_sent_under_a_new_id(server, client):
    server.drop_goal_replies, server.publish_status = True, False     # nothing says it was accepted
    server.received["send_goal"].clear()
    server.received["cancel"].clear()
    with pytest.raises(ServiceCallError) as err:
        client.generate("hi", wait_s=5.0, timeout_s=60.0)
    assert err.value.error_code == TIMEOUT_CODE and "cancel was sent" in str(err.value)
    sent_ids = {bytes(request.goal_id.uuid) for request in server.received["send_goal"]}
    assert len(sent_ids) == 1, "copies of the request carry the goal's own id (a server refuses a tracked id)"
    wait_until(lambda: server.received["cancel"], what="the cancel at the server")
    assert bytes(server.received["cancel"][0].goal_info.goal_id.uuid) in sent_ids


def test_a_lost_goal_request_is_sent_again_under_the_same_id_and_answered(server, client):
    """The first request never arrives (a server that had not yet matched the client): no reply,
    no status. Its copy, under the same goal id, is accepted and the goal runs to its result
    (before: the client waited out ``wait_s`` and cancelled; CI saw a 60 s wait after a node restart)."""
    server.drop_goal_replies, server.publish_status, server.lose_first_goal_request = False, True, True
    server.received["send_goal"].clear()
    server.received["cancel"].clear()
    try:
        outcome = client.generate("hi", wait_s=60.0, timeout_s=120.0, feedback_grace_s=0.0)
    finally:
        server.lose_first_goal_request = False
    assert outcome.accepted and outcome.result.success and outcome.result.message == "0 tokens"
    sent_ids = [bytes(request.goal_id.uuid) for request in server.received["send_goal"]]
    assert len(sent_ids) >= 2 and len(set(sent_ids)) == 1 and server.received["cancel"] == []


def test_a_refused_copy_of_a_lost_goal_request_is_the_answer(server, client):
    """The copy is refused and no status names the goal: the client reports the refusal (it does
    not wait out ``wait_s``)."""
    server.drop_goal_replies, server.publish_status, server.lose_first_goal_request = False, True, True
    server.accept_goals = False
    server.received["send_goal"].clear()
    try:
        outcome = client.generate("hi", wait_s=60.0, timeout_s=120.0, feedback_grace_s=0.0)
    finally:
        server.lose_first_goal_request, server.accept_goals = False, True
    assert not outcome.accepted
    assert len(server.received["send_goal"]) >= 2


def test_a_lost_acceptance_is_recovered_from_the_status_topic(server, client):
    """The status lists the goal: it was accepted, so the client goes on as if the reply had come."""
    server.drop_goal_replies, server.publish_status = True, True
    server.received["send_goal"].clear()
    server.received["cancel"].clear()
    outcome = client.generate("hi", wait_s=60.0, timeout_s=120.0, feedback_grace_s=0.0)
    assert outcome.accepted and outcome.result.success and outcome.result.message == "0 tokens"
    assert len(server.received["send_goal"]) == 1 and server.received["cancel"] == [], "never re-sent nor cancelled"


@pytest.mark.parametrize("status_seen", [True, False], ids=["status-seen", "status-never-seen"])
def test_a_result_lost_after_the_goal_ended_is_asked_for_again(server, client, status_seen):
    # status-never-seen: how this test failed in CI once, its status taken before the acceptance
    server.drop_goal_replies, server.publish_status = False, status_seen
    server.received["get_result"].clear()             # the first result reply is dropped again
    outcome = client.generate("hi", wait_s=60.0, timeout_s=120.0, feedback_grace_s=0.0)
    assert outcome.accepted and outcome.result.success and outcome.result.message == "0 tokens"
    assert len(server.received["get_result"]) >= 2    # the first result reply was dropped


def test_the_cli_recovers_a_lost_reply_and_times_out_clearly(server):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", NS, *args],
                              capture_output=True, text=True, timeout=600)
    server.received["list"].clear()                   # the next list reply is dropped again
    listed = cli("--timeout", "60", "list")
    assert listed.returncode == 0, listed.stderr
    rolled = cli("--timeout", "5", "rollback", "1")
    assert rolled.returncode == 3 and "TIMEOUT" in rolled.stderr and "sent 2 times" in rolled.stderr, rolled.stderr
