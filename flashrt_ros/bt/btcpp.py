"""BehaviorTree.CPP v4 nodes for a flashrt node, run from Python through ``behaviortreepy``.

What ``behaviortreepy`` 0.1.4 (the PyPI binding) offers and lacks, and why this
module looks as it does:

* Python nodes register only as callbacks (``register_simple_action``,
  ``register_simple_condition``, ``register_simple_stateful_action`` with
  on_start / on_running / on_halted); there is no subclass registration and no
  way to declare ports, so BT.CPP refuses any attribute on such a node ("a port
  ... is found in the XML, but not in the providedPorts()").
* Blackboards (typed get/set), SubTree remapping, ``Script``, halting, the
  loggers and ``Groot2Publisher`` work.

So ports are carried by this module: ``FlashRTTrees.load`` reads the tree XML
as written for BT.CPP (``<Snapshot capsule="pre" tier="host"/>``, the same XML
a C++ tree with real ports uses), checks each flashrt node's attributes
against its definition (``nodes.py``), keeps them in a table keyed by the
node's instance name and hands BT.CPP the tree without them. At tick time a
port is its literal value or, for ``{key}``, the node's blackboard entry
(``{=}``: the entry named like the port), as in BT.CPP. Built-in nodes keep
their own attributes.

Every flashrt action is a stateful node on the request core
(``requests.py``): on_start sends nothing that could block, on_running polls,
on_halted cancels (a goal stops at the node's next committed boundary). On
finishing, ``error_code`` / ``error_message`` and the node's result ports are
written; a failure is also logged.
"""
from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from flashrt_ros.bt.nodes import BY_ID, NODES, NodeDef, Port, all_ports, condition_holds
from flashrt_ros.bt.requests import Progress, StepBudget
from flashrt_ros.runtime.errors import ErrorCode

log = logging.getLogger("flashrt_ros.bt")

#: BT.CPP attributes every node accepts (instance name, pre/post conditions).
_BUILTIN_ATTRIBUTES = {"name", "_skipIf", "_failureIf", "_successIf", "_while", "_onSuccess", "_onFailure",
                       "_onHalted", "_post", "_autoremap"}


class TreeXMLError(ValueError):
    """A flashrt node in a tree XML has an unknown port, lacks a required one, or has a bad value."""


def _bt():
    try:
        import behaviortreepy
    except ImportError as exc:   # pragma: no cover - the message is the point
        raise ImportError("BehaviorTree.CPP trees need the 'behaviortreepy' package "
                          "(pip install -r requirements.txt, or scripts/setup.sh)") from exc
    return behaviortreepy


def _blackboard_key(raw: str, port: Port) -> str | None:
    """The blackboard key a port value refers to (``{key}``, ``{=}``), or None for a literal."""
    raw = raw.strip()
    if raw.startswith("{") and raw.endswith("}"):
        key = raw[1:-1].strip()
        return port.name if key == "=" else key
    return None


def _parse_literal(raw: str, port: Port) -> Any:
    if port.kind is bool:
        low = raw.strip().lower()
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"port {port.name}: {raw!r} is not a bool (true/false)")
        return low in ("true", "1")
    if port.kind is int:
        return int(raw.strip())
    if port.kind is float:
        return float(raw.strip())
    return raw


_GETTERS = {str: "get_string", int: "get_int", float: "get_double", bool: "get_bool"}
_SETTERS = {str: "set_string", int: "set_int", float: "set_double", bool: "set_bool"}


