"""The BehaviorTree.CPP node definitions: one table for registration, the Groot2 model and the docs.

Each ``NodeDef`` names a node as a BT.CPP XML tree writes it (``<Snapshot
capsule="pre"/>``), its ports with the services' defaults, and how its port
values become a request of ``flashrt_ros.bt.requests`` and how the answer fills
its output ports. ``tree_nodes_model_xml()`` writes the ``<TreeNodesModel>``
Groot2 loads; ``python -m flashrt_ros.bt.nodes`` prints it (the installed
``trees/flashrt_nodes.xml`` is that output, checked by a test).

Every action node also has the output ports ``error_code`` and
``error_message``, by default the blackboard entries of the same names: the
code (0 on success) and message of the last flashrt node that finished.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable
from xml.sax.saxutils import escape, quoteattr

from flashrt_ros.bt.requests import (DEFAULT_TIMEOUT_S, GoalRequest, ServiceRequest, check_status, run_policy_fields,
                                     status_watch)

_TYPE_NAMES = {str: "std::string", int: "int", float: "double", bool: "bool"}


@dataclass(frozen=True)
class Port:
    """One port. ``default`` None: required. Outputs' defaults are blackboard references."""

    name: str
    kind: type
    default: Any
    doc: str
    output: bool = False


@dataclass(frozen=True)
class NodeDef:
    """One BT.CPP node: its ID, kind, ports and how it maps onto the request core."""

    id: str
    kind: str                                   # Action | Condition
    doc: str
    ports: tuple[Port, ...]
    start: Callable[[Any, dict[str, Any]], Any] | None = None       # (client, inputs) -> request
    outputs: Callable[[Any], dict[str, Any]] = field(default=lambda _answer: {})   # answer -> output values
    condition: str = ""                          # Condition nodes: requests.check_status's name

    @property
    def inputs(self) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if not p.output)


ERROR_PORTS = (
    Port("error_code", int, "{error_code}", "0 on success, else the node's ErrorCode (docs/services.md)", True),
    Port("error_message", str, "{error_message}", "the node's message (the reason on failure)", True),
)


def _service(verb: str, fields: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Any, dict], Any]:
    return lambda client, v: ServiceRequest(client, verb, fields(v), timeout_s=v["timeout_s"])


def _goal(action: str, fields: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Any, dict], Any]:
    return lambda client, v: GoalRequest(client, action, fields(v), timeout_s=v["timeout_s"],
                                         answer_timeout_s=v["answer_timeout_s"])


_SERVICE_TIMEOUT = Port("timeout_s", float, DEFAULT_TIMEOUT_S,
                        "FAILURE with TIMEOUT if the service is absent or does not answer within this")
_GOAL_TIMEOUTS = (
    Port("timeout_s", float, 0.0, "cancel the goal and FAIL with TIMEOUT after this (0: no limit)"),
    Port("answer_timeout_s", float, DEFAULT_TIMEOUT_S, "bound on finding the action server and the goal's acceptance"),
)
_ROLLBACK = Port("rollback_on_cancel", bool, False,
                 "on halt, restore the state the goal started from (the node parameter of the same name also does)")
_POSITION = Port("position", int, "", "the capsule's / state's position (steps or tokens)", True)


def _capsule_position(response: Any) -> dict[str, Any]:
    return {"position": int(response.capsule.position)}


