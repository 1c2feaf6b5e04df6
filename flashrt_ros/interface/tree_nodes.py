"""The behaviour-tree node manifest: every BehaviorTree.CPP node's ID, kind, doc and ports.

Why in the contract: a tree written in XML (ours, Groot2's, a C++ tree with the same nodes) relies
on these names and defaults exactly as a client relies on a service's fields; Groot2 loads them as
``bt/trees/flashrt_nodes.xml`` and docs/behaviour_trees.md lists them, both generated from here
(``python -m flashrt_ros.interface.generate``). What each node does is ``flashrt_ros/bt/nodes.py``'s
(one generic service node and one generic goal node; the others bound by ID).

The capsule verbs' nodes are made from their declarations (``services.py``: one node per verb with a
``tree``), the two actions' from theirs (``actions.py``); the conditions and topic nodes are
written here. Every action node also has the output ports ``ERROR_PORTS`` (by default the
blackboard entries ``error_code``, ``error_name``, ``error_message``) and every node a ``node`` port
(which flashrt node, or simulator, it acts on: one tree drives several).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashrt_ros.interface.actions import GENERATE, RUN_POLICY, ActionDecl
from flashrt_ros.interface.services import VERBS, ServiceVerb

#: Capsule services answer in milliseconds, but one waits up to the node's boundary_timeout_s
#: (5 s by default) for a boundary, and a loaded machine adds its own delays: a deadline of a
#: few seconds failed healthy trees. Retry-safe requests are re-sent meanwhile (bt/requests.py).
DEFAULT_TIMEOUT_S = 15.0
#: What TopicCondition and WaitForTopic compare with (``op``).
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
#: The node's ID that stands in for BT.CPP's Timeout (bt/btcpp.py says why).
TIMEOUT_TIMER = "TimeoutTimer"


@dataclass(frozen=True)
class Port:
    """One port. ``default`` None: required. Outputs' defaults are blackboard references."""

    name: str
    kind: type
    default: Any
    doc: str
    output: bool = False
    choices: tuple[str, ...] = ()     # a literal must be one of these


@dataclass(frozen=True)
class NodeModel:
    """One node of the manifest (an entry of Groot2's ``TreeNodesModel``)."""

    id: str
    kind: str                                   # Action | Condition (as Groot2's model calls it)
    doc: str
    ports: tuple[Port, ...]
    verb: str = ""            # request nodes: the service verb or action they call (readiness checks)

    @property
    def inputs(self) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if not p.output)

    @property
    def all_ports(self) -> tuple[Port, ...]:
        """The ports with the error outputs every action has."""
        return self.ports + (ERROR_PORTS if self.kind == "Action" and self.id != TIMEOUT_TIMER else ())


ERROR_PORTS = (
    Port("error_code", int, "{error_code}", "0 on success, else the node's ErrorCode (docs/services.md)", True),
    Port("error_name", str, "{error_name}", "the ErrorCode's name: OK, NOT_FOUND, BUSY, TIMEOUT, ... "
         "(branch in a script: error_name == 'NOT_FOUND')", True),
    Port("error_message", str, "{error_message}", "the node's message (the reason on failure)", True),
)
NODE_PORT = Port("node", str, "", "the flashrt node to act on, e.g. /robot1/flashrt (empty: bt run's --node)")
SERVICE_TIMEOUT = Port("timeout_s", float, DEFAULT_TIMEOUT_S,
                       "FAILURE with TIMEOUT if the service is absent or does not answer within this")
GOAL_TIMEOUTS = (
    Port("timeout_s", float, 0.0, "cancel the goal and FAIL with TIMEOUT after this (0: no limit)"),
    Port("answer_timeout_s", float, DEFAULT_TIMEOUT_S, "bound on finding the action server and the goal's acceptance"),
)
#: The RunPolicy node's port beside its goal fields (bt/step_budget.py).
RESUME_AFTER_HALT = Port("resume_after_halt", bool, False, "after a halt, the next start runs only the steps the "
                         "halted goal left (an interrupted mission still takes exactly max_steps)")


def verb_node(verb: ServiceVerb) -> NodeModel:
    """A capsule verb's node: its request fields as input ports (under their port names), then
    ``node`` and ``timeout_s``, then its outputs."""
    tree = verb.tree
    assert tree is not None, f"{verb.name} declares no behaviour-tree node"
    ports = (tuple(Port(f.port_name, f.kind, f.default, f.doc) for f in verb.fields) + (NODE_PORT, SERVICE_TIMEOUT)
             + tuple(Port(o.name, o.kind, "", o.doc, True) for o in tree.outputs))
    return NodeModel(tree.id, "Action", tree.doc, ports, verb=verb.name)


