"""The py_trees behaviours: one request per run, ticks never block, failures carry the node's message."""
import time
from types import SimpleNamespace

import py_trees
import pytest
from py_trees.common import Status
from rclpy.task import Future

from flashrt_ros.bt import (Fork, Generate, PausePolicy, PolicyPaused, Reset, Restore, Rollback, RunPolicy,
                            Snapshot, SwitchSession)
from flashrt_ros.runtime.errors import ErrorCode


class FakeClient:
    """Stands in for FlashRTClient: records requests, the test completes their futures."""

    def __init__(self, ready: bool = True) -> None:
        self.ready = ready
        self.sent: list[tuple[str, dict, Future]] = []
        self.goals: list[SimpleNamespace] = []

    def wait_for(self, verb, timeout_s):
        assert timeout_s == 0.0, "a behaviour must never wait for a service"
        return self.ready

    def call_async(self, verb, **fields):
        future = Future()
        self.sent.append((verb, fields, future))
        return future

    def generate_ready(self):
        return self.ready

    def run_policy_ready(self):
        return self.ready

    def run_policy_async(self, *, feedback=None, **fields):
        return self.generate_async("", feedback=feedback, **fields)

    def generate_async(self, prompt, *, feedback=None, **fields):
        goal = SimpleNamespace(prompt=prompt, fields=fields, feedback=feedback, future=Future(),
                               result_future=Future(), cancelled=False)

        def cancel_goal_async():
            goal.cancelled = True
            return Future()

        goal.handle = SimpleNamespace(accepted=True, get_result_async=lambda: goal.result_future,
                                      cancel_goal_async=cancel_goal_async)
        self.goals.append(goal)
        return goal.future


def ok(message="done"):
    return SimpleNamespace(success=True, error_code=0, message=message)


def refused(code: ErrorCode, message: str):
    return SimpleNamespace(success=False, error_code=int(code), message=message)


def test_request_is_sent_once_and_ticks_do_not_block():
    client = FakeClient()
    b = Snapshot("snap", client, "cap1", tier="host", overwrite=True)
    for _ in range(5):
        b.tick_once()       # returns although the response future is never completed: no tick waits on it
    assert b.status is Status.RUNNING
    assert len(client.sent) == 1
    verb, fields, future = client.sent[0]
    assert verb == "snapshot" and fields == dict(name="cap1", tier="host", session="", pin=False, overwrite=True)
    assert not future.done()


def test_success_response_gives_success_and_keeps_the_response():
    client = FakeClient()
    b = Restore("restore", client, "cap1", verify=True)
    b.tick_once()
    client.sent[0][2].set_result(ok("restored cap1: position 12"))
    b.tick_once()
    assert b.status is Status.SUCCESS
    assert b.feedback_message == "restored cap1: position 12"
    assert b.response.success and client.sent[0][1] == {"name": "cap1", "verify": True}


def test_success_false_is_failure_with_the_node_message():
    client = FakeClient()
    b = Restore("restore", client, "missing")
    b.tick_once()
    client.sent[0][2].set_result(refused(ErrorCode.NOT_FOUND, "no capsule named 'missing'"))
    b.tick_once()
    assert b.status is Status.FAILURE
    assert "NOT_FOUND" in b.feedback_message and "no capsule named 'missing'" in b.feedback_message


def test_no_response_in_time_is_failure_and_abandons_the_request():
    client = FakeClient()
    b = Rollback("rollback", client, 3, timeout_s=0.05)
    b.tick_once()
    time.sleep(0.06)
    b.tick_once()
    assert b.status is Status.FAILURE and "TIMEOUT" in b.feedback_message
    assert client.sent[0][1] == {"steps": 3} and client.sent[0][2].cancelled()


def test_absent_service_fails_after_the_timeout_without_sending():
    client = FakeClient(ready=False)
    b = Fork("fork", client, "a", "b", timeout_s=0.05)
    b.tick_once()
    assert b.status is Status.RUNNING
    time.sleep(0.06)
    b.tick_once()
    assert b.status is Status.FAILURE and "not available" in b.feedback_message
    assert client.sent == []


