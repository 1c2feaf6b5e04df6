"""The py_trees behaviours: one request per run, ticks never block, failures carry the node's message."""
import time
from types import SimpleNamespace

import py_trees
import pytest
from py_trees.common import Status
from rclpy.task import Future

from flashrt_ros.bt import (Drop, Fork, Generate, PausePolicy, PolicyPaused, Reset, Restore, Rollback, RunPolicy,
                            Snapshot, SwitchSession)
from flashrt_ros.bt import goal_request, requests, service_request
from flashrt_ros.client import RESULT_ASK_FIRST_S, RESULT_GRACE_S
from flashrt_ros.runtime.errors import ErrorCode


class FakeClient:
    """Stands in for FlashRTClient: records requests, the test completes their futures."""

    def __init__(self, ready: bool = True, namespace: str = "/fake/flashrt") -> None:
        self.ready = ready
        self.namespace, self.node = namespace, None
        self.sent: list[tuple[str, dict, Future]] = []
        self.request_ids: list[str | None] = []
        self.goals: list[SimpleNamespace] = []
        self.cancelled_ids: list = []
        self.cancelled_actions: list[str] = []
        self.forgotten: list = []        # goals whose feedback callback was dropped

    def wait_for(self, verb, timeout_s):
        assert timeout_s == 0.0, "a behaviour must never wait for a service"
        return self.ready

    def call_async(self, verb, **fields):
        future = Future()
        self.request_ids.append(fields.pop("request_id", None))     # checked apart (every changing verb has one)
        self.sent.append((verb, fields, future))
        return future

    def generate_ready(self):
        return self.ready

    def sent_goal_id(self, future):
        return next((g.goal_id for g in self.goals if g.future is future), None)

    def cancel_goal_id(self, goal_id, action="generate"):
        self.cancelled_ids.append(goal_id)
        self.cancelled_actions.append(action)
        return Future()

    def run_policy_ready(self):
        return self.ready

    def forget_goal(self, goal):
        self.forgotten.append(getattr(goal, "goal_id", goal))

    def run_policy_async(self, *, feedback=None, **fields):
        return self.generate_async("", feedback=feedback, **fields)

    def generate_async(self, prompt, *, feedback=None, **fields):
        goal = SimpleNamespace(prompt=prompt, fields=fields, feedback=feedback, future=Future(),
                               result_future=Future(), cancelled=False, goal_id=f"goal{len(self.goals)}",
                               result_requests=[])

        def get_result_async():
            goal.result_requests.append(Future() if goal.result_requests else goal.result_future)
            return goal.result_requests[-1]

        def cancel_goal_async():
            goal.cancelled = True
            return Future()

        goal.handle = SimpleNamespace(accepted=True, goal_id=goal.goal_id, get_result_async=get_result_async,
                                      cancel_goal_async=cancel_goal_async, status=2)    # EXECUTING
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
    assert len(client.request_ids[0]) == 32          # the node answers a copy under it with the first answer
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


def _accepted_generate(client, **kw):
    """A Generate behaviour whose goal the fake node has accepted (two ticks in)."""
    g = Generate("gen", client, "hello", **kw)
    g.tick_once()
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    g.tick_once()
    return g, goal


@pytest.mark.parametrize("how", ["timeout", "interrupt"])
def test_generate_cancels_its_goal_on_timeout_or_interruption(how):
    client = FakeClient()
    g, goal = _accepted_generate(client, timeout_s=0.05)
    if how == "timeout":
        time.sleep(0.06)
        g.tick_once()
        assert g.status is Status.FAILURE and "TIMEOUT" in g.feedback_message
    else:
        g.stop(Status.INVALID)
    assert goal.cancelled


