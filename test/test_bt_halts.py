"""Every halt lands: BT.CPP's built-in decorators and controls around flashrt nodes, without a ROS node.

The defect (issue #41): BT.CPP's Timeout halts its child from a timer thread; behaviortreepy
holds the interpreter lock for the whole tick, so that thread waited for the lock inside
the child's Python on_halted while the tick thread waited for the Timeout's mutex, and
``flashrt bt run`` hung with the goal still driving the arm. ``FlashRTTrees`` puts a
stand-in in place of Timeout; these tests hold every halt to the tick thread.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

bt = pytest.importorskip("behaviortreepy", reason="behaviortreepy has wheels for x86_64 Linux only")

from flashrt_ros.bt.btcpp import BUILTIN_NODES, FlashRTTrees, TreeXMLError  # noqa: E402
from flashrt_ros.bt.run import blackboard_value, fill_blackboard  # noqa: E402
from flashrt_ros.runtime.errors import ErrorCode  # noqa: E402
from rosproc import REPO  # noqa: E402
from test_policy_bt_behaviours import FakeClient, refused  # noqa: E402


def tree(body: str) -> str:
    return f'<root BTCPP_format="4" main_tree_to_execute="T"><BehaviorTree ID="T">{body}</BehaviorTree></root>'


class HaltRecorder(FakeClient):
    """A client whose goals run until cancelled, noting on which thread each cancel was sent."""

    def __init__(self, namespace: str = "/fake/flashrt") -> None:
        super().__init__(namespace=namespace)
        self.cancel_threads: list[int] = []

    def generate_async(self, prompt, *, feedback=None, **fields):
        future = super().generate_async(prompt, feedback=feedback, **fields)
        goal = self.goals[-1]
        original = goal.handle.cancel_goal_async

        def cancel():
            self.cancel_threads.append(threading.get_ident())
            return original()
        goal.handle.cancel_goal_async = cancel
        future.set_result(goal.handle)                 # accepted at once
        return future


def end_cancelled_goals(client: FakeClient) -> None:
    """The node's side: every cancelled goal reports its result (so the next one may start)."""
    for goal in client.goals:
        if goal.cancelled and not goal.result_future.done():
            goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
                success=True, error_code=0, message="cancelled", steps=1, rolled_back=False,
                stop_reason="cancelled"), status=5))


def test_two_hundred_timeout_wrapped_goals_are_halted_on_the_tick_thread():
    client = HaltRecorder()
    events: list[tuple[str, str, str]] = []
    t = FlashRTTrees(client, on_event=lambda *e: events.append(e)).load(tree(
        '<Repeat num_cycles="200"><ForceSuccess><Timeout msec="20"><RunPolicy max_steps="100000"/></Timeout>'
        '</ForceSuccess></Repeat>'))
    deadline = time.monotonic() + 300
    status = bt.NodeStatus.RUNNING
    while status == bt.NodeStatus.RUNNING and time.monotonic() < deadline:
        status = t.tick_once()
        end_cancelled_goals(client)
        time.sleep(0.001)
    assert status == bt.NodeStatus.SUCCESS
    assert sum(1 for _, event, _ in events if event == "expired") == 200, "every Timeout fired"
    # A cycle whose 20 ms ran out while its goal still waited for the previous one's result sent none.
    assert client.goals and all(g.cancelled for g in client.goals), "no goal left running"
    assert set(client.cancel_threads) == {threading.get_ident()}, "every halt ran on the tick thread"


