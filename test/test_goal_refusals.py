"""Every refusal of a Generate or RunPolicy goal leaves the live state and the current session as
they were (in-process nodes, real DDS). Before the fix a goal naming a new session was checked only
after the switch: ``generate "" --session fresh`` was refused yet left ``fresh`` live."""
from __future__ import annotations

from typing import Any

import pytest
from rclpy.action import ActionClient
from rclpy.parameter import Parameter

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.client.action_client import RaceFreeActionClient  # the peer is already spinning
from flashrt_ros.runtime.errors import ErrorCode
from policy_io_harness import RosHarness, wait_until

LONG = "word " * 400          # far more tokens than max_context below


@pytest.fixture(scope="module")
def ros():
    harness = RosHarness()
    yield harness
    harness.close()


def _run(client: ActionClient, goal: Any) -> Any:
    assert client.wait_for_server(timeout_sec=60)
    future = client.send_goal_async(goal)
    handle = wait_until(lambda: future.done() and future.result(), timeout=60, what="goal response")
    assert handle.accepted
    result = handle.get_result_async()
    return wait_until(lambda: result.done() and result.result(), timeout=120, what="result").result


def _state(engine: Any) -> tuple:
    """What a refusal must not change: the current session, every session, every capsule (hidden too)."""
    store = engine.capsules.store
    return (engine.capsules.sessions.current, tuple(engine.capsules.sessions.sessions()),
            tuple((c.name, c.content_hash) for c in store.list(include_hidden=True)))


def _assert_unchanged(engine: Any, before: tuple) -> None:
    assert _state(engine) == before
    report = engine.capsules.verify("refusal_probe", against_live=True)
    assert report.ok, f"live state changed: {report.detail}"


@pytest.fixture(scope="module")
def llm(ros, tmp_path_factory):
    from flashrt_ros.ros.node import FlashRTNode
    node = FlashRTNode("flashrt", namespace="/refuse_llm", parameter_overrides=[
        Parameter(k, value=v) for k, v in {
            "engine_kind": "llm", "model": "random-llama-tiny", "device": "cpu", "max_context": 64,
            "capsule_disk_budget_mb": 0, "rollback_on_cancel": True,
            "capsule_directory": str(tmp_path_factory.mktemp("refuse") / "c")}.items()])
    ros.executor.add_node(node)
    ros.nodes.append(node)
    node.trigger_configure()
    node.trigger_activate()
    client = RaceFreeActionClient(ros.peer, Generate, "/refuse_llm/flashrt/generate")
    # a parked session "other" with a transcript, then back to "default" with one of its own
    for session in ("other", "default"):
        result = _run(client, Generate.Goal(prompt="the robot picks up", max_new_tokens=4, session=session,
                                            top_p=1.0))
        assert result.success, result.message
    yield node, client


# (id, goal fields, node parameters set for this case, expected error code)
GENERATE_REFUSALS = [
    ("empty prompt, new session", dict(prompt="", session="fresh"), {}, ErrorCode.INVALID_ARGUMENT),
    ("too long, new session", dict(prompt=LONG, session="fresh"), {}, ErrorCode.CONTEXT_OVERFLOW),
    ("too long, parked session", dict(prompt=LONG, session="other"), {}, ErrorCode.CONTEXT_OVERFLOW),
    ("too long, current session", dict(prompt=LONG), {}, ErrorCode.CONTEXT_OVERFLOW),
    ("reset, empty prompt", dict(prompt="", reset=True), {}, ErrorCode.INVALID_ARGUMENT),
    ("reset, too long, new session", dict(prompt=LONG, reset=True, session="fresh"), {},
     ErrorCode.CONTEXT_OVERFLOW),
    ("reset, too long, parked session", dict(prompt=LONG, reset=True, session="other"), {},
     ErrorCode.CONTEXT_OVERFLOW),
    ("bad session name", dict(prompt="hi", session="no spaces allowed"), {}, ErrorCode.INVALID_NAME),
    ("negative temperature, new session", dict(prompt="hi", temperature=-1.0, session="fresh"), {},
     ErrorCode.INVALID_ARGUMENT),
    ("top_p above 1", dict(prompt="hi", top_p=2.0), {}, ErrorCode.INVALID_ARGUMENT),
    ("start capsule refused, new session", dict(prompt="hi", session="fresh"), {"default_tier": "disk"},
     ErrorCode.BUDGET_EXHAUSTED),
    ("start capsule refused, parked session", dict(prompt="hi", session="other"), {"default_tier": "disk"},
     ErrorCode.BUDGET_EXHAUSTED),
]


@pytest.mark.parametrize("fields,params,code", [c[1:] for c in GENERATE_REFUSALS],
                         ids=[c[0] for c in GENERATE_REFUSALS])
