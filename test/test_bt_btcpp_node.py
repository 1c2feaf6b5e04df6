"""The BehaviorTree.CPP XML trees (through behaviortreepy) against a real policy node (CPU, run_mode=goal)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

bt = pytest.importorskip("behaviortreepy", reason="behaviortreepy has wheels for x86_64 Linux only")

from bt_harness import ActionLog, policy_env, policy_node  # noqa: E402,F401 - fixtures
from waiting import wait_until  # noqa: E402
from flashrt_ros.bt.btcpp import FlashRTTrees  # noqa: E402
from flashrt_ros.bt.run import TREES_DIR  # noqa: E402
from node_fixtures import active_node, ros_node  # noqa: E402,F401 - fixture
from rosproc import REPO, ros_env  # noqa: E402

NODE_NAME = "btcpp"
MISSION = 150         # 3 s at the default 50 Hz: an interrupt raised after 8-10 steps lands mid-mission


@pytest.fixture(scope="module")
def env(policy_env):  # noqa: F811
    """(client, action log), with capsule bt_origin: the state every mission starts from."""
    policy_env[0].call("snapshot", name="bt_origin", overwrite=True)
    return policy_env


class Runner:
    """Loads a tree with a fresh FlashRTTrees, records node events, ticks at ~100 Hz."""

    def __init__(self, client, xml: str, **entries) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.trees = FlashRTTrees(client, on_event=lambda *e: self.events.append(e))
        self.bb = bt.Blackboard.create()
        for key, value in entries.items():
            self.set(key, value)
        self.tree = self.trees.load(xml, self.bb)
        self.status = bt.NodeStatus.IDLE

    def set(self, key: str, value) -> None:
        setter = {bool: self.bb.set_bool, int: self.bb.set_int, str: self.bb.set_string}[type(value)]
        setter(key, value)

    def tick_until(self, condition=None, timeout_s: float = 90.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.status = self.tree.tick_once()
            if (condition() if condition is not None else self.status != bt.NodeStatus.RUNNING):
                return self.status
            time.sleep(0.01)
        raise AssertionError(f"tree {self.status} after {timeout_s:g} s; events {self.events}")

    def happened(self, name: str, event: str) -> bool:
        return any(n == name and e == event for n, e, _ in self.events)


def library(name: str) -> str:
    return (TREES_DIR / name).read_text()


def restore_origin(client) -> None:
    client.call("restore", name="bt_origin")


def new_actions(actions: ActionLog, since: int, count: int) -> list[list[float]]:
    wait_until(lambda: len(actions.snapshot()) >= since + count, 60, f"{count} actions")
    return actions.snapshot()[since:since + count]


@pytest.fixture(scope="module")
def reference(env):
    """The uninterrupted mission: its actions and the capsule of its final state."""
    client, actions = env
    restore_origin(client)
    since = len(actions.snapshot())
    r = Runner(client, library("interrupt_pause_resume.xml"), mission_steps=MISSION, interrupt=False)
    assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events
    client.call("snapshot", name="bt_reference_end", overwrite=True)
    return new_actions(actions, since, MISSION)


def interrupt_mission(env, tree: str, flag: str, after_steps: int, settled: tuple[str, str]):
    """From the origin, run the mission tree until ``after_steps`` actions, raise ``flag``, tick until ``settled``."""
    client, actions = env
    restore_origin(client)
    since = len(actions.snapshot())
    r = Runner(client, library(tree), mission_steps=MISSION, **{flag: False})
    r.tick_until(lambda: len(actions.snapshot()) >= since + after_steps)
    r.set(flag, True)
    r.tick_until(lambda: r.happened(*settled))
    return r, since


def test_interrupted_mission_ends_bit_identical_to_the_uninterrupted_one(env, reference):
    client, actions = env
    r, since = interrupt_mission(env, "interrupt_pause_resume.xml", "interrupt", 8, ("PausePolicy", "SUCCESS"))
    assert r.happened("mission", "halted") and r.status == bt.NodeStatus.RUNNING
    interrupted_at = client.call("snapshot", name="bt_interrupted", overwrite=True).capsule.position
    assert 8 <= interrupted_at < MISSION, "the interrupt came mid-mission"
    r.set("interrupt", False)
    assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events
    assert new_actions(actions, since, MISSION) == reference, "actions differ from the uninterrupted run"
    assert len(actions.snapshot()) == since + MISSION, "exactly the mission's steps, none repeated"
    assert client.call("verify", name="bt_reference_end", against_live=True).matches_live


def test_operator_override_restores_the_policy_whatever_happened_meanwhile(env, reference):
    client, actions = env
    r, since = interrupt_mission(env, "operator_override.xml", "override", 10, ("save the policy", "SUCCESS"))
    done_before = len(actions.snapshot()) - since
    client.call("reset")                 # the operator's time: the policy's state is wiped meanwhile
    r.set("override", False)
    assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events
    assert r.happened("restore the policy", "SUCCESS")
    assert new_actions(actions, since, MISSION) == reference
    assert 10 <= done_before < MISSION
    assert client.call("verify", name="bt_reference_end", against_live=True).matches_live


HALT_TREE = """<root BTCPP_format="4"><BehaviorTree ID="Halt"><Sequence>
  <Snapshot capsule="bt_halt_start" overwrite="true" position="{start}"/>
  <Fallback>
    <ReactiveSequence>
      <ScriptCondition code="!stop"/>
      <RunPolicy max_steps="100000" rollback_on_cancel="{rollback}"/>
    </ReactiveSequence>
    <AlwaysSuccess/>
  </Fallback>
  <Snapshot capsule="bt_halt_after" overwrite="true" position="{after}"/>