class FlashRTTrees:
    """A BT.CPP factory with every flashrt node registered for one node's client.

    ``load(xml)`` / ``load_file(path)`` give a ``behaviortreepy.Tree``; tick it
    with ``tick_once()`` while an executor spins the client's node.
    """

    def __init__(self, client: Any, factory: Any = None,
                 on_event: Callable[[str, str, str], None] | None = None) -> None:
        bt = _bt()
        self.client = client
        self.on_event = on_event            # (instance name, event, detail): started | SUCCESS | FAILURE | halted
        self.factory = factory if factory is not None else bt.BehaviorTreeFactory()
        self._status = bt.NodeStatus
        self.ports: dict[str, dict[str, str]] = {}          # instance name -> port -> raw attribute
        self._active: dict[int, Any] = {}                   # node uid -> request in flight
        self._budgets: dict[str, StepBudget] = {}           # instance name -> RunPolicy steps left
        self.last_error: dict[str, tuple[int, str]] = {}    # instance name -> (error_code, message)
        for node in NODES:
            self._register(node)

    # --- loading --------------------------------------------------------------------------
    def load(self, xml_text: str, blackboard: Any = None) -> Any:
        """Create the main tree of ``xml_text`` (BT.CPP v4 XML; see the module docstring)."""
        return self.factory.create_tree_from_text(self.prepare(xml_text), blackboard)

    def load_file(self, path: str | Path, blackboard: Any = None) -> Any:
        return self.load(Path(path).read_text(), blackboard)

    def prepare(self, xml_text: str) -> str:
        """Move the flashrt nodes' port attributes into ``self.ports``; returns the XML BT.CPP gets."""
        try:
            root = ET.fromstring(xml_text)
        except ET.ParseError as exc:
            raise TreeXMLError(f"tree XML does not parse: {exc}") from exc
        ports: dict[str, dict[str, str]] = {}
        for element in root.iter():
            if element.tag == "TreeNodesModel":
                element.clear()          # a model embedded in a tree file: ours is registered already
                element.tag = "TreeNodesModel"
                continue
            node = BY_ID.get(element.tag)
            if node is None:
                continue
            name = self._instance_name(element.get("name") or node.id, ports)
            ports[name] = self._check_ports(node, name, element.attrib)
            keep = {k: v for k, v in element.attrib.items() if k in _BUILTIN_ATTRIBUTES}
            element.attrib.clear()
            element.attrib.update(keep)
            element.set("name", name)
        self.ports.update(ports)
        return ET.tostring(root, encoding="unicode")

    def _instance_name(self, wanted: str, taken: dict[str, Any]) -> str:
        name, i = wanted, 2
        while name in self.ports or name in taken:
            name, i = f"{wanted}#{i}", i + 1
        return name

    @staticmethod
    def _check_ports(node: NodeDef, name: str, attributes: dict[str, str]) -> dict[str, str]:
        ports = {p.name: p for p in all_ports(node)}
        given = {k: v for k, v in attributes.items() if k not in _BUILTIN_ATTRIBUTES}
        unknown = sorted(set(given) - set(ports))
        if unknown:
            raise TreeXMLError(f"<{node.id} name='{name}'>: unknown port(s) {unknown}; "
                               f"its ports are {sorted(ports)}")
        for port in ports.values():
            raw = given.get(port.name)
            if raw is None:
                if port.default is None:
                    raise TreeXMLError(f"<{node.id} name='{name}'>: missing required port '{port.name}'")
                continue
            if port.output and _blackboard_key(raw, port) is None:
                raise TreeXMLError(f"<{node.id} name='{name}'>: output port '{port.name}' needs a "
                                   f"blackboard entry such as {{{port.name}}}, not {raw!r}")
            if not port.output and _blackboard_key(raw, port) is None:
                try:
                    _parse_literal(raw, port)
                except ValueError as exc:
                    raise TreeXMLError(f"<{node.id} name='{name}'>: port '{port.name}': {exc}") from exc
        return given

    # --- ports at tick time -------------------------------------------------------------------
    def _inputs(self, node: NodeDef, tree_node: Any) -> dict[str, Any]:
        raw = self.ports.get(tree_node.name(), {})
        values: dict[str, Any] = {}
        for port in node.inputs:
            text = raw.get(port.name)
            if text is None:
                values[port.name] = port.default
                continue
            key = _blackboard_key(text, port)
            if key is None:
                values[port.name] = _parse_literal(text, port)
                continue
            blackboard = tree_node.config().blackboard
            try:
                values[port.name] = getattr(blackboard, _GETTERS[port.kind])(key)
            except Exception as exc:  # noqa: BLE001 - BT.CPP's message says what is missing
                raise ValueError(f"port {port.name}: blackboard entry {{{key}}}: {exc}") from exc
        return values

    def _write_outputs(self, node: NodeDef, tree_node: Any, values: dict[str, Any]) -> None:
        raw = self.ports.get(tree_node.name(), {})
        blackboard = tree_node.config().blackboard
        for port in all_ports(node):
            if not port.output or port.name not in values:
                continue
            key = _blackboard_key(raw.get(port.name, port.default or ""), port)
            if key:
                getattr(blackboard, _SETTERS[port.kind])(key, values[port.name])

    # --- node callbacks -----------------------------------------------------------------------
    def _register(self, node: NodeDef) -> None:
        if node.kind == "Condition":
            self.factory.register_simple_condition(node.id, lambda n, d=node: self._condition(d, n))
            return
        self.factory.register_simple_stateful_action(
            node.id, lambda n, d=node: self._on_start(d, n), lambda n, d=node: self._on_running(d, n),
            lambda n: self._on_halted(n))

    def _condition(self, node: NodeDef, tree_node: Any) -> Any:
        holds, _why = condition_holds(node, self.client)
        return self._status.SUCCESS if holds else self._status.FAILURE

    def _on_start(self, node: NodeDef, tree_node: Any) -> Any:
        try:
            values = self._inputs(node, tree_node)
            values["budget"] = self._budgets.setdefault(tree_node.name(), StepBudget())
            request = node.start(self.client, values)
        except (ValueError, TypeError) as exc:
            return self._finish(node, tree_node, ErrorCode.INVALID_ARGUMENT, f"{node.id}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a node fails with a code, it never throws into BT.CPP
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: {type(exc).__name__}: {exc}")
        self._active[tree_node.uid()] = request
        self._event(tree_node.name(), "started", node.id)
        return self._on_running(node, tree_node)

    def _on_running(self, node: NodeDef, tree_node: Any) -> Any:
        request = self._active.get(tree_node.uid())
        if request is None:                      # not started by us (should not happen): fail loudly
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: no request in flight")
        try:
            progress = request.poll()
        except Exception as exc:  # noqa: BLE001 - e.g. rclpy refusing a request; never into BT.CPP
            del self._active[tree_node.uid()]
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: {type(exc).__name__}: {exc}")
        if progress is Progress.RUNNING:
            return self._status.RUNNING
        del self._active[tree_node.uid()]
        answer = getattr(request, "response", None) or getattr(request, "result", None)
        if progress is Progress.SUCCESS:
            self._budgets.pop(tree_node.name(), None)
            if answer is not None:               # None: a resumed RunPolicy had no step left
                self._write_outputs(node, tree_node, node.outputs(answer))
        return self._finish(node, tree_node, request.error_code, request.message)

    def _on_halted(self, tree_node: Any) -> None:
        request = self._active.pop(tree_node.uid(), None)
        if request is not None:
            request.halt()
            self._event(tree_node.name(), "halted", "goal cancelled at the next boundary"
                        if getattr(request, "cancel_sent", False) else "request abandoned")
            budget = self._budgets.get(tree_node.name())
            if budget is not None and hasattr(request, "reported_steps"):
                budget.halted(request)

    def _finish(self, node: NodeDef, tree_node: Any, code: int, message: str) -> Any:
        self._write_outputs(node, tree_node, {"error_code": int(code), "error_message": message})
        self.last_error[tree_node.name()] = (int(code), message)
        self._event(tree_node.name(), "FAILURE" if code else "SUCCESS", message)
        if code:
            log.warning("%s (%s) failed: %s", tree_node.name(), node.id, message)
            return self._status.FAILURE
        return self._status.SUCCESS

    def _event(self, name: str, event: str, detail: str) -> None:
        if self.on_event is not None:
            self.on_event(name, event, detail)


def register_model(factory: Any, model_path: str | Path) -> None:
    """Load a ``<TreeNodesModel>`` file into a factory (what Groot2 and a C++ factory read)."""
    factory.register_behavior_tree_from_text(Path(model_path).read_text())
