"""BehaviorTree.CPP v4 nodes for flashrt nodes, run from Python through ``behaviortreepy``.

What ``behaviortreepy`` 0.1.4 (the PyPI binding) offers and lacks, and why this
module looks as it does:

* Python nodes register only as callbacks (``register_simple_action``,
  ``register_simple_condition``, ``register_simple_stateful_action`` with
  on_start / on_running / on_halted); there is no subclass registration and no
  way to declare ports, so BT.CPP refuses any attribute on such a node ("a port
  ... is found in the XML, but not in the providedPorts()").
* Blackboards (typed get/set), SubTree remapping, ``Script``, halting, the
  loggers and ``Groot2Publisher`` work.
* ``tick_once()`` holds Python's interpreter lock for the whole tick.

So ports are carried by this module: ``FlashRTTrees.prepare`` reads the tree XML
(with ``tree_xml.py``, which checks and rewrites it)
as written for BT.CPP (``<Snapshot capsule="pre" tier="host"/>``, the same XML
a C++ tree with real ports uses), checks every node ID (unknown ones are refused
with a suggestion) and each flashrt node's attributes against its definition
(``nodes.py``), keeps them in a table keyed by the node's instance name and
hands BT.CPP the tree without them. At tick time a port is its literal value or,
for ``{key}``, the node's blackboard entry (``{=}``: the entry named like the
port), as in BT.CPP. Built-in nodes keep their own attributes.

**Halts on the tick thread.** BT.CPP's ``Timeout`` halts its child from a timer
thread. With the interpreter lock held by ``tick_once()``, that thread waited
for the lock inside the child's Python ``on_halted`` while the tick thread
waited for the Timeout's mutex: ``flashrt bt run`` hung for good (2 of 7 runs of
a user's tree) and the halted goal kept driving the arm. ``prepare`` therefore
replaces every ``<Timeout msec="X">C</Timeout>`` with
``<Parallel success_count="1" failure_count="1"><TimeoutTimer msec="X"/>C</Parallel>``:
the same outcome (C's result; or FAILURE, C halted, once X ms have passed since
it started), decided on the tick thread at the first tick after X ms. Every
other built-in (Delay and Sleep use timers too) only sets flags from its timer
thread, and calls no node from it. One difference: a child skipped by a
``_skipIf`` precondition keeps the stand-in RUNNING (until X) instead of being
reported SKIPPED.

Every flashrt action is a stateful node on the request core (``requests.py``):
on_start sends nothing that could block, on_running polls, on_halted cancels (a
goal stops at the node's next committed boundary). On finishing, ``error_code``
/ ``error_name`` / ``error_message`` and the node's result ports are written; a
failure is also logged. Every node's ``node`` port picks the flashrt node (or
simulator) it acts on; the clients of one tree share one halt scope, so a
request waits for a goal halted on any of its nodes.
"""
from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from flashrt_ros.bt.nodes import (BY_ID, NODE_PORT, NODES, TIMEOUT_TIMER, NodeDef, Port, Verdict, all_ports,
                                  topics_read)
from flashrt_ros.bt.requests import HaltScope, Progress, StepBudget
from flashrt_ros.bt.topics import TopicCache, TopicError
from flashrt_ros.bt.tree_xml import (BUILTIN_ATTRIBUTES, BUILTIN_NODES, TreeXMLError, blackboard_key, check_node_ids,
                                     check_ports, parse_literal, replace_timeouts, unsigned_keys)
from flashrt_ros.interface.errors import ErrorCode

log = logging.getLogger("flashrt_ros.bt")
#: ``BUILTIN_NODES`` and ``TreeXMLError`` (tree_xml.py's) stay importable from here.
__all__ = ["BUILTIN_NODES", "FlashRTTrees", "TreeXMLError", "register_model"]


def _bt():
    try:
        import behaviortreepy
    except ImportError as exc:   # pragma: no cover - the message is the point
        raise ImportError("BehaviorTree.CPP trees need the 'behaviortreepy' package "
                          "(pip install -r requirements.txt, or scripts/setup.sh)") from exc
    return behaviortreepy


_GETTERS = {str: "get_string", int: "get_int", float: "get_double", bool: "get_bool"}
_SETTERS = {str: "set_string", int: "set_int", float: "set_double", bool: "set_bool"}