</Sequence></BehaviorTree></root>"""


@pytest.mark.parametrize("rollback", [False, True])
def test_halt_mid_run_policy_leaves_a_committed_boundary(env, rollback):
    client, actions = env
    since = len(actions.snapshot())
    r = Runner(client, HALT_TREE, stop=False, rollback=rollback)
    r.tick_until(lambda: len(actions.snapshot()) >= since + 3)
    r.set("stop", True)
    assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events
    assert r.happened("RunPolicy", "halted")
    start, after = r.bb.get_int("start"), r.bb.get_int("after")
    if rollback:
        assert after == start
        assert client.call("verify", name="bt_halt_start", against_live=True).matches_live
    else:       # every published action is a committed step, and the state is the last of them
        wait_until(lambda: len(actions.snapshot()) >= since + (after - start), 30, "the goal's actions")
        assert after - start == len(actions.snapshot()) - since >= 3


def test_failing_verbs_fail_their_node_with_the_error_code(env):
    client, _ = env
    r = Runner(client, """<root BTCPP_format="4"><BehaviorTree ID="F"><Fallback>
      <Restore capsule="bt_never_taken"/>
      <Sequence><RunPolicy error_code="{run_code}" error_message="{run_message}"/></Sequence>
    </Fallback></BehaviorTree></root>""")
    assert r.tick_until() == bt.NodeStatus.FAILURE
    assert r.happened("Restore", "FAILURE")
    assert r.bb.get_int("run_code") == 10 and "INVALID_ARGUMENT" in r.bb.get_string("run_message")
    assert r.trees.last_error["Restore"][0] == 1 and "NOT_FOUND" in r.trees.last_error["Restore"][1]


@pytest.mark.parametrize("ok", [True, False])
def test_try_and_rollback(env, ok):
    client, _ = env
    restore_origin(client)
    r = Runner(client, library("try_and_rollback.xml"), try_steps=6, try_ok=ok)
    status = r.tick_until()
    position = client.call("snapshot", name="bt_after_try", overwrite=True).capsule.position
    origin = client.call("list").capsules
    origin_position = next(c.position for c in origin if c.name == "bt_origin")
    if ok:
        assert status == bt.NodeStatus.SUCCESS and position == origin_position + 6
    else:
        assert status == bt.NodeStatus.FAILURE and r.happened("undo", "SUCCESS")
        assert client.call("verify", name="bt_origin", against_live=True).matches_live


@pytest.mark.parametrize("accept", [True, False])
def test_best_of_n_with_fork(env, accept):
    client, _ = env
    restore_origin(client)
    r = Runner(client, library("best_of_n.xml"), try_steps=4, accept=accept)
    status = r.tick_until()
    names = {c.name for c in client.call("list").capsules}
    assert {"bon_origin", "bon_1", "bon_2", "bon_3"} <= names
    if accept:
        assert status == bt.NodeStatus.SUCCESS and r.bb.get_string("winner") == "bon_1"
    else:
        assert status == bt.NodeStatus.FAILURE
        assert client.call("verify", name="bon_origin", against_live=True).matches_live
        assert sum(1 for n, e, _ in r.events if n == "attempt" and e == "SUCCESS") == 3


def test_flashrt_bt_run_cli(policy_node, env):
    out = subprocess.run(
        [sys.executable, "-m", "flashrt_ros.cli", "--node", f"{policy_node.namespace}/flashrt", "bt", "run",
         "try_and_rollback.xml", "--rate", "50", "-b", "try_steps:=3", "-b", "try_ok:=true",
         "--max-seconds", "120"], capture_output=True, text=True, env=ros_env(), cwd=str(REPO), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tree: RUNNING" in out.stdout and "tree: SUCCESS" in out.stdout and "try: SUCCESS" in out.stdout


LLM_TREE = """<root BTCPP_format="4"><BehaviorTree ID="Llm"><Sequence>
  <Generate prompt="The robot" reset="true" max_new_tokens="4" text="{text}" stop_reason="{why}"/>
  <Snapshot capsule="llm_before" overwrite="true" position="{before}"/>
  <Fallback>
    <ReactiveSequence>
      <ScriptCondition code="!stop"/>
      <Generate name="long" max_new_tokens="LONG_TOKENS" rollback_on_cancel="true"/>
    </ReactiveSequence>
    <AlwaysSuccess/>
  </Fallback>
  <Snapshot capsule="llm_after" overwrite="true" position="{after}"/>
