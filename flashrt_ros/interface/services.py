"""Every capsule service verb, declared once: the table the node's services, the client, the CLI
and both behaviour-tree front-ends are made from.

Why one table: a verb used to be written by hand in about ten places (the node's service table
and handler, the client's tables, a CLI sub-command and its dispatch, a BehaviorTree.CPP node, a
py_trees class, docs), and they drifted. Here each ``ServiceVerb`` says what the others need:

* the service: its name (``~/snapshot``) and type; the node's handler for it is
  ``flashrt_ros.ros.verb_handlers.HANDLERS[name]`` (one per verb, a test checks);
* when it runs: ``at_boundary`` (reads or writes the live state: between two engine steps) or
  store-only (never holds the engine), whether it ``replaces_state`` (the policy's inputs then
  follow ``inputs_after_restore``), which ``engines`` serve it;
* its request fields (``RequestField``: type, default, doc, positional on the command line and in
  a py_trees constructor, the behaviour-tree port name), and whether a lost reply may be re-sent
  (``retry_safe``; see ``flashrt_ros/client/services.py``);
* its behaviour-tree node (``TreeNode``: the BT.CPP node ID, also the py_trees class name, its doc
  and output ports), if it has one.

Derived from it: ``ros/state_services.py`` (services and dispatch), ``client.SERVICES`` and
``RETRY_SAFE_VERBS``, the CLI's sub-commands, the tree nodes (``interface/tree_nodes.py``, and so
the Groot2 model and the node table of docs/behaviour_trees.md), ``bt/behaviours.py``'s classes,
the service table of docs/services.md and the command table of docs/cli.md
(``python -m flashrt_ros.interface.generate``).
Adding a verb: its .srv, one entry here, its handler in ``ros/verb_handlers.py`` (with the engine
method it calls), tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from flashrt_ros.srv import (CloseSession, Drop, Fork, ListCapsules, Load, Pause, Pin, Reset, Restore, Resume,
                             Rollback, Save, Snapshot, SwitchSession, Unpin, Verify)

#: The capsule tiers, fastest first (a snapshot's or fork's ``tier``; the ``default_tier`` parameter).
TIERS = ("device", "host", "disk")


@dataclass(frozen=True)
class RequestField:
    """One field of a verb's request, as every front-end offers it."""

    name: str                       # the request field (a test checks it against the .srv)
    kind: type                      # str | int | float | bool
    default: Any                    # None: required (a behaviour-tree port without a default)
    doc: str                        # behaviour-tree port doc and command-line help
    positional: bool = False        # positional on the command line and in the py_trees constructor
    port: str = ""                  # the behaviour-tree port / py_trees argument (default: ``name``)
    behaviour_arg: str = ""         # the py_trees argument where it differs from ``port``
    flag: str = ""                  # the command-line option where it differs from ``name``
    choices: tuple[str, ...] = ()   # what the command line offers (the node checks the value itself)
    minimum: int | None = None      # refused below this by the node (INVALID_ARGUMENT) and the CLI

    @property
    def port_name(self) -> str:
        return self.port or self.name

    @property
    def arg_name(self) -> str:
        """Its name in a py_trees behaviour's constructor."""
        return self.behaviour_arg or self.port_name

    @property
    def cli_dest(self) -> str:
        """Its attribute on the parsed command line (``--live`` -> ``live``)."""
        return self.flag or self.name

    @property
    def cli_option(self) -> str:
        """Its command-line option (``--against-live`` is ``--live``); positional fields have none."""
        return "--" + self.cli_dest.replace("_", "-")

    def below_minimum(self, value: Any) -> str | None:
        """Why ``value`` is refused (``steps must be >= 1``), or None."""
        if self.minimum is not None and value < self.minimum:
            return f"{self.name} must be >= {self.minimum}"
        return None


@dataclass(frozen=True)
class TreeOutput:
    """An output port of a verb's behaviour-tree node, read from the response."""

    name: str
    kind: type
    doc: str
    read: Callable[[Any], Any]


@dataclass(frozen=True)
class TreeNode:
    """A verb's behaviour-tree node: the BT.CPP node ID (and py_trees class name), doc, outputs."""

    id: str
    doc: str
    outputs: tuple[TreeOutput, ...] = ()


