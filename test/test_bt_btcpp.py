"""The BehaviorTree.CPP front-end without a flashrt node: the Groot2 model, ports, halt, non-blocking ticks."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

bt = pytest.importorskip("behaviortreepy", reason="behaviortreepy has wheels for x86_64 Linux only")

from flashrt_ros.bt.btcpp import FlashRTTrees, TreeXMLError, register_model  # noqa: E402
from flashrt_ros.bt.nodes import NODES, all_ports  # noqa: E402
from flashrt_ros.bt.run import TREES_DIR, blackboard_value  # noqa: E402
from flashrt_ros.runtime.errors import ErrorCode  # noqa: E402
from node_fixtures import ros_node  # noqa: E402,F401 - fixture
from test_policy_bt_behaviours import FakeClient, ok, refused  # noqa: E402

MODEL = TREES_DIR / "flashrt_nodes.xml"


def tree(body: str) -> str:
    return f'<root BTCPP_format="4"><BehaviorTree ID="T">{body}</BehaviorTree></root>'


def test_groot_model_file_loads_in_the_factory():
    """(That the file is the generated one: test_generated_artefacts.py.)"""
    factory = bt.BehaviorTreeFactory()
    register_model(factory, MODEL)              # BT.CPP's own XML parser reads the TreeNodesModel
    with pytest.raises(RuntimeError):           # and does refuse a broken one
        factory.register_behavior_tree_from_text(MODEL.read_text().replace("</TreeNodesModel>", ""))
    text = MODEL.read_text()
    for node in NODES:
        assert f'<{node.kind} ID="{node.id}">' in text
        for port in all_ports(node):
            assert f'name="{port.name}"' in text


@pytest.mark.parametrize("path", sorted(p.name for p in TREES_DIR.glob("*.xml") if p != MODEL))
def test_every_library_tree_loads_next_to_the_model(path):
    trees = FlashRTTrees(FakeClient())
    register_model(trees.factory, MODEL)
    assert trees.load((TREES_DIR / path).read_text()) is not None


@pytest.mark.parametrize("body, error", [
    ("<Snapshot/>", "missing required port 'capsule'"),
    ('<Snapshot capsule="a" bogus="1"/>', "unknown port(s) ['bogus']"),
    ('<Rollback steps="two"/>', "port 'steps'"),
    ('<Snapshot capsule="a" position="3"/>', "needs a blackboard entry"),
])
def test_bad_ports_are_refused_at_load_with_the_reason(body, error):
    with pytest.raises(TreeXMLError, match=error.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        FlashRTTrees(FakeClient()).load(tree(body))


def test_ports_read_literals_and_blackboard_entries_and_write_outputs():
    client = FakeClient()
    trees = FlashRTTrees(client)
    t = trees.load(tree('<Sequence><Script code="cap:=\'pre\'"/>'
                        '<Snapshot capsule="{cap}" tier="host" pin="true" position="{pos}"/>'
                        '<Restore capsule="gone" error_code="{code}"/></Sequence>'))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    assert client.sent[0][:2] == ("snapshot", dict(name="pre", tier="host", session="", pin=True, overwrite=False))
    client.sent[0][2].set_result(SimpleNamespace(**vars(ok()), capsule=SimpleNamespace(position=7)))
    assert t.tick_once() == bt.NodeStatus.RUNNING and client.sent[1][:2] == ("restore", dict(name="gone",
                                                                                            verify=False))
    client.sent[1][2].set_result(refused(ErrorCode.NOT_FOUND, "no capsule named 'gone'"))
    assert t.tick_once() == bt.NodeStatus.FAILURE
    bb = t.root_blackboard()
    assert bb.get_int("pos") == 7 and bb.get_int("code") == 1
    assert "NOT_FOUND" in bb.get_string("error_message")     # the default entry: {error_message}
    assert bb.get_int("error_code") == 0, "Restore's code went to {code}; {error_code} is the Snapshot's"


def test_halt_cancels_a_running_goal_and_the_next_node_waits_for_it():
    client = FakeClient()
    t = FlashRTTrees(client).load(tree('<Sequence><RunPolicy max_steps="50"/><Snapshot capsule="after"/></Sequence>'))
    t.tick_once()
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    assert t.tick_once() == bt.NodeStatus.RUNNING
    t.halt_tree()
    assert goal.cancelled and goal.fields["max_steps"] == 50
    t2 = FlashRTTrees(client).load(tree('<Snapshot capsule="next"/>'))
    assert t2.tick_once() == bt.NodeStatus.RUNNING and client.sent == [], "waits for the cancelled goal"
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="cancelled", steps=5, rolled_back=False, stop_reason="cancelled"),
        status=5))
    t2.tick_once()
    assert [verb for verb, _, _ in client.sent] == ["snapshot"]


def test_resume_after_halt_sends_only_the_steps_left():
    client = FakeClient()
    xml = tree('<RunPolicy name="mission" max_steps="50" resume_after_halt="true"/>')
    trees = FlashRTTrees(client)
    t = trees.load(xml)
    t.tick_once()
    first = client.goals[0]
    first.future.set_result(first.handle)
    t.tick_once()
    t.halt_tree()
    first.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=True, error_code=0, message="", steps=18, rolled_back=False, stop_reason="cancelled"), status=5))
    t.tick_once()
    assert client.goals[1].fields["max_steps"] == 32


def test_run_policy_on_refused_inputs_says_the_nodes_text_and_fails_with_input_rejected():
    events: list = []
    client = FakeClient()
    t = FlashRTTrees(client, on_event=lambda *e: events.append(e)).load(tree('<RunPolicy name="drive" max_steps="5"/>'))
    t.tick_once()
    goal = client.goals[0]
    goal.future.set_result(goal.handle)
    t.tick_once()
    text = "input messages refused: /js: JointState lacks joint(s) ['j4'] of input_joint_names (it has ['j1'])"
    goal.feedback(SimpleNamespace(state="waiting", waiting_for=text, waiting_s=1.0, steps=0, last_action=[]))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    assert ("drive", "waiting", f"{text} (for 1.0 s)") in events, events
    message = f"run_policy goal ended after 0 steps: no policy step for 10.0 s (stale_timeout_s 10 s): {text}"
    goal.result_future.set_result(SimpleNamespace(result=SimpleNamespace(
        success=False, error_code=int(ErrorCode.INPUT_REJECTED), message=message, steps=0, rolled_back=False,
        stop_reason="input_rejected"), status=6))
    assert t.tick_once() == bt.NodeStatus.FAILURE
    bb = t.root_blackboard()
    assert bb.get_string("error_name") == "INPUT_REJECTED" and bb.get_string("error_message").endswith(message)


@pytest.fixture
def clock(monkeypatch):
    """The request core's monotonic clock, advanced by the test (no sleeping)."""
    from flashrt_ros.bt import goal_request, service_request
    fake = SimpleNamespace(now=1000.0)
    fake.monotonic = lambda: fake.now
    for module in (service_request, goal_request):      # where the request core reads its clock
        monkeypatch.setattr(module, "time", fake)
    return fake