def test_a_refused_generate_goal_changes_nothing(llm, fields, params, code):
    node, client = llm
    _refused_without_a_trace(node, client, Generate.Goal(**{"top_p": 1.0, "max_new_tokens": 4, **fields}),
                             params, code)


def _refused_without_a_trace(node: Any, client: ActionClient, goal: Any, params: dict, code: int) -> None:
    """Send ``goal`` with ``params`` set on the node: it must be refused with ``code``, changing nothing."""
    engine = node._engine
    engine.capsules.snapshot("refusal_probe", overwrite=True)
    before = _state(engine)
    node.set_parameters([Parameter(k, value=v) for k, v in params.items()])
    node._config = node._read_config()          # the LLM goal reads default_tier from the config
    try:
        result = _run(client, goal)
    finally:
        node.set_parameters([Parameter("default_tier", value="device")])
        node._config = node._read_config()
    assert not result.success and result.error_code == code, result.message
    _assert_unchanged(engine, before)


def test_a_goal_on_a_parked_session_still_continues_it(llm):
    """The checks on the target session do not get in the way of an accepted goal."""
    node, client = llm
    engine = node._engine
    result = _run(client, Generate.Goal(prompt=" and", max_new_tokens=2, session="other", top_p=1.0))
    assert result.success, result.message
    assert engine.capsules.sessions.current == "other"
    result = _run(client, Generate.Goal(prompt=" and", max_new_tokens=2, session="default", top_p=1.0))
    assert result.success and engine.capsules.sessions.current == "default"


@pytest.fixture(scope="module")
def policy(ros, tmp_path_factory):
    node = ros.policy_node("refuse_policy", tmp_path_factory.mktemp("refuse_p"), run_mode="goal",
                           capsule_disk_budget_mb=0, rollback_on_cancel=True)
    client = RaceFreeActionClient(ros.peer, RunPolicy, "/refuse_policy/flashrt/run_policy")
    node._engine.capsules.switch_session("parked")
    node._engine.capsules.switch_session("default")
    yield node, client


RUN_POLICY_REFUSALS = [
    ("no end, new session", dict(session="fresh"), {}, ErrorCode.INVALID_ARGUMENT),
    ("bad session name", dict(max_steps=3, session="a/b"), {}, ErrorCode.INVALID_NAME),
    ("start capsule refused, new session", dict(max_steps=3, session="fresh"), {"default_tier": "disk"},
     ErrorCode.BUDGET_EXHAUSTED),
    ("start capsule refused, parked session", dict(max_steps=3, session="parked"), {"default_tier": "disk"},
     ErrorCode.BUDGET_EXHAUSTED),
    ("start capsule refused, current session", dict(max_steps=3), {"default_tier": "disk"},
     ErrorCode.BUDGET_EXHAUSTED),
]


@pytest.mark.parametrize("fields,params,code", [c[1:] for c in RUN_POLICY_REFUSALS],
                         ids=[c[0] for c in RUN_POLICY_REFUSALS])
def test_a_refused_run_policy_goal_changes_nothing(policy, fields, params, code):
    node, client = policy
    _refused_without_a_trace(node, client, RunPolicy.Goal(**fields), params, code)


SWITCH_REFUSALS = [
    ("empty name", "", None, ErrorCode.INVALID_ARGUMENT),
    ("bad name", "a/b", None, ErrorCode.INVALID_NAME),
    ("no room to park, new session", "fresh", "disk", ErrorCode.BUDGET_EXHAUSTED),
    ("no room to park, parked session", "parked", "disk", ErrorCode.BUDGET_EXHAUSTED),
]


@pytest.mark.parametrize("session,park_tier,code", [c[1:] for c in SWITCH_REFUSALS],
                         ids=[c[0] for c in SWITCH_REFUSALS])
def test_a_refused_switch_session_request_changes_nothing(ros, policy, session, park_tier, code):
    """~/switch_session goes through the same undo-on-refusal switch as the goals."""
    from flashrt_ros.client import FlashRTClient
    node, _ = policy
    engine = node._engine
    engine.capsules.snapshot("refusal_probe", overwrite=True)
    before = _state(engine)
    sessions = engine.capsules.sessions
    saved_tier, sessions.park_tier = sessions.park_tier, park_tier or sessions.park_tier   # disk: no budget
    try:
        client = FlashRTClient(ros.peer, "/refuse_policy/flashrt")     # re-sends it after a lost reply
        response = client.call("switch_session", session=session, check=False, timeout_s=60.0, wait_s=60.0)
    finally:
        sessions.park_tier = saved_tier
    assert not response.success and response.error_code == code, response.message
    _assert_unchanged(engine, before)