def test_a_finished_behaviour_sends_a_new_request_when_ticked_again():
    client = FakeClient()
    b = PausePolicy("pause", client)
    b.tick_once()
    client.sent[0][2].set_result(ok())
    b.tick_once()
    assert b.status is Status.SUCCESS
    b.tick_once()
    assert len(client.sent) == 2 and b.status is Status.RUNNING


def test_interrupting_a_behaviour_abandons_its_pending_request():
    client = FakeClient()
    b = Snapshot("snap", client, "cap")
    b.tick_once()
    b.stop(Status.INVALID)
    assert client.sent[0][2].cancelled()


class Counting(py_trees.behaviour.Behaviour):
    """A child that returns the scripted statuses and counts its ticks."""

    def __init__(self, outcomes):
        super().__init__("child")
        self.outcomes, self.ticks = list(outcomes), 0

    def update(self):
        self.ticks += 1
        return self.outcomes.pop(0)


def _verbs(client):
    return [verb for verb, _, _ in client.sent]


@pytest.mark.parametrize("child_outcome", [Status.SUCCESS, Status.FAILURE])
def test_guard_pauses_then_runs_child_then_resumes(child_outcome):
    client = FakeClient()
    child = Counting([Status.RUNNING, child_outcome])
    guard = PolicyPaused("guard", client, child)
    guard.tick_once()
    assert _verbs(client) == ["pause"] and child.ticks == 0 and guard.status is Status.RUNNING
    client.sent[0][2].set_result(ok())
    guard.tick_once()
    assert child.ticks == 1 and guard.status is Status.RUNNING
    guard.tick_once()                                   # child finishes -> resume is sent
    assert child.ticks == 2 and _verbs(client) == ["pause", "resume"] and guard.status is Status.RUNNING
    client.sent[1][2].set_result(ok())
    guard.tick_once()
    assert guard.status is child_outcome and child.ticks == 2


def test_guard_fails_without_running_child_when_pause_is_refused():
    client = FakeClient()
    child = Counting([Status.SUCCESS])
    guard = PolicyPaused("guard", client, child)
    guard.tick_once()
    client.sent[0][2].set_result(refused(ErrorCode.INVALID_ARGUMENT, "pause applies to engine_kind=policy"))
    guard.tick_once()
    assert guard.status is Status.FAILURE and child.ticks == 0
    assert "engine_kind=policy" in guard.feedback_message and _verbs(client) == ["pause"]


def test_guard_fails_when_resume_fails_even_if_child_succeeded():
    client = FakeClient()
    guard = PolicyPaused("guard", client, Counting([Status.SUCCESS]))
    guard.tick_once()
    client.sent[0][2].set_result(ok())
    guard.tick_once()
    client.sent[1][2].set_result(refused(ErrorCode.NOT_ACTIVE, "node is inactive"))
    guard.tick_once()
    assert guard.status is Status.FAILURE and "NOT_ACTIVE" in guard.feedback_message


def test_interrupted_guard_sends_resume_without_waiting():
    client = FakeClient()
    child = Counting([Status.RUNNING] * 5)
    guard = PolicyPaused("guard", client, child)
    guard.tick_once()
    client.sent[0][2].set_result(ok())
    guard.tick_once()
    guard.stop(Status.INVALID)
    assert _verbs(client) == ["pause", "resume"] and child.status is Status.INVALID


def _result(success=True, message="", tokens=(1, 2, 3)):
    return SimpleNamespace(result=SimpleNamespace(success=success, error_code=0 if success else 9, message=message,
                                                  token_ids=list(tokens), stop_reason="max_new_tokens"),
                           status=4)


def test_generate_sends_one_goal_and_succeeds_on_result():
    client = FakeClient()
    g = Generate("gen", client, "hello", max_new_tokens=3)
    g.tick_once()
    g.tick_once()
    assert len(client.goals) == 1 and client.goals[0].fields == {"max_new_tokens": 3}
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    g.tick_once()
    goal.feedback(SimpleNamespace(text_piece=" hi"))
    assert g.status is Status.RUNNING and g.pieces == [" hi"]
    goal.result_future.set_result(_result())
    g.tick_once()
    assert g.status is Status.SUCCESS and g.result.token_ids == [1, 2, 3]