@dataclass(frozen=True)
class ServiceVerb:
    """One capsule service verb (see the module docstring)."""

    name: str                       # service ~/<name>, the client's verb, CLI command (``_`` -> ``-``)
    srv: type
    summary: str                    # one line: the CLI command's help
    doc: str                        # what it does: the docs/services.md table
    at_boundary: bool               # True: runs between two engine steps; False: store only
    fields: tuple[RequestField, ...] = ()
    replaces_state: bool = False    # restore, reset, rollback, switch: the live state is another one
    retry_safe: bool = False        # a lost reply may be re-sent (client/services.py says when)
    retry_safe_if: str = ""         # ... only when this bool request field is set
    engines: tuple[str, ...] = ("llm", "policy")
    tree: TreeNode | None = None

    @property
    def command(self) -> str:
        """The CLI sub-command (``close_session`` -> ``close-session``)."""
        return self.name.replace("_", "-")

    @property
    def srv_type_name(self) -> str:
        """``flashrt_ros/srv/Snapshot``."""
        return f"flashrt_ros/srv/{self.srv.__name__}"

    @property
    def takes_request_id(self) -> bool:
        """Its request has ``request_id``: the node answers a copy under the same id with the first answer
        (``ros/request_ledger.py``), so any lost reply may be re-sent. Every verb that changes something."""
        return "request_id" in self.srv.Request.get_fields_and_field_types()

    def is_retry_safe(self, fields: dict[str, Any]) -> bool:
        """A lost reply may be re-sent: the request carries a ``request_id``, or a repeat does nothing one late
        request would not (``retry_safe``, ``retry_safe_if``)."""
        if fields.get("request_id") and self.takes_request_id:
            return True
        return self.retry_safe or (bool(self.retry_safe_if) and bool(fields.get(self.retry_safe_if)))

    def refusal(self, request: Any, engine_kind: str) -> str | None:
        """Why the declaration rules ``request`` out on an ``engine_kind`` node (the node answers
        INVALID_ARGUMENT before anything waits or changes), or None."""
        if engine_kind not in self.engines:
            return f"{self.name} applies to engine_kind={'/'.join(self.engines)}"
        return next(filter(None, (f.below_minimum(getattr(request, f.name)) for f in self.fields)), None)


# --- fields and outputs several verbs share ----------------------------------------------------
def _capsule_name(doc: str = "capsule name") -> RequestField:
    return RequestField("name", str, None, doc, positional=True, port="capsule")


def _tier(doc: str) -> RequestField:
    return RequestField("tier", str, "", doc, choices=("",) + TIERS)


_SESSION_NAME = RequestField("session", str, None, "session to make live", positional=True)
_CAPSULE_POSITION = TreeOutput("position", int, "the capsule's / state's position (steps or tokens)",
                               lambda r: int(r.capsule.position))