# Each wraps {GOAL}, a RunPolicy that runs until cancelled; each is halted from outside (halt_tree)
# after a few ticks, and those that end the goal by themselves (Timeout) end it too.
WRAPPERS = {
    "Timeout": '<Timeout msec="10000">{GOAL}</Timeout>',
    "Delay": '<Delay delay_msec="0">{GOAL}</Delay>',
    "RetryUntilSuccessful": '<RetryUntilSuccessful num_attempts="3">{GOAL}</RetryUntilSuccessful>',
    "Repeat": '<Repeat num_cycles="3">{GOAL}</Repeat>',
    "KeepRunningUntilFailure": '<KeepRunningUntilFailure>{GOAL}</KeepRunningUntilFailure>',
    "Inverter": "<Inverter>{GOAL}</Inverter>",
    "ReactiveSequence": '<ReactiveSequence><ScriptCondition code="true"/>{GOAL}</ReactiveSequence>',
    "ReactiveFallback": '<ReactiveFallback><ScriptCondition code="false"/>{GOAL}</ReactiveFallback>',
    "Parallel": '<Parallel success_count="2" failure_count="1">{GOAL}<KeepRunningUntilFailure>'
                "<AlwaysSuccess/></KeepRunningUntilFailure></Parallel>",
    "Sequence in Timeout": '<Timeout msec="10000"><Sequence><AlwaysSuccess/>{GOAL}</Sequence></Timeout>',
    "WhileDoElse": '<WhileDoElse><ScriptCondition code="true"/>{GOAL}<AlwaysFailure/></WhileDoElse>',
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_halt_reaches_a_goal_inside_every_builtin_wrapper(wrapper):
    client = HaltRecorder()
    t = FlashRTTrees(client).load(tree(WRAPPERS[wrapper].replace("{GOAL}", '<RunPolicy max_steps="100000"/>')))
    deadline = time.monotonic() + 30               # Delay sends its child's goal a tick or two later
    while not client.goals and time.monotonic() < deadline:
        assert t.tick_once() == bt.NodeStatus.RUNNING
        time.sleep(0.001)
    assert t.tick_once() == bt.NodeStatus.RUNNING
    assert len(client.goals) == 1 and not client.goals[0].cancelled
    t.halt_tree()
    assert client.goals[0].cancelled and client.cancel_threads == [threading.get_ident()]


@pytest.mark.parametrize("msec", ["5", "{budget_ms}"])
def test_the_timeout_stand_in_fails_and_halts_its_child_once_msec_passed(msec):
    client = HaltRecorder()
    events: list[tuple[str, str, str]] = []
    bb = bt.Blackboard.create()
    fill_blackboard(bb, ["budget_ms:=5"])
    t = FlashRTTrees(client, on_event=lambda *e: events.append(e)).load(
        tree(f'<Timeout name="budget" msec="{msec}"><RunPolicy name="mission" max_steps="100000"/></Timeout>'), bb)
    assert t.tick_once() == bt.NodeStatus.RUNNING
    time.sleep(0.02)                               # past 5 ms: the next tick decides
    assert t.tick_once() == bt.NodeStatus.FAILURE
    assert client.goals[0].cancelled
    assert ("budget timer", "expired", "halting mission") in events and ("mission", "halted", "goal cancelled at "
                                                                         "the next boundary") in events


def test_the_timeout_stand_in_passes_its_child_s_result_and_restarts_its_clock():
    client = FakeClient()
    t = FlashRTTrees(client).load(tree(
        '<Repeat num_cycles="2"><Timeout msec="60000"><Snapshot capsule="a"/></Timeout></Repeat>'))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    client.sent[0][2].set_result(SimpleNamespace(success=True, error_code=0, message="ok",
                                                 capsule=SimpleNamespace(position=1)))
    assert t.tick_once() == bt.NodeStatus.RUNNING and len(client.sent) == 2
    client.sent[1][2].set_result(refused(ErrorCode.NOT_FOUND, "gone"))
    assert t.tick_once() == bt.NodeStatus.FAILURE


def test_a_double_halt_and_a_halt_before_acceptance_cancel_once():
    client = FakeClient()                          # goals are accepted only when the test says so
    t = FlashRTTrees(client).load(tree('<RunPolicy max_steps="100000"/>'))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    goal = client.goals[0]
    t.halt_tree()
    t.halt_tree()                                   # a second halt: no crash, no second cancel
    assert not goal.cancelled, "not accepted yet: nothing to cancel"
    goal.future.set_result(goal.handle)             # the acceptance arrives after the halt
    assert goal.cancelled, "cancelled the moment it was accepted"


def test_unknown_nodes_and_ports_are_refused_with_a_suggestion():
    with pytest.raises(TreeXMLError, match="RunPolcy.*did you mean RunPolicy"):
        FlashRTTrees(FakeClient()).load(tree('<RunPolcy max_steps="3"/>'))
    with pytest.raises(TreeXMLError, match=r"unknown port\(s\) \['max_step'\]; did you mean max_steps"):
        FlashRTTrees(FakeClient()).load(tree('<RunPolicy max_step="3"/>'))
    with pytest.raises(TreeXMLError, match="ReactiveSequnce.*did you mean ReactiveSequence"):
        FlashRTTrees(FakeClient()).load(tree("<ReactiveSequnce><AlwaysSuccess/></ReactiveSequnce>"))
    with pytest.raises(TreeXMLError, match="op.*'=~' is not one of"):
        FlashRTTrees(FakeClient()).load(tree('<TopicCondition topic="/a" op="=~" value="1"/>'))


@pytest.mark.parametrize("node_id", sorted(BUILTIN_NODES | {"NotANode"}))
def test_the_builtin_list_is_what_behaviortree_cpp_registers(node_id):
    """BUILTIN_NODES (what the name check accepts) is what BT.CPP knows: each creates, or fails
    for its ports or children, never as an unknown node (which NotANode shows it would)."""
    try:
        bt.BehaviorTreeFactory().create_tree_from_text(tree(f"<{node_id}/>"))
        error = ""
    except Exception as exc:  # noqa: BLE001 - BT.CPP raises RuntimeError and LogicError alike
        error = str(exc)
    assert ("Node not recognized" in error) == (node_id == "NotANode"), error


def test_error_name_is_written_for_branching_in_scripts():
    client = FakeClient()
    t = FlashRTTrees(client).load(tree(
        '<Fallback><Restore capsule="gone"/>'
        "<ScriptCondition code=\"error_name == 'NOT_FOUND' &amp;&amp; error_code == 1\"/></Fallback>"))
    t.tick_once()
    client.sent[0][2].set_result(refused(ErrorCode.NOT_FOUND, "no capsule named 'gone'"))
    assert t.tick_once() == bt.NodeStatus.SUCCESS
    assert t.root_blackboard().get_string("error_name") == "NOT_FOUND"


def test_the_node_port_picks_the_client_and_halts_wait_across_nodes():
    clients: dict[str, FakeClient] = {}
    policy = HaltRecorder("/arm/flashrt")

    def make(namespace: str) -> FakeClient:
        return clients.setdefault(namespace, FakeClient(namespace=namespace))
    t = FlashRTTrees(policy, make_client=make).load(tree(
        '<Sequence><ReactiveSequence><ScriptCondition code="!stop"/><RunPolicy max_steps="100000"/>'
        '</ReactiveSequence></Sequence>'))
    bb = t.root_blackboard()
    bb.set_bool("stop", False)
    t.tick_once()
    bb.set_bool("stop", True)
    t.tick_once()                                   # halts the goal on /arm/flashrt
    assert policy.goals[0].cancelled
    trees = FlashRTTrees(policy, make_client=make)
    t2 = trees.load(tree('<Restore node="/sim" capsule="start"/>'))
    assert t2.tick_once() == bt.NodeStatus.RUNNING and clients["/sim"].sent == [], \
        "the world waits until the policy's halted goal has ended"
    end_cancelled_goals(policy)
    t2.tick_once()
    assert [verb for verb, _, _ in clients["/sim"].sent] == ["restore"]
    assert trees.nodes_used == {"/sim": {"restore"}}


def test_blackboard_values_are_typed_and_quotes_force_text():
    assert blackboard_value("600000") == 600000 and blackboard_value("0.5") == 0.5
    assert blackboard_value("true") is True and blackboard_value('"42"') == "42" and blackboard_value("'x'") == "x"


def test_an_integer_for_an_unsigned_builtin_port_loads():
    """-b budget:=500 into Delay's unsigned delay_msec (an int entry made BT.CPP refuse the tree)."""
    trees = FlashRTTrees(FakeClient())
    xml = trees.prepare(tree('<Delay delay_msec="{wait}"><AlwaysSuccess/></Delay>'))
    assert trees.unsigned_keys == {"wait"}
    bb = bt.Blackboard.create()
    fill_blackboard(bb, ["wait:=0"], trees.unsigned_keys)
    t = trees.factory.create_tree_from_text(xml, bb)
    deadline = time.monotonic() + 30
    status = t.tick_once()
    while status == bt.NodeStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.001)
        status = t.tick_once()
    assert status == bt.NodeStatus.SUCCESS


def test_the_watchdog_ends_a_process_stuck_holding_the_interpreter_lock(tmp_path):
    """A C call that blocks holding the lock (as the Timeout deadlock did): no Python signal handler
    or thread can run, faulthandler's C timer still ends the process and prints where it was."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import ctypes
        import flashrt_ros.bt.run as run
        run.TICK_STALL_S = 1.0
        with run.watchdog():
            ctypes.PyDLL(None).sleep(600)      # PyDLL keeps the interpreter lock across the call
    """))
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(REPO), timeout=300)
    assert out.returncode == 1 and "Timeout (0:00:01)!" in out.stderr and "stuck.py" in out.stderr, out.stderr
    assert time.monotonic() - started < 120