class FakeClock:
    """The request core's monotonic clock, advanced by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    for module in (service_request, goal_request):      # where the request core reads its clock
        monkeypatch.setattr(module, "time", fake)
    return fake


@pytest.mark.parametrize("make", [
    lambda c: Snapshot("s", c, "cap", overwrite=True),
    lambda c: Restore("r", c, "cap"),
    lambda c: PausePolicy("p", c),
    lambda c: Snapshot("s", c, "cap"),        # without its id, a repeat of an applied one: ALREADY_EXISTS
    lambda c: Rollback("b", c, 2),            # ... would go back twice
    lambda c: Fork("f", c, "a", "b"),
], ids=["snapshot overwrite", "restore", "pause", "snapshot", "rollback", "fork"])
def test_a_lost_reply_is_resent_under_the_same_request_id_and_never_hangs(clock, make):
    """Every changing verb carries a request id: its copy is answered by the node with the first answer, so any
    lost reply is re-sent; one the node never answers still ends in TIMEOUT."""
    client = FakeClient()
    b = make(client)
    b.tick_once()
    assert len(client.sent) == 1
    clock.now += 2.0                  # the first reply is lost: nothing ever completes sent[0]
    b.tick_once()
    assert b.status is Status.RUNNING and len(client.sent) == 2
    assert client.request_ids[0] == client.request_ids[1] and len(client.request_ids[0]) == 32
    client.sent[1][2].set_result(ok("answered the copy"))
    b.tick_once()
    assert b.status is Status.SUCCESS and b.feedback_message == "answered the copy"
    assert client.sent[0][2].cancelled()          # the lost one is forgotten
    silent = make(FakeClient())
    silent.tick_once()
    clock.now += requests.DEFAULT_TIMEOUT_S
    silent.tick_once()
    assert silent.status is Status.FAILURE and "TIMEOUT" in silent.feedback_message


def test_a_slow_first_reply_still_counts_after_a_resend(clock):
    client = FakeClient()
    b = Restore("r", client, "cap")
    b.tick_once()
    clock.now += 2.0
    b.tick_once()
    client.sent[0][2].set_result(ok("the first one, late"))
    b.tick_once()
    assert b.status is Status.SUCCESS and b.feedback_message == "the first one, late"
    assert client.sent[1][2].cancelled()


def test_generate_goal_never_answered_is_cancelled_by_id_not_resent(clock):
    client = FakeClient()
    g = Generate("gen", client, "hello", timeout_s=10.0)
    g.tick_once()
    clock.now += 11.0                 # the goal response was lost
    g.tick_once()
    assert g.status is Status.FAILURE and "TIMEOUT" in g.feedback_message
    assert len(client.goals) == 1 and client.cancelled_ids == ["goal0"]


def test_generate_result_lost_after_the_goal_ended_is_asked_for_again(clock):
    client = FakeClient()
    g, goal = _accepted_generate(client, timeout_s=60.0)
    goal.handle.status = 4            # SUCCEEDED on the status topic; the result reply is lost
    g.tick_once()
    clock.now += RESULT_GRACE_S
    g.tick_once()
    _the_second_result_request_answers(g, goal)


def _the_second_result_request_answers(g, goal) -> None:
    """The goal asked for its result again; answering that copy ends it."""
    assert len(goal.result_requests) == 2 and g.status is Status.RUNNING
    goal.result_requests[1].set_result(_result())
    g.tick_once()
    assert g.status is Status.SUCCESS and g.result.token_ids == [1, 2, 3]


def test_generate_result_lost_with_no_status_seen_is_asked_for_again(clock):
    # rclpy drops a status taken before the acceptance: a goal that ended at once never shows ended
    client = FakeClient()
    g, goal = _accepted_generate(client, timeout_s=600.0)
    g.tick_once()
    clock.now += RESULT_GRACE_S       # no status: not yet
    g.tick_once()
    assert len(goal.result_requests) == 1
    clock.now += RESULT_ASK_FIRST_S
    g.tick_once()
    _the_second_result_request_answers(g, goal)


def test_a_finished_goal_drops_its_feedback_callback(clock):
    client = FakeClient()
    g, goal = _accepted_generate(client, timeout_s=60.0)
    assert client.forgotten == []
    goal.result_future.set_result(_result())
    g.tick_once()
    assert g.status is Status.SUCCESS and client.forgotten == ["goal0"]
    lost = Generate("lost", client, "hello", timeout_s=10.0)
    lost.tick_once()
    clock.now += 11.0                 # its acceptance never arrives
    lost.tick_once()
    assert lost.status is Status.FAILURE and client.forgotten[-1] == "goal1"


def test_reset_and_switch_session_send_their_verbs():
    client = FakeClient()
    Reset("reset", client).tick_once()
    SwitchSession("switch", client, "task_b").tick_once()
    Drop("drop", client, "old").tick_once()
    assert [(verb, fields) for verb, fields, _ in client.sent] == [
        ("reset", {}), ("switch_session", {"session": "task_b"}), ("drop", {"name": "old"})]


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


def test_halt_before_acceptance_cancels_the_moment_the_goal_is_accepted():
    """A tree that halts a goal whose acceptance is still on its way, and then ends (nothing is
    ticked again), must not leave that goal running: the acceptance itself sends the cancel.
    (examples/arm_interrupt_trees.py: such a goal ran on into the next episode's first steps.)"""
    client = FakeClient()
    run = RunPolicy("run", client, max_steps=100)
    run.tick_once()
    goal = client.goals[-1]
    run.stop(Status.INVALID)
    assert not goal.cancelled
    goal.future.set_result(goal.handle)             # accepted; no request of this client is polled
    assert goal.cancelled, "the halted goal was not cancelled when it was accepted"
    next_request = Snapshot("next", client, "cap")
    next_request.tick_once()
    assert client.sent == [], "the next request still waits for the cancelled goal's result"
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="cancelled", steps=0), status=5))
    next_request.tick_once()
    assert [verb for verb, _, _ in client.sent] == ["snapshot"]


