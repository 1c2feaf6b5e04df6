"""Lifecycle transitions of the node, driven through the standard lifecycle services."""
from __future__ import annotations

import pytest
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState

from flashrt_ros.runtime.errors import ErrorCode
from node_fixtures import ros_node  # noqa: F401 - fixture
from rosproc import NodeUnderTest
from waiting import scaled, wait_until


class Lifecycle:
    """The node's lifecycle services, robust to a lost reply (ros2/ros2#1253).

    A new client's first replies can be lost for good on a loaded machine (Fast DDS drops a
    reply while the server has not yet matched the client's reply reader). ``get_state`` is
    read-only, so it is re-sent until it answers; that round trip also shows the server has
    discovered this client before the first ``change_state``, which is never re-sent (a
    repeated transition is refused once the first was applied).
    """

    def __init__(self, node, fqn):
        self._change = node.create_client(ChangeState, f"{fqn}/change_state")
        self._get = node.create_client(GetState, f"{fqn}/get_state")
        assert self._change.wait_for_service(scaled(60)) and self._get.wait_for_service(scaled(10))
        self.state()

    def _call(self, client, request, timeout):
        future = client.call_async(request)
        try:
            return wait_until(future.done, timeout, what=f"a reply from {client.srv_name}") and future.result()
        except AssertionError:
            client.remove_pending_request(future)
            return None

    def transition(self, transition_id) -> bool:
        response = self._call(self._change, ChangeState.Request(transition=Transition(id=transition_id)), 120)
        assert response is not None, "change_state never answered"
        return response.success

    def state(self) -> str:
        for _ in range(10):
            response = self._call(self._get, GetState.Request(), 5)
            if response is not None:
                return response.current_state.label
        raise AssertionError("get_state never answered, though re-sent 10 times")


def test_services_follow_the_lifecycle_and_state_survives_reactivation(tmp_path, ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient, ServiceCallError
    n = NodeUnderTest(tmp_path, "lc", {}, autostart=False)
    try:
        fqn = f"{n.namespace}/flashrt"
        lc = Lifecycle(ros_node, fqn)
        client = FlashRTClient(ros_node, fqn)
        assert lc.state() == "unconfigured"
        r = client.call("snapshot", name="early", check=False, wait_s=30)
        assert not r.success and r.error_code == int(ErrorCode.NOT_ACTIVE)
        assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.state() == "inactive"
        assert client.call("snapshot", name="x", check=False).error_code == int(ErrorCode.NOT_ACTIVE)
        assert lc.transition(Transition.TRANSITION_ACTIVATE) and lc.state() == "active"
        outcome = client.generate("state to keep", max_new_tokens=5, use_chat_template=False)
        assert outcome.accepted and outcome.result.success
        before = client.call("snapshot", name="kept").capsule
        assert lc.transition(Transition.TRANSITION_DEACTIVATE) and lc.state() == "inactive"
        wait_until(lambda: client.node_active() is False, 60, "the node's heartbeat to say inactive")
        with pytest.raises(ServiceCallError) as refused:      # waits (bounded) for activation, names the state
            client.generate("x", max_new_tokens=1, wait_s=1.0)
        assert refused.value.error_code == int(ErrorCode.NOT_ACTIVE) and "is inactive, not active" in str(refused.value)
        assert lc.transition(Transition.TRANSITION_ACTIVATE)
        verified = client.call("verify", name="kept", against_live=True)
        assert verified.matches_live, "deactivate/activate must keep the engine state"
        assert client.call("snapshot", name="again").capsule.position == before.position
        assert lc.transition(Transition.TRANSITION_DEACTIVATE)
        assert lc.transition(Transition.TRANSITION_CLEANUP) and lc.state() == "unconfigured"
        assert client.call("list", check=False).error_code == int(ErrorCode.NOT_ACTIVE)
    finally:
        assert n.stop() == 0, n.log.read_text()


@pytest.mark.parametrize("params,reason", [
    ({"model": "/nonexistent/model.gguf"}, "configure failed"),
    ({"engine_kind": "policy", "policy": "no.such.module:factory"}, "configure failed"),
])
def test_configure_failure_is_reported_and_the_node_keeps_running(tmp_path, ros_node, params, reason):  # noqa: F811
    n = NodeUnderTest(tmp_path, "bad", params, autostart=False)
    try:
        lc = Lifecycle(ros_node, f"{n.namespace}/flashrt")
        assert not lc.transition(Transition.TRANSITION_CONFIGURE)
        assert lc.state() == "unconfigured"
        assert reason in n.log.read_text()
        assert n.proc.poll() is None
    finally:
        assert n.stop() == 0, n.log.read_text()


def test_a_goal_stopped_by_deactivate_is_aborted_not_succeeded(tmp_path, ros_node):  # noqa: F811
    import threading

    from action_msgs.msg import GoalStatus

    from flashrt_ros.client import FlashRTClient
    n = NodeUnderTest(tmp_path, "deact", {"max_context": "4096"})
    try:
        n.wait_active()
        fqn = f"{n.namespace}/flashrt"
        lc = Lifecycle(ros_node, fqn)
        client = FlashRTClient(ros_node, fqn)
        started = threading.Event()
        handle = client._wait(client.generate_async("go on and on", feedback=lambda fb: started.set(),
                                                    max_new_tokens=4000, use_chat_template=False), 30)
        assert handle.accepted and started.wait(120)
        assert lc.transition(Transition.TRANSITION_DEACTIVATE)
        wrapped = client._wait(handle.get_result_async(), 120)
        assert wrapped.status == GoalStatus.STATUS_ABORTED
        assert not wrapped.result.success and wrapped.result.error_code == int(ErrorCode.CANCELLED)
        assert wrapped.result.stop_reason == "cancelled" and 0 < len(wrapped.result.token_ids) < 4000
    finally:
        assert n.stop() == 0, n.log.read_text()
