"""A tree XML as written for BehaviorTree.CPP, checked and rewritten before BT.CPP reads it.

Why apart from the nodes' callbacks (``btcpp.py``): ``behaviortreepy`` cannot declare ports
for Python nodes, so the flashrt nodes' ports are read from the XML here, before a tree
is made: every node ID is checked (an unknown one refused with a suggestion), each flashrt
node's attributes against its definition (``nodes.py``: unknown or missing ports, output
ports that are not blackboard entries, literals of the wrong type), and every
``<Timeout>`` is replaced by its stand-in (``replace_timeouts``; ``btcpp.py`` says why).
``blackboard_key`` and ``parse_literal`` read a port's value, here and at tick time.
"""
from __future__ import annotations

import difflib
import xml.etree.ElementTree as ET
from typing import Any, Iterable

from flashrt_ros.bt.nodes import BY_ID, TIMEOUT_TIMER, NodeDef, Port, all_ports

#: BT.CPP attributes every node accepts (instance name, pre/post conditions).
BUILTIN_ATTRIBUTES = {"name", "_skipIf", "_failureIf", "_successIf", "_while", "_onSuccess", "_onFailure",
                       "_onHalted", "_post", "_autoremap"}
#: The node IDs BehaviorTree.CPP 4 registers itself (behaviortreepy 0.1.4's build);
#: ``test_bt_btcpp`` creates a tree of each to keep this list true.
BUILTIN_NODES = frozenset({
    "Fallback", "AsyncFallback", "Sequence", "AsyncSequence", "SequenceWithMemory", "Parallel",
    "ParallelAll", "ReactiveSequence", "ReactiveFallback", "IfThenElse", "WhileDoElse", "Inverter",
    "RetryUntilSuccessful", "KeepRunningUntilFailure", "Repeat", "Timeout", "Delay", "RunOnce", "ForceSuccess",
    "ForceFailure", "AlwaysSuccess", "AlwaysFailure", "Script", "ScriptCondition", "SetBlackboard", "Sleep",
    "UnsetBlackboard", "SubTree", "Precondition", "Switch2", "Switch3", "Switch4", "Switch5", "Switch6",
    "LoopInt", "LoopBool", "LoopDouble", "LoopString", "WasEntryUpdated", "SkipUnlessUpdated",
    "WaitValueUpdate"})
#: The generic spellings (``<Action ID="Snapshot"/>``): the node is the ``ID`` attribute.
GENERIC_TAGS = {"Action", "Condition", "Decorator", "Control", "SubTree"}
#: Built-in ports of unsigned type: a ``-b`` integer read by one is set as text (see ``unsigned_keys``).
UNSIGNED_PORTS = {"Delay": ("delay_msec",), "Sleep": ("msec",)}


class TreeXMLError(ValueError):
    """A tree XML that cannot run: an unknown node or port, a missing port, a bad value."""


def blackboard_key(raw: str, port: Port) -> str | None:
    """The blackboard key a port value refers to (``{key}``, ``{=}``), or None for a literal."""
    raw = raw.strip()
    if raw.startswith("{") and raw.endswith("}"):
        key = raw[1:-1].strip()
        return port.name if key == "=" else key
    return None


def parse_literal(raw: str, port: Port) -> Any:
    if port.kind is bool:
        low = raw.strip().lower()
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"port {port.name}: {raw!r} is not a bool (true/false)")
        return low in ("true", "1")
    if port.kind is int:
        return int(raw.strip())
    if port.kind is float:
        return float(raw.strip())
    if port.choices and raw not in port.choices:
        raise ValueError(f"port {port.name}: {raw!r} is not one of {' '.join(port.choices)}")
    return raw