def test_halt_before_a_rejection_sends_no_cancel():
    client = FakeClient()
    run = RunPolicy("run", client, max_steps=100)
    run.tick_once()
    goal = client.goals[-1]
    run.stop(Status.INVALID)
    goal.handle.accepted = False
    goal.future.set_result(goal.handle)
    assert not goal.cancelled
    Snapshot("next", client, "cap").tick_once()
    assert [verb for verb, _, _ in client.sent] == ["snapshot"], "a rejected goal has nothing to settle"


def test_run_policy_resume_after_halt_runs_only_the_steps_left():
    client = FakeClient()
    run, first = _accepted_run(client, max_steps=50, resume_after_halt=True)
    run.stop(Status.INVALID)
    first.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="cancelled", steps=18, rolled_back=False), status=5))
    run.tick_once()
    assert client.goals[1].fields["max_steps"] == 32
    second = client.goals[1]
    second.future.set_result(second.handle)
    run.tick_once()
    run.stop(Status.INVALID)
    second.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="cancelled", steps=5, rolled_back=True), status=5))
    run.tick_once()
    assert client.goals[2].fields["max_steps"] == 32, "a rolled-back goal kept none of its steps"


def test_a_request_rclpy_refuses_is_a_failure_not_an_exception():
    client = FakeClient()
    b = Rollback("rollback", client, -1)

    def refuse(verb, **fields):      # what a generated message's field check raises when it is on
        raise AssertionError("The 'steps' field must be an unsigned integer in [0, 4294967295]")
    client.call_async = refuse
    b.tick_once()
    assert b.status is Status.FAILURE and b.error_code == int(ErrorCode.INVALID_ARGUMENT)
    assert "steps" in b.feedback_message


def test_run_policy_resume_budget_ignores_a_reset_after_success():
    client = FakeClient()
    run, first = _accepted_run(client, max_steps=10, resume_after_halt=True)
    first.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="10 steps", steps=10, rolled_back=False), status=4))
    run.tick_once()
    assert run.status is Status.SUCCESS
    run.stop(Status.INVALID)            # what a parent does when it restarts
    run.tick_once()
    assert client.goals[1].fields["max_steps"] == 10, "a finished mission starts over in full"