def action_node(decl: ActionDecl, extra: tuple[Port, ...] = ()) -> NodeModel:
    """An action's node: its goal fields as input ports, ``extra``, ``node`` and the goal's timeouts,
    then its result outputs."""
    ports = (tuple(Port(f.name, f.kind, f.default, f.doc) for f in decl.tree_fields) + extra + (NODE_PORT,)
             + GOAL_TIMEOUTS + tuple(Port(o.name, o.kind, "", o.doc, True) for o in decl.outputs))
    return NodeModel(decl.tree_id, "Action", decl.tree_doc, ports, verb=decl.name)


def _topic_ports(type_example: str) -> tuple[Port, ...]:
    """What TopicCondition and WaitForTopic compare: the latest message on ``topic``."""
    return (Port("topic", str, None, "the topic to watch"),
            Port("type", str, "", f"its type, e.g. {type_example} (empty: as advertised on the ROS graph)"),
            Port("field", str, "data", "the field to compare: name, name.sub or name[index]"),
            Port("op", str, "==", " ".join(COMPARISONS), choices=COMPARISONS),
            Port("value", str, None, "what to compare with (a bool, number or text, as the field is)"))


_LAST_VALUE = Port("last_value", str, "", "the field's latest value (as text)", True)

NODES: tuple[NodeModel, ...] = tuple(verb_node(verb) for verb in VERBS if verb.tree is not None) + (
    action_node(RUN_POLICY, (RESUME_AFTER_HALT,)),
    action_node(GENERATE),
    NodeModel("SetParameter", "Action", "Set parameter `parameter` of `node` to `value`, as `ros2 param set` "
              "does (e.g. move the simulated arm's target: node=/sim parameter=target value=[0.12, 0.15]).", (
                  Port("parameter", str, None, "the parameter's name"),
                  Port("value", str, None, "its value, written as for ros2 param set: 3, 0.5, true, text, [a, b]"),
                  NODE_PORT, SERVICE_TIMEOUT), verb="set_parameters"),
    NodeModel("InputsFresh", "Condition", "SUCCESS while the policy's inputs are fresh (the node's latest ~/status).",
              (NODE_PORT,)),
    NodeModel("IsPolicyPaused", "Condition", "SUCCESS while the policy loop is paused (the node's latest ~/status).",
              (NODE_PORT,)),
    NodeModel("TopicCondition", "Condition", "SUCCESS while the latest message on `topic` has `field` `op` `value` "
              "(e.g. an operator's switch: topic=/operator/override value=true).",
              _topic_ports("std_msgs/msg/Bool")
              + (Port("max_age_s", float, 0.0, "FAILURE if the latest message is older than this (0: any age)"),
                 _LAST_VALUE)),
    NodeModel("WaitForTopic", "Action", "RUNNING until the latest message on `topic` has `field` `op` `value`; "
              "FAILURE with TIMEOUT after `timeout_s` (e.g. wait until the simulator has applied the last "
              "command: topic=/sim/steps op='>=' value={steps}).",
              _topic_ports("std_msgs/msg/UInt64")
              + (Port("timeout_s", float, DEFAULT_TIMEOUT_S, "FAILURE with TIMEOUT if it does not hold by then "
                      "(0: wait for ever)"), _LAST_VALUE)),
    NodeModel("TargetReached", "Condition", "SUCCESS while the simulated arm `node` reports its tip on the target "
              "and at rest (its ~/reached; the criterion of docs/benchmarks/arm_interrupts.md).", (
                  Port("node", str, "/sim", "the simulator node (flashrt_sim)"),
                  Port("max_age_s", float, 0.0, "FAILURE if the latest report is older than this (0: any age)"),
                  Port("distance", float, "", "the tip's latest distance to the target in metres "
                       "(its ~/distance)", True))),
    NodeModel("Publish", "Action", "Publish one message on `topic` (a std_msgs scalar, or an array as a;b;c), "
              "e.g. a new target for the simulated arm.", (
                  Port("topic", str, None, "the topic"),
                  Port("type", str, None, "its type, e.g. std_msgs/msg/Float32MultiArray"),
                  Port("value", str, None, "the data: true, 3, 0.5, text, or 0.12;0.15 for an array"))),
    NodeModel(TIMEOUT_TIMER, "Action", "Stands in for BehaviorTree.CPP's Timeout (put there by flashrt; see "
              "docs/behaviour_trees.md): RUNNING until `msec` have passed since it started, then FAILURE.", (
                  Port("msec", float, None, "the Timeout's msec (0: no limit)"),
                  Port("child", str, "", "the name of the node the Timeout guards (for the log)"))),
)

BY_ID: dict[str, NodeModel] = {n.id: n for n in NODES}