# --- the verbs -----------------------------------------------------------------------------------
VERBS: tuple[ServiceVerb, ...] = (
    ServiceVerb(
        "snapshot", Snapshot, "snapshot the live state into a capsule",
        "copy the live state into capsule `name` (tier `device`/`host`/`disk`, `pin`, `overwrite`)",
        at_boundary=True, retry_safe_if="overwrite",
        fields=(_capsule_name(),
                _tier("device | host | disk (empty: the node's default_tier)"),
                RequestField("session", str, "", "session tag (empty: the current session)"),
                RequestField("pin", bool, False, "pin it (budgets never demote it)"),
                RequestField("overwrite", bool, False, "replace an existing capsule of that name")),
        tree=TreeNode("Snapshot", "Copy the live state into capsule `capsule` at the next committed boundary.",
                      (_CAPSULE_POSITION,))),
    ServiceVerb(
        "restore", Restore, "restore a capsule into the live state",
        "copy capsule `name` back into the live buffers (`verify`: re-hash first); a running generation "
        "ends with `cancelled`",
        at_boundary=True, replaces_state=True, retry_safe=True,
        fields=(_capsule_name(),
                RequestField("verify", bool, False, "re-hash the capsule first (refuse a damaged one)")),
        tree=TreeNode("Restore", "Copy capsule `capsule` back into the live state at the next committed boundary.",
                      (_CAPSULE_POSITION,))),
    ServiceVerb(
        "fork", Fork, "copy a capsule into a new one",
        "copy capsule `source` into a new independent capsule `name`",
        at_boundary=False,
        fields=(RequestField("source", str, None, "existing capsule", positional=True),
                RequestField("name", str, None, "new capsule name", positional=True, port="capsule",
                             behaviour_arg="new_name"),
                _tier("tier of the copy (empty: the node's default_tier)")),
        tree=TreeNode("Fork", "Copy capsule `source` into a new independent capsule `capsule` (store only).",
                      (_CAPSULE_POSITION,))),
    ServiceVerb(
        "drop", Drop, "delete a capsule",
        "delete a capsule from every tier, disk files included (pinned: refused)",
        at_boundary=False, fields=(_capsule_name(),),
        tree=TreeNode("Drop", "Delete capsule `capsule` from every tier, disk files included (store only).")),
    ServiceVerb(
        "rollback", Rollback, "go back STEPS committed boundaries",
        "go back `steps` committed boundaries (at most `rollback_depth`; a restore starts a new history)",
        at_boundary=True, replaces_state=True,
        fields=(RequestField("steps", int, 1, "boundaries to undo (>= 1)", positional=True, minimum=1),),
        tree=TreeNode("Rollback", "Go back `steps` committed boundaries (at most the node's rollback_depth).",
                      (TreeOutput("position", int, "the capsule's / state's position (steps or tokens)",
                                  lambda r: int(r.position)),))),
    ServiceVerb(
        "reset", Reset, "reset the engine state (capsules stay)",
        "empty the engine state (capsules stay)",
        at_boundary=True, replaces_state=True, retry_safe=True,
        tree=TreeNode("Reset", "Empty the current session's state (a new episode or conversation); capsules stay.")),
    ServiceVerb(
        "switch_session", SwitchSession,
        "park the current session and make SESSION live (a new name starts empty)",
        "make session `session` live at a committed boundary: the current one is parked, `session`'s parked "
        "state restored (a new name starts empty); answers `previous_session`. Empty name: "
        "`INVALID_ARGUMENT`; the current session: nothing changes",
        at_boundary=True, replaces_state=True, retry_safe=True, fields=(_SESSION_NAME,),
        tree=TreeNode("SwitchSession", "Park the current session and make `session` live (a new name starts "
                      "empty).", (TreeOutput("previous_session", str, "the session that was live before",
                                             lambda r: r.previous_session),))),
    ServiceVerb(
        "pause", Pause, "pause the policy loop",
        "stop the policy control loop at a boundary (policy engine)",
        at_boundary=True, retry_safe=True, engines=("policy",),
        tree=TreeNode("PausePolicy", "Stop the policy loop at a boundary; its state stays exactly where it was.")),
    ServiceVerb(
        "resume", Resume, "resume the policy loop",
        "restart the policy control loop at a boundary (policy engine)",
        at_boundary=True, retry_safe=True, engines=("policy",),
        tree=TreeNode("ResumePolicy", "Restart the policy loop.")),
    ServiceVerb(
        "list", ListCapsules, "list capsules",
        "capsules (optionally of one `session`) and bytes per tier; parked sessions are not listed",
        at_boundary=False, retry_safe=True,
        fields=(RequestField("session", str, "", "only this session's capsules (empty: all)"),)),
    ServiceVerb(
        "save", Save, "write a capsule to disk",
        "write a capsule to `capsule_directory` (one safetensors file, replaced atomically)",
        at_boundary=False, retry_safe=True, fields=(_capsule_name(),)),
    ServiceVerb(
        "load", Load, "read a capsule from the capsule directory",
        "read a capsule file, checking format, fingerprint, layout and every hash",
        at_boundary=False, fields=(_capsule_name(),)),
    ServiceVerb(
        "verify", Verify, "re-hash a capsule (and compare with the live state)",
        "re-hash a stored capsule against the hashes taken at snapshot time (`intact`); `against_live`: "
        "compare it with the live state (at a boundary). A capsule without recorded hashes (CUDA device "
        "tier, see below) answers `intact=false` with the message `unverified`",
        at_boundary=False, retry_safe=True,
        fields=(_capsule_name(),
                RequestField("against_live", bool, False, "also compare with the live state", flag="live"))),
    ServiceVerb(
        "pin", Pin, "keep a capsule where it is (no demotion, no drop)",
        "pin capsule `name`: budgets never demote or evict it, `~/drop` and overwrites refuse it (`PINNED`)",
        at_boundary=False, retry_safe=True, fields=(_capsule_name(),)),
    ServiceVerb(
        "unpin", Unpin, "let budgets demote a capsule again",
        "release a pin (from `~/pin` or `Snapshot.pin`): budgets may demote it again, `~/drop` accepts it",
        at_boundary=False, retry_safe=True, fields=(_capsule_name(),)),
    ServiceVerb(
        "close_session", CloseSession, "forget a parked session and free its state",
        "forget parked session `session` and free its parked capsule in every tier (the current session: "
        "`INVALID_ARGUMENT`, switch away first; unknown: `NOT_FOUND`)",
        at_boundary=False,
        fields=(RequestField("session", str, None, "the parked session to forget", positional=True),)),
)

BY_NAME: dict[str, ServiceVerb] = {v.name: v for v in VERBS}