class FlashRTTrees:
    """A BT.CPP factory with every flashrt node registered, acting through ``client`` (and, for
    ``node`` ports naming other nodes, clients made alike on the same ROS node).

    ``load(xml)`` / ``load_file(path)`` give a ``behaviortreepy.Tree``; tick it
    with ``tick_once()`` while an executor spins the client's node.
    """

    def __init__(self, client: Any, factory: Any = None,
                 on_event: Callable[[str, str, str], None] | None = None,
                 make_client: Callable[[str], Any] | None = None) -> None:
        bt = _bt()
        self.client = client
        self._make_client = make_client or self._client_like_ours
        self.scope = getattr(client, "halt_scope", None) or HaltScope()     # trees of one client share it
        client.halt_scope = self.scope
        self.clients: dict[str, Any] = {client.namespace: client}
        self.topics = TopicCache(client.node)
        self.on_event = on_event            # (instance name, event, detail): started | SUCCESS | FAILURE | halted
        self.factory = factory if factory is not None else bt.BehaviorTreeFactory()
        self._status = bt.NodeStatus
        self.ports: dict[str, dict[str, str]] = {}          # instance name -> port -> raw attribute
        self.nodes_used: dict[str, set[str]] = {}           # node namespace -> verbs the trees call there
        self.topics_used: dict[str, str] = {}               # topic -> its type ("": as advertised), read by nodes
        self.unsigned_keys: set[str] = set()                # blackboard keys read by unsigned built-in ports
        self._active: dict[int, Any] = {}                   # node uid -> request in flight
        self._timers: dict[int, float] = {}                 # TimeoutTimer uid -> its deadline (monotonic)
        self._waiting: dict[int, str] = {}                  # RunPolicy uid -> what its goal last waited for
        self._budgets: dict[str, StepBudget] = {}           # instance name -> RunPolicy steps left
        self._reported: set[tuple[str, str]] = set()        # (instance, error) logged once
        self.last_error: dict[str, tuple[int, str]] = {}    # instance name -> (error_code, message)
        for node in NODES:
            self._register(node)

    def client_for(self, node: str) -> Any:
        """The client of flashrt node ``node`` (empty: the tree's own), made on first use."""
        name = node.rstrip("/")
        if not name:
            return self.client
        client = self.clients.get(name)
        if client is None:
            client = self._make_client(name)
            client.halt_scope = self.scope
            self.clients[name] = client
        return client

    def _client_like_ours(self, namespace: str) -> Any:
        """A FlashRTClient for another node, on the same ROS node, with the same lease and owner."""
        from flashrt_ros.client import FlashRTClient
        return FlashRTClient(self.client.node, namespace, lease_s=self.client.leases.lease_s, owner=self.client.owner)

    def subscribe_topics(self) -> list[str]:
        """Subscribe to the topics the loaded trees read (before the first tick); returns those not
        advertised yet (their subscription waits: it adapts to the publishers' QoS)."""
        return [topic for topic, type_name in self.topics_used.items() if not self.topics.subscribe(
            topic, type_name, wait_for_publisher=True)]

    def close(self) -> None:
        """Drop the topic subscriptions and the extra clients' lease timers (before the node goes)."""
        self.topics.close()
        for client in self.clients.values():
            if client is not self.client and hasattr(client, "close"):
                client.close()

    # --- loading --------------------------------------------------------------------------
    def load(self, xml_text: str, blackboard: Any = None) -> Any:
        """Create the main tree of ``xml_text`` (BT.CPP v4 XML; see the module docstring)."""
        return self.factory.create_tree_from_text(self.prepare(xml_text), blackboard)

    def load_file(self, path: str | Path, blackboard: Any = None) -> Any:
        return self.load(Path(path).read_text(), blackboard)

    def prepare(self, xml_text: str) -> str:
        """Check the XML, put the Timeout stand-ins in, move the flashrt nodes' port attributes
        into ``self.ports``; returns the XML BT.CPP gets."""
        try:
            root = ET.fromstring(xml_text)
        except ET.ParseError as exc:
            raise TreeXMLError(f"tree XML does not parse: {exc}") from exc
        if root.find(".//include") is not None:
            raise TreeXMLError("<include> is not supported: the flashrt nodes' ports are read from the XML "
                               "given, so put every tree in that one file")
        for element in root.iter("TreeNodesModel"):
            element.clear()              # a model embedded in a tree file: ours is registered already
        check_node_ids(root, self.factory.registered_behavior_trees())
        replace_timeouts(root)
        ports: dict[str, dict[str, str]] = {}
        for element in root.iter():
            node = BY_ID.get(element.tag)
            if node is None:
                self.unsigned_keys |= unsigned_keys(element)
                continue
            name = self._instance_name(element.get("name") or node.id, ports)
            ports[name] = check_ports(node, name, element.attrib)
            self.topics_used.update(topics_read(node.id, ports[name]))
            if node.verb:
                used = ports[name].get("node", "")
                if blackboard_key(used, NODE_PORT) is None:       # a literal node: checked before the first tick
                    self.nodes_used.setdefault(used.rstrip("/") or self.client.namespace, set()).add(node.verb)
            keep = {k: v for k, v in element.attrib.items() if k in BUILTIN_ATTRIBUTES}
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

    # --- ports at tick time -------------------------------------------------------------------
    def _inputs(self, node: NodeDef, tree_node: Any) -> dict[str, Any]:
        raw = self.ports.get(tree_node.name(), {})
        values: dict[str, Any] = {}
        for port in node.inputs:
            text = raw.get(port.name)
            if text is None:
                values[port.name] = port.default
                continue
            key = blackboard_key(text, port)
            values[port.name] = parse_literal(text, port) if key is None else \
                self._read_entry(tree_node.config().blackboard, key, port)
        return values

    @staticmethod
    def _read_entry(blackboard: Any, key: str, port: Port) -> Any:
        """A blackboard entry as the port's type (an entry written as text is parsed, as BT.CPP does)."""
        try:
            return getattr(blackboard, _GETTERS[port.kind])(key)
        except Exception as typed_error:  # noqa: BLE001 - e.g. a bool port reading the text "true"
            try:
                return parse_literal(blackboard.get_string(key), port)
            except Exception:  # noqa: BLE001 - BT.CPP's first message says what is missing
                raise ValueError(f"port {port.name}: blackboard entry {{{key}}}: {typed_error}") from None

    def _write_outputs(self, node: NodeDef, tree_node: Any, values: dict[str, Any]) -> None:
        raw = self.ports.get(tree_node.name(), {})
        blackboard = tree_node.config().blackboard
        for port in all_ports(node):
            if not port.output or port.name not in values:
                continue
            key = blackboard_key(raw.get(port.name, port.default or ""), port)
            if key:
                getattr(blackboard, _SETTERS[port.kind])(key, values[port.name])

    # --- node callbacks -----------------------------------------------------------------------
    def _register(self, node: NodeDef) -> None:
        if node.kind == "Condition":
            self.factory.register_simple_condition(node.id, lambda n, d=node: self._check_tick(d, n))
        elif node.check is not None and not node.waits:
            self.factory.register_simple_action(node.id, lambda n, d=node: self._check_tick(d, n))
        else:
            self.factory.register_simple_stateful_action(
                node.id, lambda n, d=node: self._on_start(d, n), lambda n, d=node: self._on_running(d, n),
                lambda n: self._on_halted(n))

    def _verdict(self, node: NodeDef, tree_node: Any) -> tuple[Verdict, bool]:
        """(the check's verdict, whether it could be made at all: False for a bad port or topic)."""
        try:
            verdict, valid = node.check(self, self._inputs(node, tree_node)), True
        except (TopicError, ValueError, TypeError) as exc:
            verdict, valid = Verdict(False, f"{node.id}: {exc}"), False
            if (tree_node.name(), str(exc)) not in self._reported:       # a tree error: said once, not each tick
                self._reported.add((tree_node.name(), str(exc)))
                log.error("%s (%s): %s", tree_node.name(), node.id, exc)
        if verdict.outputs:
            self._write_outputs(node, tree_node, verdict.outputs)
        return verdict, valid

    def _check_tick(self, node: NodeDef, tree_node: Any) -> Any:
        """A condition or a sync action (Publish): decided now, never waiting."""
        verdict, _ = self._verdict(node, tree_node)
        if node.kind == "Action":
            return self._finish(node, tree_node, 0 if verdict.ok else ErrorCode.INVALID_ARGUMENT, verdict.why)
        return self._status.SUCCESS if verdict.ok else self._status.FAILURE

    def _wait_tick(self, node: NodeDef, tree_node: Any) -> Any:
        """A waiting check (WaitForTopic): SUCCESS once it holds, RUNNING until ``timeout_s``."""
        verdict, valid = self._verdict(node, tree_node)
        if verdict.ok:
            self._timers.pop(tree_node.uid(), None)
            return self._finish(node, tree_node, 0, verdict.why)
        if not valid:
            self._timers.pop(tree_node.uid(), None)
            return self._finish(node, tree_node, ErrorCode.INVALID_ARGUMENT, verdict.why)
        if time.monotonic() >= self._timers.get(tree_node.uid(), float("inf")):
            self._timers.pop(tree_node.uid(), None)
            return self._finish(node, tree_node, ErrorCode.TIMEOUT, f"still not so: {verdict.why}")
        return self._status.RUNNING

    def _on_start(self, node: NodeDef, tree_node: Any) -> Any:
        try:
            values = self._inputs(node, tree_node)
            if node.id == TIMEOUT_TIMER:
                return self._start_timer(tree_node, values)
            if node.waits:
                timeout_s = float(values["timeout_s"])
                self._timers[tree_node.uid()] = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
                return self._wait_tick(node, tree_node)
            values["budget"] = self._budgets.setdefault(tree_node.name(), StepBudget())
            request = node.start(self.client_for(values["node"]), values)
        except (ValueError, TypeError) as exc:
            return self._finish(node, tree_node, ErrorCode.INVALID_ARGUMENT, f"{node.id}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a node fails with a code, it never throws into BT.CPP
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: {type(exc).__name__}: {exc}")
        self._active[tree_node.uid()] = request
        self._event(tree_node.name(), "started", node.id)
        return self._on_running(node, tree_node)

    def _on_running(self, node: NodeDef, tree_node: Any) -> Any:
        if node.id == TIMEOUT_TIMER:
            return self._timer_running(tree_node)
        if node.waits:
            return self._wait_tick(node, tree_node)
        request = self._active.get(tree_node.uid())
        if request is None:                      # not started by us (should not happen): fail loudly
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: no request in flight")
        try:
            progress = request.poll()
        except Exception as exc:  # noqa: BLE001 - e.g. rclpy refusing a request; never into BT.CPP
            del self._active[tree_node.uid()]
            return self._finish(node, tree_node, ErrorCode.INTERNAL, f"{node.id}: {type(exc).__name__}: {exc}")
        self._report_waiting(tree_node, request)
        if progress is Progress.RUNNING:
            return self._status.RUNNING
        del self._active[tree_node.uid()]
        self._waiting.pop(tree_node.uid(), None)
        answer = getattr(request, "response", None) or getattr(request, "result", None)
        if progress is Progress.SUCCESS:
            self._budgets.pop(tree_node.name(), None)
            if answer is not None:               # None: a resumed RunPolicy had no step left
                self._write_outputs(node, tree_node, node.outputs(answer))
        return self._finish(node, tree_node, request.error_code, request.message)

    def _report_waiting(self, tree_node: Any, request: Any) -> None:
        """A RunPolicy goal that cannot step says what it waits for (and when it steps again)."""
        waiting = getattr(request, "waiting_for", "")
        before = self._waiting.get(tree_node.uid(), "")
        if waiting != before:
            self._waiting[tree_node.uid()] = waiting
            if waiting and waiting.split(" (for ")[0] == before.split(" (for ")[0]:
                return                           # the same wait, only longer: said once
            self._event(tree_node.name(), "waiting" if waiting else "stepping again", waiting)

    def _on_halted(self, tree_node: Any) -> None:
        self._timers.pop(tree_node.uid(), None)
        self._waiting.pop(tree_node.uid(), None)
        request = self._active.pop(tree_node.uid(), None)
        if request is not None:
            request.halt()
            self._event(tree_node.name(), "halted", "goal cancelled at the next boundary"
                        if getattr(request, "cancel_sent", False) else "request abandoned")
            budget = self._budgets.get(tree_node.name())
            if budget is not None and hasattr(request, "reported_steps"):
                budget.halted(request)

    # --- the Timeout stand-in ----------------------------------------------------------------
    def _start_timer(self, tree_node: Any, values: dict[str, Any]) -> Any:
        msec = float(values["msec"])
        if msec < 0:
            return self._finish(BY_ID[TIMEOUT_TIMER], tree_node, ErrorCode.INVALID_ARGUMENT,
                                f"Timeout: msec must be >= 0, got {msec:g}")
        self._timers[tree_node.uid()] = time.monotonic() + msec / 1e3 if msec > 0 else float("inf")
        return self._status.RUNNING

    def _timer_running(self, tree_node: Any) -> Any:
        deadline = self._timers.get(tree_node.uid())
        if deadline is not None and time.monotonic() < deadline:
            return self._status.RUNNING
        self._timers.pop(tree_node.uid(), None)
        raw = self.ports.get(tree_node.name(), {})
        self._event(tree_node.name(), "expired", f"halting {raw.get('child', 'its child')}")
        return self._status.FAILURE

    # --- outcomes -------------------------------------------------------------------------------
    def _finish(self, node: NodeDef, tree_node: Any, code: int, message: str) -> Any:
        try:
            name = ErrorCode(int(code)).name
        except ValueError:
            name = str(int(code))
        self._write_outputs(node, tree_node, {"error_code": int(code), "error_name": name,
                                              "error_message": message})
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