def test_generate_failure_result_is_failure_with_message():
    client = FakeClient()
    g = Generate("gen", client, "hello")
    g.tick_once()
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    g.tick_once()
    goal.result_future.set_result(_result(False, "a generation is already running"))
    g.tick_once()
    assert g.status is Status.FAILURE and "BUSY" in g.feedback_message


def test_generate_rejected_goal_is_failure():
    client = FakeClient()
    g = Generate("gen", client, "hello")
    g.tick_once()
    goal = client.goals[0]
    goal.handle.accepted = False
    goal.future.set_result(goal.handle)
    g.tick_once()
    assert g.status is Status.FAILURE and "rejected" in g.feedback_message


@pytest.mark.parametrize("how", ["timeout", "interrupt"])
def test_generate_cancels_its_goal_on_timeout_or_interruption(how):
    client = FakeClient()
    g = Generate("gen", client, "hello", timeout_s=0.05)
    g.tick_once()
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    g.tick_once()
    if how == "timeout":
        time.sleep(0.06)
        g.tick_once()
        assert g.status is Status.FAILURE and "TIMEOUT" in g.feedback_message
    else:
        g.stop(Status.INVALID)
    assert goal.cancelled


def test_reset_and_switch_session_send_their_verbs():
    client = FakeClient()
    Reset("reset", client).tick_once()
    SwitchSession("switch", client, "task_b").tick_once()
    assert [(verb, fields) for verb, fields, _ in client.sent] == [("reset", {}), ("switch_session", {"session": "task_b"})]


def _accepted_run(client, **kwargs):
    run = RunPolicy("run", client, **kwargs)
    run.tick_once()
    goal = client.goals[-1]
    goal.future.set_result(goal.handle)
    run.tick_once()
    return run, goal


def test_run_policy_sends_its_goal_fields_and_follows_feedback():
    client = FakeClient()
    run, goal = _accepted_run(client, max_steps=7, rollback_on_cancel=True)
    assert goal.fields == dict(max_steps=7, max_duration_s=0.0, session="", rollback_on_cancel=True)
    goal.feedback(SimpleNamespace(steps=4, last_action=[0.5]))
    run.tick_once()
    assert run.status is Status.RUNNING and run.steps == 4 and "4 steps" in run.feedback_message
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="7 steps, stop: max_steps", steps=7), status=4))
    run.tick_once()
    assert run.status is Status.SUCCESS and run.result.steps == 7


def test_run_policy_failure_carries_the_error_code():
    client = FakeClient()
    run, goal = _accepted_run(client)
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=False, error_code=int(ErrorCode.INVALID_ARGUMENT), message="set max_steps or max_duration_s"),
        status=6))
    run.tick_once()
    assert run.status is Status.FAILURE and run.error_code == int(ErrorCode.INVALID_ARGUMENT)
    assert "INVALID_ARGUMENT" in run.feedback_message


def test_after_a_halt_the_next_request_waits_until_the_cancelled_goal_reported():
    client = FakeClient()
    run, goal = _accepted_run(client, max_steps=100)
    run.stop(Status.INVALID)
    assert goal.cancelled, "halt cancels the goal"
    snap = Snapshot("after halt", client, "cap")
    for _ in range(3):
        snap.tick_once()
    assert snap.status is Status.RUNNING and client.sent == [], "nothing is sent before the goal stopped"
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="cancelled", steps=3), status=5))
    snap.tick_once()
    assert [verb for verb, _, _ in client.sent] == ["snapshot"]


def test_halt_before_acceptance_cancels_once_the_goal_is_accepted():
    client = FakeClient()
    run = RunPolicy("run", client, max_steps=100)
    run.tick_once()
    goal = client.goals[-1]
    run.stop(Status.INVALID)
    assert not goal.cancelled
    goal.future.set_result(goal.handle)
    Snapshot("next", client, "cap").tick_once()     # polling the next request settles the halted goal
    assert goal.cancelled and client.sent == []