NODES: tuple[NodeDef, ...] = (
    NodeDef("Snapshot", "Action", "Copy the live state into capsule `capsule` at the next committed boundary.", (
        Port("capsule", str, None, "capsule name"),
        Port("tier", str, "", "device | host | disk (empty: the node's default_tier)"),
        Port("session", str, "", "session tag (empty: the current session)"),
        Port("pin", bool, False, "pin it (budgets never demote it)"),
        Port("overwrite", bool, False, "replace an existing capsule of that name"),
        _SERVICE_TIMEOUT, _POSITION),
        start=_service("snapshot", lambda v: dict(name=v["capsule"], tier=v["tier"], session=v["session"],
                                                  pin=v["pin"], overwrite=v["overwrite"])),
        outputs=_capsule_position),
    NodeDef("Restore", "Action", "Copy capsule `capsule` back into the live state at the next committed boundary.", (
        Port("capsule", str, None, "capsule name"),
        Port("verify", bool, False, "re-hash the capsule first (refuse a damaged one)"),
        _SERVICE_TIMEOUT, _POSITION),
        start=_service("restore", lambda v: dict(name=v["capsule"], verify=v["verify"])),
        outputs=_capsule_position),
    NodeDef("Fork", "Action", "Copy capsule `source` into a new independent capsule `capsule` (store only).", (
        Port("source", str, None, "existing capsule"),
        Port("capsule", str, None, "new capsule name"),
        Port("tier", str, "", "tier of the copy (empty: the node's default_tier)"),
        _SERVICE_TIMEOUT, _POSITION),
        start=_service("fork", lambda v: dict(source=v["source"], name=v["capsule"], tier=v["tier"])),
        outputs=_capsule_position),
    NodeDef("Drop", "Action", "Delete capsule `capsule` from every tier, disk files included (store only).", (
        Port("capsule", str, None, "capsule name"),
        _SERVICE_TIMEOUT),
        start=_service("drop", lambda v: dict(name=v["capsule"]))),
    NodeDef("Rollback", "Action", "Go back `steps` committed boundaries (at most the node's rollback_depth).", (
        Port("steps", int, 1, "boundaries to undo (>= 1)"),
        _SERVICE_TIMEOUT, _POSITION),
        start=_service("rollback", lambda v: dict(steps=v["steps"])),
        outputs=lambda r: {"position": int(r.position)}),
    NodeDef("Reset", "Action", "Empty the current session's state (a new episode or conversation); capsules stay.", (
        _SERVICE_TIMEOUT,),
        start=_service("reset", lambda v: {})),
    NodeDef("SwitchSession", "Action", "Park the current session and make `session` live (a new name starts empty).", (
        Port("session", str, None, "session to make live"),
        _SERVICE_TIMEOUT,
        Port("previous_session", str, "", "the session that was live before", True)),
        start=_service("switch_session", lambda v: dict(session=v["session"])),
        outputs=lambda r: {"previous_session": r.previous_session}),
    NodeDef("PausePolicy", "Action", "Stop the policy loop at a boundary; its state stays exactly where it was.", (
        _SERVICE_TIMEOUT,),
        start=_service("pause", lambda v: {})),
    NodeDef("ResumePolicy", "Action", "Restart the policy loop.", (_SERVICE_TIMEOUT,),
            start=_service("resume", lambda v: {})),
    NodeDef("RunPolicy", "Action", "Run the policy for `max_steps` steps and/or `max_duration_s` seconds; "
            "halt cancels it between two steps.", (
                Port("max_steps", int, 0, "stop after this many policy steps (0: no step limit)"),
                Port("max_duration_s", float, 0.0, "stop after this long (0: no time limit); set one of the two"),
                Port("session", str, "", "session to run in (empty: the current one)"),
                _ROLLBACK,
                Port("resume_after_halt", bool, False, "after a halt, the next start runs only the steps the halted "
                     "goal left (an interrupted mission still takes exactly max_steps)"),
                *_GOAL_TIMEOUTS,
                Port("steps", int, "", "policy steps the goal took", True),
                Port("stop_reason", str, "", "max_steps | max_duration | deactivated", True),
                Port("rolled_back", bool, "", "the goal's start was restored (only after a cancel)", True)),
            start=_goal("run_policy", lambda v: run_policy_fields(
                v["max_steps"], v["max_duration_s"], v["session"], v["rollback_on_cancel"],
                v["budget"] if v["resume_after_halt"] else None)),
            outputs=lambda r: {"steps": int(r.steps), "stop_reason": r.stop_reason,
                               "rolled_back": bool(r.rolled_back)}),
    NodeDef("Generate", "Action", "Generate text (LLM engine); halt cancels it at the next token boundary.", (
        Port("prompt", str, "", "text to append (empty: continue the live context)"),
        Port("use_chat_template", bool, False, "wrap the prompt as a user turn"),
        Port("reset", bool, False, "start from an empty context"),
        Port("max_new_tokens", int, 0, "0: the node's max_new_tokens"),
        Port("temperature", float, 0.0, "0: greedy"),
        Port("top_k", int, 0, "0: off"),
        Port("top_p", float, 1.0, "1: off"),
        Port("seed", int, 0, "0: keep the RNG stream in the state; else reseed"),
        Port("session", str, "", "conversation (empty: the current one)"),
        _ROLLBACK, *_GOAL_TIMEOUTS,
        Port("text", str, "", "the generated text", True),
        Port("stop_reason", str, "", "stop_token | max_new_tokens | context_full", True)),
        start=_goal("generate", lambda v: {k: v[k] for k in (
            "prompt", "use_chat_template", "reset", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
            "session", "rollback_on_cancel")}),
        outputs=lambda r: {"text": r.text, "stop_reason": r.stop_reason}),
    NodeDef("InputsFresh", "Condition", "SUCCESS while the policy's inputs are fresh (the node's latest ~/status).",
            (), condition="inputs_fresh"),
    NodeDef("IsPolicyPaused", "Condition", "SUCCESS while the policy loop is paused (the node's latest ~/status).",
            (), condition="policy_paused"),
)

