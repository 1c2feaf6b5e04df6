"""What each BehaviorTree.CPP node does: the manifest (``interface/tree_nodes.py``: IDs, ports,
docs) bound to requests of ``flashrt_ros.bt.requests`` and to checks; one table for registration.

A capsule verb's node is one generic service node (``ServiceRequest`` with the port values as the
request's fields; the answer's declared outputs); an action's node one generic goal node
(``GoalRequest``; RunPolicy's steps kept across halts with ``resume_after_halt``); the others are
bound by ID (``_CHECKS``, ``SetParameter``). ``btcpp.py`` runs them; the Groot2 model and the
docs table are made from the manifest (``python -m flashrt_ros.interface.generate``).

Every action node also has the output ports ``error_code``, ``error_name``
and ``error_message``, by default the blackboard entries of the same names: the
code (0 on success), its name (``NOT_FOUND``: branch on it in a script,
``error_name == 'NOT_FOUND'``) and message of the last flashrt node that
finished. Every node has a ``node`` port: which flashrt node (or simulator) it
acts on, so one tree drives several (empty: the runner's ``--node``).

Besides the verbs and actions: ``TopicCondition`` and ``TargetReached`` (conditions on
topics, ``topics.py``), ``WaitForTopic``, ``Publish`` (one message), and ``TimeoutTimer``,
which ``btcpp.py`` puts in place of BT.CPP's ``Timeout`` (see there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from flashrt_ros.bt.requests import GoalRequest, ServiceRequest, check_status, run_policy_fields, status_watch
from flashrt_ros.bt.topics import compare, field_value
from flashrt_ros.interface import tree_nodes
from flashrt_ros.interface.actions import BY_NAME as ACTIONS
from flashrt_ros.interface.services import BY_NAME as VERBS
from flashrt_ros.interface.tree_nodes import ERROR_PORTS, NODE_PORT, TIMEOUT_TIMER, NodeModel, Port

__all__ = ["BY_ID", "ERROR_PORTS", "NODE_PORT", "NODES", "TIMEOUT_TIMER", "NodeDef", "Port", "Verdict", "all_ports",
           "parameter_message", "topics_read"]


@dataclass
class Verdict:
    """What a node that needs no request decides at a tick: SUCCESS or FAILURE, why, its outputs."""

    ok: bool
    why: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeDef:
    """One BT.CPP node: its manifest entry and what it does.

    Exactly one of ``start`` (a stateful node over the request core: ``(client, inputs)
    -> request``) and ``check`` (decided at each tick, never waiting: ``(world, inputs)
    -> Verdict``; ``world`` is the tree's ``FlashRTTrees``: ``client_for(node)``,
    ``topics``) is set, except for ``TimeoutTimer``, which ``btcpp`` runs itself.
    """

    model: NodeModel
    start: Callable[[Any, dict[str, Any]], Any] | None = None       # (client, inputs) -> request
    outputs: Callable[[Any], dict[str, Any]] = field(default=lambda _answer: {})   # answer -> output values
    check: Callable[[Any, dict[str, Any]], Verdict] | None = None   # (world, inputs) -> Verdict
    waits: bool = False       # check nodes: RUNNING until the check holds (or timeout_s), not FAILURE

    id = property(lambda self: self.model.id)
    kind = property(lambda self: self.model.kind)
    doc = property(lambda self: self.model.doc)
    ports = property(lambda self: self.model.ports)
    inputs = property(lambda self: self.model.inputs)
    verb = property(lambda self: self.model.verb)     # request nodes: the verb or action they call


def all_ports(node: NodeDef) -> tuple[Port, ...]:
    """The node's ports, with the error outputs every action has."""
    return node.model.all_ports


def _service_node(model: NodeModel) -> NodeDef:
    """A capsule verb's node: its port values (under their port names) are the request's fields."""
    verb = VERBS[model.verb]
    tree = verb.tree
    assert tree is not None
    return NodeDef(model, start=lambda client, v: ServiceRequest(
                       client, verb.name, {f.name: v[f.port_name] for f in verb.fields}, timeout_s=v["timeout_s"]),
                   outputs=lambda answer: {o.name: o.read(answer) for o in tree.outputs})


def _goal_node(model: NodeModel) -> NodeDef:
    """An action's node: its goal-field ports are the goal; RunPolicy's ``resume_after_halt`` sends
    only the steps a halted goal left (``step_budget``)."""
    decl = ACTIONS[model.verb]

    def start(client: Any, v: dict[str, Any]) -> Any:
        fields: Any = {f.name: v[f.name] for f in decl.tree_fields}
        if decl.name == "run_policy":
            fields = run_policy_fields(fields, v["budget"] if v["resume_after_halt"] else None)
        return GoalRequest(client, decl.name, fields, timeout_s=v["timeout_s"], answer_timeout_s=v["answer_timeout_s"])
    return NodeDef(model, start=start, outputs=lambda result: {o.name: o.read(result) for o in decl.outputs})


def _set_parameter(model: NodeModel) -> NodeDef:
    return NodeDef(model, start=lambda client, v: ServiceRequest(
        client, "set_parameters", dict(parameters=[parameter_message(v["parameter"], v["value"])]),
        timeout_s=v["timeout_s"]))


#: The nodes decided at each tick, by ID: (check, waits).
_CHECKS: dict[str, tuple[Callable[[Any, dict[str, Any]], Verdict], bool]] = {
    "InputsFresh": (lambda world, v: _status_check(world, v, "inputs_fresh"), False),
    "IsPolicyPaused": (lambda world, v: _status_check(world, v, "policy_paused"), False),
    "TopicCondition": (lambda world, v: _topic_check(world, v["topic"], v["type"], v["field"], v["op"], v["value"],
                                                     v["max_age_s"], "last_value"), False),
    "WaitForTopic": (lambda world, v: _topic_check(world, v["topic"], v["type"], v["field"], v["op"], v["value"],
                                                   0.0, "last_value"), True),
    "TargetReached": (lambda world, v: _target_reached(world, v), False),
    "Publish": (lambda world, v: _publish(world, v), False),
}


def _bind(model: NodeModel) -> NodeDef:
    if model.verb in VERBS:
        return _service_node(model)
    if model.verb in ACTIONS:
        return _goal_node(model)
    if model.id == "SetParameter":
        return _set_parameter(model)
    if model.id in _CHECKS:
        check, waits = _CHECKS[model.id]
        return NodeDef(model, check=check, waits=waits)
    assert model.id == TIMEOUT_TIMER, f"tree node {model.id} of the manifest does nothing here"
    return NodeDef(model)


NODES: tuple[NodeDef, ...] = tuple(_bind(model) for model in tree_nodes.NODES)
BY_ID: dict[str, NodeDef] = {n.id: n for n in NODES}


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
