"""The BehaviorTree.CPP node definitions: one table for registration, the Groot2 model and the docs.

Each ``NodeDef`` names a node as a BT.CPP XML tree writes it (``<Snapshot
capsule="pre"/>``), its ports with the services' defaults, and how its port
values become a request of ``flashrt_ros.bt.requests`` and how the answer fills
its output ports. The capsule verbs' nodes are made from their declarations
(``interface/services.py``, ``verb_node``: one generic service node, each verb a
table entry there); the actions, conditions and topic nodes are written here.
``tree_nodes_model_xml()`` writes the ``<TreeNodesModel>`` Groot2 loads;
``python -m flashrt_ros.bt.nodes`` prints it (the installed ``trees/flashrt_nodes.xml``
is that output, checked by a test).

Every action node also has the output ports ``error_code``, ``error_name``
and ``error_message``, by default the blackboard entries of the same names: the
code (0 on success), its name (``NOT_FOUND``: branch on it in a script,
``error_name == 'NOT_FOUND'``) and message of the last flashrt node that
finished. Every node has a ``node`` port: which flashrt node (or simulator) it
acts on, so one tree drives several (empty: the runner's ``--node``).

Besides the verbs: ``TopicCondition`` and ``TargetReached`` (conditions on
topics, ``topics.py``), ``Publish`` (one message), and ``TimeoutTimer``, which
``btcpp.py`` puts in place of BT.CPP's ``Timeout`` (see there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable
from xml.sax.saxutils import escape, quoteattr

from flashrt_ros.bt.requests import (DEFAULT_TIMEOUT_S, GoalRequest, ServiceRequest, check_status, run_policy_fields,
                                     status_watch)
from flashrt_ros.bt.topics import OPERATORS, compare, field_value
from flashrt_ros.interface.services import VERBS, ServiceVerb

_TYPE_NAMES = {str: "std::string", int: "int", float: "double", bool: "bool"}


@dataclass(frozen=True)
class Port:
    """One port. ``default`` None: required. Outputs' defaults are blackboard references."""

    name: str
    kind: type
    default: Any
    doc: str
    output: bool = False
    choices: tuple[str, ...] = ()     # a literal must be one of these


@dataclass
class Verdict:
    """What a node that needs no request decides at a tick: SUCCESS or FAILURE, why, its outputs."""

    ok: bool
    why: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeDef:
    """One BT.CPP node: its ID, kind, ports and what it does.

    Exactly one of ``start`` (a stateful node over the request core: ``(client, inputs)
    -> request``) and ``check`` (decided at each tick, never waiting: ``(world, inputs)
    -> Verdict``; ``world`` is the tree's ``FlashRTTrees``: ``client_for(node)``,
    ``topics``) is set, except for ``TimeoutTimer``, which ``btcpp`` runs itself.
    """

    id: str
    kind: str                                   # Action | Condition (as Groot2's model calls it)
    doc: str
    ports: tuple[Port, ...]
    start: Callable[[Any, dict[str, Any]], Any] | None = None       # (client, inputs) -> request
    outputs: Callable[[Any], dict[str, Any]] = field(default=lambda _answer: {})   # answer -> output values
    check: Callable[[Any, dict[str, Any]], Verdict] | None = None   # (world, inputs) -> Verdict
    verb: str = ""            # request nodes: the service verb or action they call (readiness checks)
    waits: bool = False       # check nodes: RUNNING until the check holds (or timeout_s), not FAILURE

    @property
    def inputs(self) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if not p.output)


ERROR_PORTS = (
    Port("error_code", int, "{error_code}", "0 on success, else the node's ErrorCode (docs/services.md)", True),
    Port("error_name", str, "{error_name}", "the ErrorCode's name: OK, NOT_FOUND, BUSY, TIMEOUT, ... "
         "(branch in a script: error_name == 'NOT_FOUND')", True),
    Port("error_message", str, "{error_message}", "the node's message (the reason on failure)", True),
)
NODE_PORT = Port("node", str, "", "the flashrt node to act on, e.g. /robot1/flashrt (empty: bt run's --node)")
#: The node's ID that stands in for BT.CPP's Timeout (btcpp.py says why).
TIMEOUT_TIMER = "TimeoutTimer"


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


def verb_node(verb: ServiceVerb) -> NodeDef:
    """A capsule verb's node, from its declaration (``interface/services.py``): its request fields as
    input ports (under their port names), then ``node`` and ``timeout_s``, then its outputs."""
    tree = verb.tree
    assert tree is not None, f"{verb.name} declares no behaviour-tree node"
    ports = (tuple(Port(f.port_name, f.kind, f.default, f.doc) for f in verb.fields) + (NODE_PORT, _SERVICE_TIMEOUT)
             + tuple(Port(o.name, o.kind, "", o.doc, True) for o in tree.outputs))
    return NodeDef(tree.id, "Action", tree.doc, ports, verb=verb.name,
                   start=_service(verb.name, lambda v: {f.name: v[f.port_name] for f in verb.fields}),
                   outputs=lambda answer: {o.name: o.read(answer) for o in tree.outputs})