BY_ID: dict[str, NodeDef] = {n.id: n for n in NODES}


def all_ports(node: NodeDef) -> tuple[Port, ...]:
    """The node's ports, with the error outputs every action has."""
    return node.ports + (ERROR_PORTS if node.kind == "Action" else ())


def condition_holds(node: NodeDef, client: Any) -> tuple[bool, str]:
    """A condition node's verdict on the client's latest ``~/status``."""
    return check_status(status_watch(client).latest, node.condition)


def _port_xml(port: Port) -> str:
    tag = "output_port" if port.output else "input_port"
    default = "" if port.default is None or port.default == "" else \
        f" default={quoteattr(str(port.default).lower() if isinstance(port.default, bool) else str(port.default))}"
    return (f'      <{tag} name="{port.name}" type="{_TYPE_NAMES[port.kind]}"{default}>'
            f"{escape(port.doc)}</{tag}>")


def tree_nodes_model_xml() -> str:
    """The Groot2 ``<TreeNodesModel>`` of every flashrt node (generated, never hand-written)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             "<!-- Generated by `python -m flashrt_ros.bt.nodes` from flashrt_ros/bt/nodes.py; do not edit. -->",
             '<root BTCPP_format="4">', "  <TreeNodesModel>"]
    for node in NODES:
        lines.append(f'    <{node.kind} ID="{node.id}">')
        lines += [_port_xml(p) for p in all_ports(node)]
        lines.append(f"      <MetadataFields><Metadata description={quoteattr(node.doc)}/></MetadataFields>")
        lines.append(f"    </{node.kind}>")
    lines += ["  </TreeNodesModel>", "</root>", ""]
    return "\n".join(lines)


def _default_text(port: Port) -> str:
    if port.output:
        return f"`{port.default}`" if port.default else "-"
    if port.default is None:
        return "required"
    return f"`{str(port.default).lower() if isinstance(port.default, bool) else port.default}`" \
        if port.default != "" else '`""`'


def nodes_markdown() -> str:
    """The node table of docs/behaviour_trees.md (generated; a test keeps the doc current)."""
    rows = ["| node | kind | ports (in: default; out: blackboard entry by default) | does |",
            "| --- | --- | --- | --- |"]
    for node in NODES:
        ports = ", ".join(f"{'out ' if p.output else ''}`{p.name}` ({_default_text(p)})"
                          for p in node.ports) or "-"
        rows.append(f"| `{node.id}` | {node.kind} | {ports} | {node.doc} |")
    rows.append("")
    rows.append("Every action also has the outputs `error_code` (`{error_code}`) and `error_message` "
                "(`{error_message}`).")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys
    print(nodes_markdown() if "--markdown" in sys.argv else tree_nodes_model_xml(), end="")