</Sequence></BehaviorTree></root>"""
# "long" must still be decoding when its cancel arrives: a goal that ends first is not cancelled,
# so nothing is rolled back. 200 tokens take about 0.17 s on a 2-core CPU, and once ended before
# the cancel beside two busy loops; 4000 take about 3.4 s (greedy; no stop token among them). A
# cancel that never took effect still fails here (after = before + LONG_TOKENS).
LONG_TOKENS = 4000


def test_generate_node_and_its_halt_with_rollback_on_an_llm_node(tmp_path, ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient
    with active_node(tmp_path, "btllm", {"model": "random-llama-tiny", "max_context": str(LONG_TOKENS + 96),
                                          "prefill_chunk": "16"}) as node:
        client = FlashRTClient(ros_node, f"{node.namespace}/flashrt")
        wait_until(lambda: client.generate_ready() and client.wait_for("snapshot", 0.0), 60, "the LLM node")
        r = Runner(client, LLM_TREE.replace("LONG_TOKENS", str(LONG_TOKENS)), stop=False)
        r.tick_until(lambda: r.happened("long", "started"))
        r.set("stop", True)                  # the next tick halts "long": it cannot finish unticked
        assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events
        assert r.happened("long", "halted") and not r.happened("long", "SUCCESS")
        assert r.bb.get_string("why") == "max_new_tokens" and r.bb.get_string("text")
        assert r.bb.get_int("after") == r.bb.get_int("before"), "the halted generation was rolled back"
        assert client.call("verify", name="llm_before", against_live=True).matches_live


def test_status_conditions_follow_the_node(env):
    """~/status is periodic: each condition is ticked until it says so (a deadline, no sleep)."""
    client, _ = env

    def becomes(xml_node: str, status) -> None:
        r = Runner(client, f'<root BTCPP_format="4"><BehaviorTree ID="C">{xml_node}</BehaviorTree></root>')
        r.tick_until(lambda: r.status == status, timeout_s=60)

    # InputsFresh is checked against status messages in test_bt_btcpp.py: in run_mode=goal an idle
    # node's inputs_state keeps its last verdict (policy_io re-evaluates it when it steps).
    becomes("<IsPolicyPaused/>", bt.NodeStatus.FAILURE)
    becomes("<PausePolicy/>", bt.NodeStatus.SUCCESS)
    becomes("<IsPolicyPaused/>", bt.NodeStatus.SUCCESS)
    becomes("<ResumePolicy/>", bt.NodeStatus.SUCCESS)
    becomes("<IsPolicyPaused/>", bt.NodeStatus.FAILURE)


def test_ctrl_c_on_flashrt_bt_run_halts_the_tree_and_cancels_the_goal(policy_node, env, tmp_path):
    import os
    import signal

    from rosproc import start_python, stop, with_ctrl_c
    client, actions = env
    log = tmp_path / "bt_run.log"
    since = len(actions.snapshot())
    proc = start_python(with_ctrl_c("flashrt_ros.cli", "--node", f"{policy_node.namespace}/flashrt", "bt", "run",
                                    "interrupt_pause_resume.xml", "-b", "mission_steps:=100000",
                                    "-b", "interrupt:=false"), log)
    try:
        wait_until(lambda: len(actions.snapshot()) >= since + 3, 90, "the tree's goal to drive the policy")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert "mission: halted (goal cancelled at the next boundary)" in text and "interrupted: tree halted" in text
    # the cancelled goal is over: the node accepts the next one (it rejects a second goal while one runs)
    r = Runner(client, '<root BTCPP_format="4"><BehaviorTree ID="N"><RunPolicy max_steps="2"/></BehaviorTree></root>')
    assert r.tick_until() == bt.NodeStatus.SUCCESS, r.events


def test_the_interrupt_tree_runs_from_the_command_line_with_a_topic_trigger(policy_node, env, reference, ros_node,  # noqa: F811
                                                                            tmp_path):
    """An operator's switch on a topic interrupts the shipped tree through ``--bb-topic``; the
    mission still ends bit-identical to the uninterrupted one."""
    from std_msgs.msg import Bool

    from rosproc import start_python, stop, with_ctrl_c
    client, actions = env
    restore_origin(client)
    topic = f"{policy_node.namespace}/operator/interrupt"
    switch = ros_node.create_publisher(Bool, topic, 10)
    since = len(actions.snapshot())
    log = tmp_path / "bt_run.log"
    proc = start_python(with_ctrl_c("flashrt_ros.cli", "--node", f"{policy_node.namespace}/flashrt", "bt", "run",
                                    "interrupt_pause_resume.xml", "-b", f"mission_steps:={MISSION}",
                                    "-b", "interrupt:=false", "--bb-topic", f"interrupt:={topic}:std_msgs/msg/Bool"),
                        log)
    try:
        wait_until(lambda: len(actions.snapshot()) >= since + 8, 90, "the mission to start")
        # the switch is held on (published again until the tree shows it paused), then released
        wait_until(lambda: switch.publish(Bool(data=True)) or "PausePolicy: SUCCESS" in log.read_text(), 90,
                   "the tree to pause on the topic")
        paused_at = len(actions.snapshot()) - since
        wait_until(lambda: switch.publish(Bool(data=False)) or proc.poll() is not None, 180, "the mission to end")
        assert proc.wait(60) == 0, log.read_text()
    finally:
        stop(proc)
        ros_node.destroy_publisher(switch)
    text = log.read_text()
    assert "mission: halted (goal cancelled at the next boundary)" in text and "tree: SUCCESS" in text, text
    assert 8 <= paused_at < MISSION, "the interrupt came mid-mission"
    assert new_actions(actions, since, MISSION) == reference, "actions differ from the uninterrupted run"
    assert len(actions.snapshot()) == since + MISSION, "exactly the mission's steps, none repeated"