NODES: tuple[NodeDef, ...] = tuple(verb_node(verb) for verb in VERBS if verb.tree is not None) + (
    NodeDef("RunPolicy", "Action", "Run the policy for `max_steps` steps and/or `max_duration_s` seconds; "
            "halt cancels it between two steps.", (
                Port("max_steps", int, 0, "stop after this many policy steps (0: no step limit)"),
                Port("max_duration_s", float, 0.0, "stop after this long (0: no time limit); set one of the two"),
                Port("session", str, "", "session to run in (empty: the current one)"),
                _ROLLBACK,
                Port("resume_after_halt", bool, False, "after a halt, the next start runs only the steps the halted "
                     "goal left (an interrupted mission still takes exactly max_steps)"),
                NODE_PORT, *_GOAL_TIMEOUTS,
                Port("steps", int, "", "policy steps the goal took", True),
                Port("stop_reason", str, "", "max_steps | max_duration | deactivated", True),
                Port("rolled_back", bool, "", "the goal's start was restored (only after a cancel)", True)),
            verb="run_policy", start=_goal("run_policy", lambda v: run_policy_fields(
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
        _ROLLBACK, NODE_PORT, *_GOAL_TIMEOUTS,
        Port("text", str, "", "the generated text", True),
        Port("stop_reason", str, "", "stop_token | max_new_tokens | context_full", True)),
        verb="generate", start=_goal("generate", lambda v: {k: v[k] for k in (
            "prompt", "use_chat_template", "reset", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
            "session", "rollback_on_cancel")}),
        outputs=lambda r: {"text": r.text, "stop_reason": r.stop_reason}),
    NodeDef("SetParameter", "Action", "Set parameter `parameter` of `node` to `value`, as `ros2 param set` "
            "does (e.g. move the simulated arm's target: node=/sim parameter=target value=[0.12, 0.15]).", (
                Port("parameter", str, None, "the parameter's name"),
                Port("value", str, None, "its value, written as for ros2 param set: 3, 0.5, true, text, [a, b]"),
                NODE_PORT, _SERVICE_TIMEOUT),
            verb="set_parameters", start=_service("set_parameters", lambda v: dict(
                parameters=[parameter_message(v["parameter"], v["value"])]))),
    NodeDef("InputsFresh", "Condition", "SUCCESS while the policy's inputs are fresh (the node's latest ~/status).",
            (NODE_PORT,), check=lambda world, v: _status_check(world, v, "inputs_fresh")),
    NodeDef("IsPolicyPaused", "Condition", "SUCCESS while the policy loop is paused (the node's latest ~/status).",
            (NODE_PORT,), check=lambda world, v: _status_check(world, v, "policy_paused")),
    NodeDef("TopicCondition", "Condition", "SUCCESS while the latest message on `topic` has `field` `op` `value` "
            "(e.g. an operator's switch: topic=/operator/override value=true).", (
                Port("topic", str, None, "the topic to watch"),
                Port("type", str, "", "its type, e.g. std_msgs/msg/Bool (empty: as advertised on the ROS graph)"),
                Port("field", str, "data", "the field to compare: name, name.sub or name[index]"),
                Port("op", str, "==", "== != < <= > >=", choices=tuple(OPERATORS)),
                Port("value", str, None, "what to compare with (a bool, number or text, as the field is)"),
                Port("max_age_s", float, 0.0, "FAILURE if the latest message is older than this (0: any age)"),
                Port("last_value", str, "", "the field's latest value (as text)", True)),
            check=lambda world, v: _topic_check(world, v["topic"], v["type"], v["field"], v["op"], v["value"],
                                                v["max_age_s"], "last_value")),
    NodeDef("WaitForTopic", "Action", "RUNNING until the latest message on `topic` has `field` `op` `value`; "
            "FAILURE with TIMEOUT after `timeout_s` (e.g. wait until the simulator has applied the last "
            "command: topic=/sim/steps op='>=' value={steps}).", (
                Port("topic", str, None, "the topic to watch"),
                Port("type", str, "", "its type, e.g. std_msgs/msg/UInt64 (empty: as advertised on the ROS graph)"),
                Port("field", str, "data", "the field to compare: name, name.sub or name[index]"),
                Port("op", str, "==", "== != < <= > >=", choices=tuple(OPERATORS)),
                Port("value", str, None, "what to compare with (a bool, number or text, as the field is)"),
                Port("timeout_s", float, DEFAULT_TIMEOUT_S, "FAILURE with TIMEOUT if it does not hold by then "
                     "(0: wait for ever)"),
                Port("last_value", str, "", "the field's latest value (as text)", True)),
            check=lambda world, v: _topic_check(world, v["topic"], v["type"], v["field"], v["op"], v["value"],
                                                0.0, "last_value"), waits=True),
    NodeDef("TargetReached", "Condition", "SUCCESS while the simulated arm `node` reports its tip on the target "
            "and at rest (its ~/reached; the criterion of docs/benchmarks/arm_interrupts.md).", (
                Port("node", str, "/sim", "the simulator node (flashrt_sim)"),
                Port("max_age_s", float, 0.0, "FAILURE if the latest report is older than this (0: any age)"),
                Port("distance", float, "", "the tip's latest distance to the target in metres "
                     "(its ~/distance)", True)),
            check=lambda world, v: _target_reached(world, v)),
    NodeDef("Publish", "Action", "Publish one message on `topic` (a std_msgs scalar, or an array as a;b;c), "
            "e.g. a new target for the simulated arm.", (
                Port("topic", str, None, "the topic"),
                Port("type", str, None, "its type, e.g. std_msgs/msg/Float32MultiArray"),
                Port("value", str, None, "the data: true, 3, 0.5, text, or 0.12;0.15 for an array")),
            check=lambda world, v: _publish(world, v)),
    NodeDef(TIMEOUT_TIMER, "Action", "Stands in for BehaviorTree.CPP's Timeout (put there by flashrt; see "
            "docs/behaviour_trees.md): RUNNING until `msec` have passed since it started, then FAILURE.", (
                Port("msec", float, None, "the Timeout's msec (0: no limit)"),
                Port("child", str, "", "the name of the node the Timeout guards (for the log)"))),
)

BY_ID: dict[str, NodeDef] = {n.id: n for n in NODES}


def all_ports(node: NodeDef) -> tuple[Port, ...]:
    """The node's ports, with the error outputs every action has."""
    return node.ports + (ERROR_PORTS if node.kind == "Action" and node.id != TIMEOUT_TIMER else ())


def topics_read(node_id: str, given: dict[str, str]) -> list[tuple[str, str]]:
    """(topic, type) that a node of the XML reads, where its ports name them literally: the tree
    subscribes before its first tick, so a latched topic's latest message is there when asked."""
    literal = lambda text: text and not text.strip().startswith("{")  # noqa: E731
    if node_id in ("TopicCondition", "WaitForTopic") and literal(given.get("topic", "")):
        return [(given["topic"], given.get("type", ""))]
    if node_id == "TargetReached":
        sim = given.get("node", BY_ID["TargetReached"].ports[0].default)
        if literal(sim):
            return [(f"{sim.rstrip('/')}/distance", "std_msgs/msg/Float64"),
                    (f"{sim.rstrip('/')}/reached", "std_msgs/msg/Bool")]
    return []


def parameter_message(name: str, text: str) -> Any:
    """An ``rcl_interfaces/Parameter`` from ``ros2 param set`` style text."""
    from rclpy.parameter import Parameter, get_parameter_value, parameter_value_to_python
    if not name:
        raise ValueError("parameter: give the parameter's name")
    return Parameter(name, value=parameter_value_to_python(get_parameter_value(text))).to_parameter_msg()


def _status_check(world: Any, values: dict[str, Any], condition: str) -> Verdict:
    """A condition on the node's latest ``~/status``."""
    holds, why = check_status(status_watch(world.client_for(values["node"])).latest, condition)
    return Verdict(holds, why)


def _topic_check(world: Any, topic: str, type_name: str, field_path: str, op: str, value: str,
                 max_age_s: float, output: str) -> Verdict:
    if not world.topics.subscribe(topic, type_name):
        return Verdict(False, f"{topic}: nobody advertises it yet (or give its type)")
    latest = world.topics.latest(topic)
    if latest is None:
        return Verdict(False, f"{topic}: no message yet")
    msg, age = latest
    if max_age_s > 0 and age > max_age_s:
        return Verdict(False, f"{topic}: latest message {age:.2f} s old (max_age_s {max_age_s:g})")
    actual = field_value(msg, field_path)
    holds = compare(actual, op, value)
    return Verdict(holds, f"{topic} {field_path} = {actual!r}", {output: str(actual)})


def _target_reached(world: Any, values: dict[str, Any]) -> Verdict:
    sim = values["node"].rstrip("/")
    distance = _topic_check(world, f"{sim}/distance", "std_msgs/msg/Float64", "data", ">=", "0",
                            values["max_age_s"], "distance")
    reached = _topic_check(world, f"{sim}/reached", "std_msgs/msg/Bool", "data", "==", "true",
                           values["max_age_s"], "reached")
    outputs = {"distance": float(distance.outputs["distance"])} if distance.outputs else {}
    return Verdict(reached.ok, reached.why + (f", distance {outputs['distance']:.4f} m" if outputs else ""),
                   outputs)


def _publish(world: Any, values: dict[str, Any]) -> Verdict:
    msg = world.topics.publish(values["topic"], values["type"], values["value"])
    return Verdict(True, f"published {msg} on {values['topic']}")


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
