"""Both actions' fields, declared once: Generate and RunPolicy, as the client, the CLI and the trees
offer them.

Why: each goal field used to be written by hand in about seven places (the .action file, the
client's goal, the CLI's options and the call that passes them, the BehaviorTree.CPP node's ports,
the py_trees behaviour), and their defaults drifted (the client's top_p 1.0 against the message's
0). Here each ``GoalField`` says what the front-ends need; the action servers
(``ros/generate_action.py``, ``ros/policy_action.py``) are the handlers and read the goal message.
The tree node's outputs are result fields (``ResultOutput``). Adding a goal field: the .action
file, its ``GoalField`` here, the server that acts on it, a test; the CLI option, the tree port
and its docs follow (``python -m flashrt_ros.interface.generate``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashrt_ros.action import Generate, RunPolicy


@dataclass(frozen=True)
class GoalField:
    """One goal field and where it is offered."""

    name: str
    kind: type                      # str | int | float | bool
    default: Any                    # what a goal carries when the caller gives none
    doc: str                        # the tree port's doc; the CLI help unless ``cli_help``
    cli: str | None = ""            # the CLI option (without --): "" -> the name, "_" as "-"; None: not offered
    cli_help: str = ""
    cli_metavar: str | None = None
    cli_inverted: bool = False      # a switch that sets a bool field False (``--raw``: no chat template)
    positional: bool = False        # positional on the command line (and in the client's call)
    tree: bool = True               # a port of the action's tree node
    by_client: bool = False         # set by the client itself (lease, owner): no option, no port

    @property
    def cli_dest(self) -> str:
        """Its attribute on the parsed command line (``--max-duration`` -> ``max_duration``)."""
        return (self.cli or self.name).replace("-", "_")

    @property
    def cli_option(self) -> str:
        """Its command-line option (``--max-duration``)."""
        return "--" + self.cli_dest.replace("_", "-")

    def cli_value(self, given: Any) -> Any:
        """The field's value from the parsed option."""
        return (not given) if self.cli_inverted else given


@dataclass(frozen=True)
class ResultOutput:
    """A result field the action's tree node writes to an output port."""

    name: str
    kind: type
    doc: str

    def read(self, result: Any) -> Any:
        return self.kind(getattr(result, self.name))


@dataclass(frozen=True)
class ActionDecl:
    """One action of the node (see the module docstring)."""

    name: str                       # ~/<name>; the client's and the trees' action name
    action: type
    command: str                    # the CLI sub-command
    summary: str                    # the CLI command's help
    tree_id: str                    # the BehaviorTree.CPP node (and py_trees class) name
    tree_doc: str
    goal: tuple[GoalField, ...]
    outputs: tuple[ResultOutput, ...] = ()

    @property
    def tree_fields(self) -> tuple[GoalField, ...]:
        return tuple(f for f in self.goal if f.tree and not f.by_client)

    @property
    def cli_fields(self) -> tuple[GoalField, ...]:
        return tuple(f for f in self.goal if f.cli is not None and not f.by_client)

    def goal_message(self, **fields: Any) -> Any:
        """A ``Goal`` with the declared defaults and ``fields``; ValueError names an unknown field."""
        known = {f.name: f for f in self.goal}
        unknown = next((k for k in fields if k not in known), None)
        if unknown is not None:
            raise ValueError(f"{self.name}: unknown goal field {unknown!r}")
        goal = self.action.Goal()
        for f in self.goal:
            setattr(goal, f.name, fields.get(f.name, f.default))
        return goal


_LEASE = GoalField("lease_s", float, 0.0, "> 0: the node ends the goal unless its client renews the lease within "
                   "this many seconds (LEASE_EXPIRED); 0: no lease", by_client=True)
_OWNER = GoalField("owner", str, "", "who sent the goal (named when another goal is refused)", by_client=True)

GENERATE = ActionDecl(
    "generate", Generate, "generate", "generate text (streams tokens)",
    "Generate", "Generate text (LLM engine); halt cancels it at the next token boundary.",
    goal=(
        GoalField("prompt", str, "", "text to append (empty: continue the live context)", positional=True),
        GoalField("use_chat_template", bool, False, "wrap the prompt as a user turn", cli="raw",
                  cli_help="no chat template", cli_inverted=True),
        GoalField("reset", bool, False, "start from an empty context"),
        GoalField("max_new_tokens", int, 0, "0: the node's max_new_tokens"),
        GoalField("temperature", float, 0.0, "0: greedy"),
        GoalField("top_k", int, 0, "0: off"),
        GoalField("top_p", float, 1.0, "1: off"),
        GoalField("seed", int, 0, "0: keep the RNG stream in the state; else reseed"),
        GoalField("session", str, "", "conversation (empty: the current one)",
                  cli_help="conversation to continue (default: the current one)"),
        GoalField("rollback_on_cancel", bool, False, "on halt, restore the state the goal started from (the node "
                  "parameter of the same name also does)", cli=None),
        _LEASE, _OWNER),
    outputs=(ResultOutput("text", str, "the generated text"),
             ResultOutput("stop_reason", str, "stop_token | max_new_tokens | context_full")))

RUN_POLICY = ActionDecl(
    "run_policy", RunPolicy, "run-policy",
    "run the policy for a bounded time (RunPolicy action; prints each step; Ctrl-C cancels)",
    "RunPolicy", "Run the policy for `max_steps` steps and/or `max_duration_s` seconds; halt cancels it "
    "between two steps.",
    goal=(
        GoalField("max_steps", int, 0, "stop after this many policy steps (0: no step limit)",
                  cli_help="stop after N policy steps", cli_metavar="N"),
        GoalField("max_duration_s", float, 0.0, "stop after this long (0: no time limit); set one of the two",
                  cli="max-duration", cli_help="stop after S seconds", cli_metavar="S"),
        GoalField("session", str, "", "session to run in (empty: the current one)",
                  cli_help="capsule session to run in (default: the current one)"),
        GoalField("rollback_on_cancel", bool, False, "on halt, restore the state the goal started from (the node "
                  "parameter of the same name also does)",
                  cli_help="a cancel (Ctrl-C) restores the state the goal started from"),
        _LEASE,
        GoalField("stale_timeout_s", float, 0.0, "end the goal (STALE_INPUTS; INPUT_REJECTED when its input "
                  "messages are refused) after this long without fresh inputs (0: the node's goal_stale_timeout_s; "
                  "< 0: wait for ever)", cli="stale-timeout",
                  cli_help="end the goal (STALE_INPUTS; INPUT_REJECTED when the node refuses the inputs' messages) "
                  "after S s without fresh inputs (default: the node's goal_stale_timeout_s; < 0: wait for ever)",
                  cli_metavar="S", tree=False),
        _OWNER),
    outputs=(ResultOutput("steps", int, "policy steps the goal took"),
             ResultOutput("stop_reason", str, "max_steps | max_duration | deactivated"),
             ResultOutput("rolled_back", bool, "the goal's start was restored (only after a cancel)")))

ACTIONS: tuple[ActionDecl, ...] = (RUN_POLICY, GENERATE)
BY_NAME: dict[str, ActionDecl] = {a.name: a for a in ACTIONS}