def test_btcpp_nodes_resend_a_lost_reply_under_its_request_id(clock):
    """The lost-reply rules live in the shared request core: BT.CPP nodes get them too. A rollback (a repeat
    would go back twice without its id) is re-sent under the same request id; unanswered, it ends in TIMEOUT."""
    client = FakeClient()
    t = FlashRTTrees(client).load(tree('<Sequence><Restore capsule="c"/><Rollback steps="2"/></Sequence>'))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    clock.now += 2.0                          # the restore's reply is lost
    assert t.tick_once() == bt.NodeStatus.RUNNING and [v for v, _, _ in client.sent] == ["restore", "restore"]
    client.sent[1][2].set_result(SimpleNamespace(**vars(ok("restored")), capsule=SimpleNamespace(position=3)))
    assert t.tick_once() == bt.NodeStatus.RUNNING and client.sent[0][2].cancelled()
    assert client.sent[2][0] == "rollback"
    clock.now += 2.0                          # the rollback's reply is lost: re-sent under its id
    assert t.tick_once() == bt.NodeStatus.RUNNING and len(client.sent) == 4
    assert client.request_ids[2] == client.request_ids[3] and len(client.request_ids[2]) == 32
    clock.now += 15.0
    assert t.tick_once() == bt.NodeStatus.FAILURE
    message = t.root_blackboard().get_string("error_message")
    assert "TIMEOUT" in message and "sent 2 times" in message, message


def test_btcpp_goal_whose_acceptance_is_lost_is_cancelled_by_its_id(clock):
    client = FakeClient()
    t = FlashRTTrees(client).load(tree('<RunPolicy max_steps="10" answer_timeout_s="5"/>'))
    assert t.tick_once() == bt.NodeStatus.RUNNING
    clock.now += 6.0                          # the goal response was lost
    assert t.tick_once() == bt.NodeStatus.FAILURE
    assert len(client.goals) == 1 and client.cancelled_ids == ["goal0"] and client.cancelled_actions == ["run_policy"]
    assert "TIMEOUT" in t.root_blackboard().get_string("error_message")


def test_blackboard_values_from_the_command_line():
    assert [blackboard_value(v) for v in ("true", "False", "3", "2.5", "pre")] == [True, False, 3, 2.5, "pre"]


