"""Each capsule verb is declared once (``flashrt_ros/interface/services.py``) and every front-end is
made from that declaration: the declaration agrees with the .srv files, the node has a handler for
exactly the declared verbs, and the CLI, the client and both behaviour-tree front-ends offer exactly
what it says (the generated docs: ``test_generated_artefacts.py``)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from flashrt_ros.interface.services import BY_NAME, VERBS

REPO = Path(__file__).resolve().parents[1]
#: rosidl field types a declared field type stands for
_ROSIDL = {str: {"string"}, bool: {"boolean"}, float: {"double", "float"},
           int: {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"}}


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.name)
def test_declared_fields_are_the_request_fields_of_the_srv(verb):
    declared = {f.name: f.kind for f in verb.fields}
    in_srv = dict(verb.srv.Request.get_fields_and_field_types())
    if verb.takes_request_id:               # the client's own field (client.services.with_request_id), not a user's
        assert in_srv.pop("request_id") == "string"
    assert set(declared) == set(in_srv), f"{verb.name}: declared {sorted(declared)}, .srv has {sorted(in_srv)}"
    for name, kind in declared.items():
        assert in_srv[name] in _ROSIDL[kind], f"{verb.name}.{name}: {kind.__name__} vs {in_srv[name]}"


def test_every_srv_file_is_the_service_of_one_verb():
    """A new .srv without a declaration (or a declaration of another type) is caught here."""
    declared = {v.srv.__name__ for v in VERBS if v.srv.__module__.startswith("flashrt_ros")}
    assert declared == {p.stem for p in (REPO / "srv").glob("*.srv")}


def test_the_client_and_the_cli_offer_every_verb_as_declared():
    from flashrt_ros.cli import BY_COMMAND, _parser
    from flashrt_ros.client import RETRY_SAFE_VERBS, SERVICES, retry_safe
    for verb in VERBS:
        assert SERVICES[verb.name] == (verb.srv, verb.name)
        assert (verb.name in RETRY_SAFE_VERBS) == verb.retry_safe
        if verb.retry_safe_if:
            assert retry_safe(verb.name, {verb.retry_safe_if: True}) and not retry_safe(verb.name, {})
        assert BY_COMMAND[verb.command] is verb
        argv = [verb.command] + ["1" if f.kind is int else "x" for f in verb.fields if f.positional]
        args = _parser().parse_args(argv)
        for f in verb.fields:
            if not f.positional:
                assert getattr(args, f.cli_dest) == f.default, f"{verb.command} --{f.cli_dest}"


def test_tree_nodes_and_behaviours_are_made_from_the_declarations():
    from flashrt_ros import bt
    from flashrt_ros.bt.nodes import BY_ID
    for verb in (v for v in VERBS if v.tree is not None):
        node = BY_ID[verb.tree.id]
        assert node.verb == verb.name and node.doc == verb.tree.doc
        inputs = {p.name: p.default for p in node.inputs if p.name not in ("node", "timeout_s")}
        assert inputs == {f.port_name: f.default for f in verb.fields}
        behaviour = getattr(bt, verb.tree.id)
        assert behaviour.verb == verb.name
        params = list(inspect.signature(behaviour).parameters)
        assert params == ["name", "client", *(f.arg_name for f in verb.fields if f.positional),
                          *(f.arg_name for f in verb.fields if not f.positional), "timeout_s"]


def test_the_node_has_a_handler_for_exactly_the_declared_verbs():
    from flashrt_ros.ros.verb_handlers import HANDLERS
    assert set(HANDLERS) == set(BY_NAME)


def test_a_field_below_its_minimum_is_refused_by_the_declaration():
    rollback = BY_NAME["rollback"]
    assert rollback.refusal(rollback.srv.Request(steps=0), "llm") == "steps must be >= 1"
    assert rollback.refusal(rollback.srv.Request(steps=1), "policy") is None
    assert BY_NAME["pause"].refusal(BY_NAME["pause"].srv.Request(), "llm") == "pause applies to engine_kind=policy"


# --- the actions ---------------------------------------------------------------------------------
from flashrt_ros.interface.actions import ACTIONS  # noqa: E402


@pytest.mark.parametrize("decl", ACTIONS, ids=lambda a: a.name)
def test_declared_goal_fields_are_the_goal_fields_of_the_action(decl):
    in_action = decl.action.Goal.get_fields_and_field_types()
    assert [f.name for f in decl.goal] == list(in_action), f"{decl.name}: declaration and .action differ"
    for f in decl.goal:
        assert in_action[f.name] in _ROSIDL[f.kind], f"{decl.name}.{f.name}: {f.kind.__name__} vs {in_action[f.name]}"
    results = decl.action.Result.get_fields_and_field_types()
    for o in decl.outputs:
        assert results[o.name] in _ROSIDL[o.kind], f"{decl.name} result {o.name}"


def test_every_action_file_is_one_declared_action():
    assert {a.action.__name__ for a in ACTIONS} == {p.stem for p in (REPO / "action").glob("*.action")}


@pytest.mark.parametrize("decl", ACTIONS, ids=lambda a: a.name)
def test_the_client_sends_the_declared_defaults_and_refuses_an_unknown_field(decl):
    goal = decl.goal_message()
    assert {f.name: getattr(goal, f.name) for f in decl.goal} == {f.name: f.default for f in decl.goal}
    with pytest.raises(ValueError, match=f"{decl.name}: unknown goal field 'speed'"):
        decl.goal_message(speed=2)


@pytest.mark.parametrize("decl", ACTIONS, ids=lambda a: a.name)
def test_the_cli_and_the_tree_node_offer_the_goal_fields_as_declared(decl):
    from flashrt_ros.bt.nodes import BY_ID
    from flashrt_ros.cli import _parser
    from flashrt_ros.cli.goal_commands import goal_fields
    argv = [decl.command] + ["x" for f in decl.cli_fields if f.positional]
    given = goal_fields(decl, _parser().parse_args(argv))
    assert given == {f.name: ("x" if f.positional else (not f.default if f.cli_inverted else f.default))
                     for f in decl.cli_fields}
    node = BY_ID[decl.tree_id]
    assert node.verb == decl.name and node.doc == decl.tree_doc
    ports = {p.name: p.default for p in node.inputs}
    assert {f.name: f.default for f in decl.tree_fields}.items() <= ports.items()
    assert [p.name for p in node.ports if p.output] == [o.name for o in decl.outputs]


def test_the_generate_command_turns_raw_into_no_chat_template():
    from flashrt_ros.cli import _parser
    from flashrt_ros.cli.goal_commands import goal_fields
    from flashrt_ros.interface.actions import GENERATE
    assert goal_fields(GENERATE, _parser().parse_args(["generate", "hi"]))["use_chat_template"] is True
    assert goal_fields(GENERATE, _parser().parse_args(["generate", "hi", "--raw"]))["use_chat_template"] is False