def did_you_mean(word: str, known: Any) -> str:
    close = difflib.get_close_matches(word, sorted(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def check_node_ids(root: ET.Element, registered_trees: Iterable[str]) -> None:
    """Refuse an unknown node ID (with a suggestion); ``<Action ID="Snapshot"/>`` becomes ``<Snapshot/>``."""
    trees = {e.get("ID") for e in root.iter("BehaviorTree") if e.get("ID")}
    known = BUILTIN_NODES | set(BY_ID) | trees | set(registered_trees)
    for tree in root.iter("BehaviorTree"):
        for element in tree.iter():
            if element is tree:
                continue
            node_id = element.get("ID") if element.tag in GENERIC_TAGS and element.get("ID") else element.tag
            if node_id not in known:
                raise TreeXMLError(f"<{element.tag}{' ID=' + repr(node_id) if node_id != element.tag else ''}> "
                                   f"in BehaviorTree {tree.get('ID')!r}: no node of that name"
                                   f"{did_you_mean(node_id, known)} (flashrt nodes: docs/behaviour_trees.md)")
            if element.tag in GENERIC_TAGS and element.tag != "SubTree" and node_id in BY_ID:
                element.tag = node_id            # <Action ID="Snapshot" .../> is <Snapshot .../>
                del element.attrib["ID"]


def replace_timeouts(root: ET.Element) -> None:
    """Every ``<Timeout msec=X>C</Timeout>`` becomes ``<Parallel ..><TimeoutTimer msec=X/>C</Parallel>``."""
    for parent in list(root.iter()):
        for index, timeout in enumerate(list(parent)):
            if timeout.tag != "Timeout":
                continue
            children = list(timeout)
            if len(children) != 1:
                raise TreeXMLError(f"<Timeout name={timeout.get('name')!r}> needs exactly one child "
                                   f"(it has {len(children)})")
            if "msec" not in timeout.attrib:
                raise TreeXMLError(f"<Timeout name={timeout.get('name')!r}>: missing required port 'msec'")
            name = timeout.get("name") or "Timeout"
            child = children[0]
            parallel = ET.Element("Parallel", {k: v for k, v in timeout.attrib.items() if k != "msec"})
            parallel.set("name", name)
            parallel.set("success_count", "1")
            parallel.set("failure_count", "1")
            parallel.append(ET.Element(TIMEOUT_TIMER, {"name": f"{name} timer", "msec": timeout.get("msec"),
                                                       "child": child.get("name") or child.tag}))
            parallel.append(child)
            parallel.tail = timeout.tail
            parent.remove(timeout)
            parent.insert(index, parallel)


def check_ports(node: NodeDef, name: str, attributes: dict[str, str]) -> dict[str, str]:
    """Instance ``name``'s port attributes, checked against its node's definition."""
    ports = {p.name: p for p in all_ports(node)}
    given = {k: v for k, v in attributes.items() if k not in BUILTIN_ATTRIBUTES}
    unknown = sorted(set(given) - set(ports))
    if unknown:
        hints = "".join(did_you_mean(u, ports) for u in unknown)
        raise TreeXMLError(f"<{node.id} name='{name}'>: unknown port(s) {unknown}{hints} "
                           f"(its ports are {sorted(ports)})")
    for port in ports.values():
        raw = given.get(port.name)
        if raw is None:
            if port.default is None:
                raise TreeXMLError(f"<{node.id} name='{name}'>: missing required port '{port.name}'")
            continue
        if port.output and blackboard_key(raw, port) is None:
            raise TreeXMLError(f"<{node.id} name='{name}'>: output port '{port.name}' needs a "
                               f"blackboard entry such as {{{port.name}}}, not {raw!r}")
        if not port.output and blackboard_key(raw, port) is None:
            try:
                parse_literal(raw, port)
            except ValueError as exc:
                raise TreeXMLError(f"<{node.id} name='{name}'>: port '{port.name}': {exc}") from exc
    return given


def unsigned_keys(element: ET.Element) -> set[str]:
    """The blackboard keys a built-in node's unsigned ports read (see ``FlashRTTrees.unsigned_keys``)."""
    keys = (blackboard_key(element.get(port, ""), Port(port, int, None, ""))
            for port in UNSIGNED_PORTS.get(element.tag, ()))
    return {key for key in keys if key}