def test_a_tick_returns_running_while_the_service_is_still_inside_its_callback(ros_node):  # noqa: F811
    """Non-blocking by condition: the server holds the request until the test lets it go."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from flashrt_ros.client import FlashRTClient
    from flashrt_ros.srv import Snapshot

    entered, release = threading.Event(), threading.Event()

    def slow_snapshot(request, response):
        entered.set()
        release.wait(60)
        response.success, response.message = True, "slow but done"
        response.capsule.position = 42
        return response

    server = rclpy.create_node("slow_flashrt", namespace="/slow")
    server.create_service(Snapshot, "/slow/flashrt/snapshot", slow_snapshot)
    executor = SingleThreadedExecutor()
    executor.add_node(server)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        client = FlashRTClient(ros_node, "/slow/flashrt")
        t = FlashRTTrees(client).load(tree('<Snapshot capsule="s" position="{pos}" timeout_s="120"/>'))
        while not entered.is_set():                 # discovery, then the request reaches the server
            assert t.tick_once() == bt.NodeStatus.RUNNING
            entered.wait(0.01)
        assert t.tick_once() == bt.NodeStatus.RUNNING and not release.is_set(), \
            "the tick returned while the server was still answering"
        release.set()
        status = bt.NodeStatus.RUNNING
        while status == bt.NodeStatus.RUNNING:
            status = t.tick_once()
            release.wait(0.01)
        assert status == bt.NodeStatus.SUCCESS and t.root_blackboard().get_int("pos") == 42
    finally:
        release.set()
        executor.shutdown()
        spin.join(5)
        server.destroy_node()


DOC = MODEL.parents[3] / "docs" / "behaviour_trees.md"


def test_docs_trees_load_against_the_node_model():
    """The XML in docs/behaviour_trees.md (what a C++ tree with the same nodes runs) passes the port checks."""
    import re
    blocks = re.findall(r"```xml\n(.*?)```", DOC.read_text(), re.S)
    assert blocks
    for xml in blocks:
        assert FlashRTTrees(FakeClient()).load(xml) is not None


def test_status_conditions_say_why():
    from flashrt_ros.bt.requests import check_status
    status = SimpleNamespace(lifecycle_state="active", engine_kind="policy", inputs_state="stale",
                             inputs_detail="observation 2.1 s old", busy=False, paused=False)
    assert check_status(None, "inputs_fresh") == (False, "no ~/status received yet")
    assert check_status(status, "inputs_fresh") == (False, "inputs stale: observation 2.1 s old")
    assert check_status(status, "policy_paused") == (False, "policy not paused"), "idle (no goal) is not paused"
    assert check_status(SimpleNamespace(**{**vars(status), "paused": True}), "policy_paused")[0]
    assert check_status(SimpleNamespace(**{**vars(status), "engine_kind": "llm"}), "policy_paused")[0] is False
    assert check_status(SimpleNamespace(**{**vars(status), "lifecycle_state": "inactive"}), "inputs_fresh") \
        == (False, "node is inactive")


def test_groot2_publisher_starts_with_the_cli_runner(tmp_path):
    import socket
    import subprocess
    import sys

    from rosproc import REPO, ros_env
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "only_builtins.xml"
    path.write_text(tree("<AlwaysSuccess/>"))
    out = subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", "/nobody/flashrt", "--timeout", "0.5",
                          "bt", "run", str(path), "--groot", str(port)],
                         capture_output=True, text=True, env=ros_env(), cwd=str(REPO), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"publishing to Groot2 on port {port}" in out.stdout and "tree: SUCCESS" in out.stdout
    assert "not found" not in out.stdout + out.stderr, "a tree that calls no node waits for none"


def test_a_tree_saved_by_groot2_with_the_model_inside_loads():
    model = MODEL.read_text()
    inner = model[model.index("<TreeNodesModel>"):model.index("</TreeNodesModel>") + len("</TreeNodesModel>")]
    xml = ('<root BTCPP_format="4" main_tree_to_execute="T"><BehaviorTree ID="T"><Snapshot capsule="a"/>'
           f"</BehaviorTree>{inner}</root>")
    client = FakeClient()
    assert FlashRTTrees(client).load(xml).tick_once() == bt.NodeStatus.RUNNING
    assert client.sent[0][0] == "snapshot"


def test_a_client_error_fails_the_node_with_internal_instead_of_throwing():
    client = FakeClient()

    def broken(verb, **fields):
        raise RuntimeError("rclpy refused the request")
    client.call_async = broken
    t = FlashRTTrees(client).load(tree('<Snapshot capsule="a" error_code="{code}" error_message="{why}"/>'))
    assert t.tick_once() == bt.NodeStatus.FAILURE
    bb = t.root_blackboard()
    assert bb.get_int("code") == int(ErrorCode.INTERNAL) and "rclpy refused" in bb.get_string("why")


def test_bt_run_logs_every_transition_to_a_groot2_file_and_traces_builtins(tmp_path):
    import subprocess
    import sys

    from rosproc import REPO, ros_env
    path = tmp_path / "builtins.xml"
    path.write_text(tree('<Sequence name="both"><AlwaysSuccess name="first"/><AlwaysSuccess name="second"/>'
                         "</Sequence>"))
    log = tmp_path / "run.btlog"
    out = subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", "/nobody/flashrt", "bt", "run",
                          str(path), "--btlog", str(log), "--trace"],
                         capture_output=True, text=True, env=ros_env(), cwd=str(REPO), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tree: SUCCESS" in out.stdout and f"logging every transition to {log}" in out.stdout
    for name in ("both", "first", "second"):       # StdCoutLogger: one line per transition of each node
        assert any(name in line and "->" in line for line in out.stdout.splitlines()), out.stdout
    data = log.read_bytes()
    assert data and b"BehaviorTree" in data[:4096], "FileLogger2 writes the tree's XML, then the transitions"
