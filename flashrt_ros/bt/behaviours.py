"""py_trees behaviours for a flashrt node: every capsule verb, RunPolicy, Generate, a pause guard.

The capsule verbs' classes (``Snapshot``, ``Restore``, ...) are made from their declarations in
``interface/services.py`` by ``verb_behaviour``: one generic ``ServiceBehaviour``, each verb a table
entry there (its node ID, fields and defaults, as the BehaviorTree.CPP node has them).

The rules (never block a tick, check ``success``, a lost reply ends in TIMEOUT
and is re-sent only where that is safe, halt = cancel at a committed boundary)
live in ``flashrt_ros.bt.requests``, shared with the BehaviorTree.CPP nodes;
this module only maps them onto py_trees:

* ``update()`` polls one request; RUNNING until the node answered.
* FAILURE carries the node's message (with the error code's name) as
  ``feedback_message`` and the code itself as ``error_code``.
* An interrupted behaviour (``terminate(INVALID)``: a higher-priority branch
  took over) halts its request: a pending service response is abandoned, a
  goal is cancelled at the node's next committed boundary (rolled back with
  ``rollback_on_cancel``), and the client's next request waits for that.

The futures complete only if someone spins the client's node: run the tree
next to an executor (a spin thread, or ``executor.spin_once(timeout_sec=0)``
between ticks) as ``examples/`` shows.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterator

import py_trees
from py_trees.common import Status

from flashrt_ros.bt.requests import (DEFAULT_TIMEOUT_S, GoalRequest, Progress, ServiceRequest, StepBudget,
                                     check_status, run_policy_fields, status_watch)
from flashrt_ros.interface.actions import RUN_POLICY
from flashrt_ros.interface.services import VERBS, ServiceVerb

_STATUS = {Progress.RUNNING: Status.RUNNING, Progress.SUCCESS: Status.SUCCESS, Progress.FAILURE: Status.FAILURE}


class ServiceBehaviour(py_trees.behaviour.Behaviour):
    """Base: call ``verb`` with ``request_fields()``; the response is kept in ``self.response``."""

    verb: str = ""

    def __init__(self, name: str, client: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name)
        self.client, self.timeout_s = client, timeout_s
        self.fields: dict[str, Any] = {}
        self.request: ServiceRequest | None = None
        self.response: Any = None
        self.error_code = 0

    def request_fields(self) -> dict[str, Any]:
        """The request's fields, read when the request is sent (override to read a blackboard)."""
        return dict(self.fields)

    def initialise(self) -> None:
        self.request, self.response, self.error_code = None, None, 0

    def update(self) -> Status:
        if self.request is None:
            self.request = ServiceRequest(self.client, self.verb, self.request_fields(), self.timeout_s)
        progress = self.request.poll()
        if progress is Progress.RUNNING:
            self.feedback_message = f"waiting for {self.verb}"
        else:
            self.response, self.error_code = self.request.response, self.request.error_code
            self.feedback_message = self.request.message
        return _STATUS[progress]

    def terminate(self, new_status: Status) -> None:
        if new_status is Status.INVALID and self.request is not None and self.request.pending:
            self.request.halt()
            self.feedback_message = f"{self.verb}: interrupted, response abandoned"


def verb_behaviour(verb: ServiceVerb) -> type[ServiceBehaviour]:
    """A capsule verb's behaviour class, from its declaration (``interface/services.py``).

    Named like its BehaviorTree.CPP node; its constructor is ``(name, client, <positional
    fields>, *, <other fields>=<default>, timeout_s=DEFAULT_TIMEOUT_S)``, each field under its
    port name (``Snapshot(name, client, capsule, *, tier="", session="", pin=False,
    overwrite=False, timeout_s=15.0)``).
    """
    assert verb.tree is not None, f"{verb.name} declares no behaviour-tree node"
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("self", "name", "client")]
    params += [inspect.Parameter(f.arg_name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for f in verb.fields if f.positional]
    params += [inspect.Parameter(f.arg_name, kw, default=inspect.Parameter.empty if f.default is None else f.default)
               for f in verb.fields if not f.positional]
    params.append(inspect.Parameter("timeout_s", kw, default=DEFAULT_TIMEOUT_S))
    signature = inspect.Signature(params)

    def __init__(self: ServiceBehaviour, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        ServiceBehaviour.__init__(self, given["name"], given["client"], timeout_s=given["timeout_s"])
        self.fields = {f.name: given[f.arg_name] for f in verb.fields}

    def request_fields(self: ServiceBehaviour) -> dict[str, Any]:
        """The fields as given, numbers as the declared type (``steps=2.0`` is sent as 2)."""
        return {f.name: f.kind(self.fields[f.name]) if f.kind in (int, float) else self.fields[f.name]
                for f in verb.fields}

    __init__.__signature__ = signature                   # type: ignore[attr-defined] - help() shows it
    return type(verb.tree.id, (ServiceBehaviour,), {
        "__init__": __init__, "request_fields": request_fields, "__doc__": verb.tree.doc,
        "__module__": __name__, "verb": verb.name})


#: One class per capsule verb that has a tree node: Snapshot, Restore, Fork, Drop, Rollback, Reset,
#: SwitchSession, PausePolicy, ResumePolicy (and whatever ``interface.services.VERBS`` adds).
VERB_BEHAVIOURS: dict[str, type[ServiceBehaviour]] = {
    verb.tree.id: verb_behaviour(verb) for verb in VERBS if verb.tree is not None}
globals().update(VERB_BEHAVIOURS)


class GoalBehaviour(py_trees.behaviour.Behaviour):
    """Base: run one ``action`` goal with ``goal_fields()``; the result is kept in ``self.result``."""

    action: str = ""

    def __init__(self, name: str, client: Any, *, timeout_s: float = 0.0,
                 answer_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name)
        self.client, self.timeout_s, self.answer_timeout_s = client, timeout_s, answer_timeout_s
        self.request: GoalRequest | None = None
        self.result: Any = None
        self.error_code = 0

    def goal_fields(self) -> Any:
        """The goal's fields (a dict, or a callable read when the goal is sent)."""
        return {}

    def on_feedback(self, feedback: Any) -> None:
        """Called from the executor for each feedback message."""

    def initialise(self) -> None:
        self.request, self.result, self.error_code = None, None, 0

    def update(self) -> Status:
        if self.request is None:
            self.request = GoalRequest(self.client, self.action, self.goal_fields(), timeout_s=self.timeout_s,
                                       answer_timeout_s=self.answer_timeout_s, on_feedback=self.on_feedback)
        progress = self.request.poll()
        if progress is Progress.RUNNING:
            self.feedback_message = self.running_message()
        else:
            self.result, self.error_code = self.request.result, self.request.error_code
            self.feedback_message = self.request.message
        return _STATUS[progress]

    def running_message(self) -> str:
        return f"{self.action} running"

    def terminate(self, new_status: Status) -> None:
        if new_status is Status.INVALID and self.request is not None:
            self.request.halt()
            if self.request.cancel_sent:
                self.feedback_message = f"{self.action}: interrupted, goal cancelled at the next boundary"


class RunPolicy(GoalBehaviour):
    """Run the hosted policy for ``max_steps`` steps and/or ``max_duration_s`` seconds (a RunPolicy goal).

    ``goal_fields``: the goal fields a tree gives (``interface.actions.RUN_POLICY``: ``max_steps``,
    ``max_duration_s``, ``session``, ``rollback_on_cancel``; each defaults to its declaration's).

    SUCCESS when the goal ends by its limits; FAILURE when it is rejected or
    aborted (error code and message from the node) or after ``timeout_s`` (0:
    none). Interrupted, it cancels the goal: the node stops between two policy
    steps and, with ``rollback_on_cancel``, restores the state the goal started
    from. ``steps`` / ``last_action`` follow the feedback; ``result`` holds the
    RunPolicy result (``steps``, ``stop_reason``, ``rolled_back``).
    With ``resume_after_halt``, a run started after a halt takes only the steps
    the halted goal left (``requests.StepBudget``), so an interrupted mission
    still takes exactly ``max_steps`` steps.
    """

    action = "run_policy"

    def __init__(self, name: str, client: Any, *, timeout_s: float = 0.0, answer_timeout_s: float = DEFAULT_TIMEOUT_S,
                 resume_after_halt: bool = False, **goal_fields: Any) -> None:
        super().__init__(name, client, timeout_s=timeout_s, answer_timeout_s=answer_timeout_s)
        declared = {f.name: f.default for f in RUN_POLICY.tree_fields}
        unknown = sorted(set(goal_fields) - set(declared))
        if unknown:
            raise TypeError(f"RunPolicy: unknown goal field(s) {unknown} (known: {', '.join(declared)})")
        self.fields = {**declared, **goal_fields}
        self.budget = StepBudget() if resume_after_halt else None
        self.steps = 0
        self.last_action: list[float] = []

    def goal_fields(self) -> Any:
        return run_policy_fields(self.fields, self.budget)

    def update(self) -> Status:
        status = super().update()
        if status is Status.SUCCESS and self.budget is not None:
            self.budget.finished()
        return status

    def terminate(self, new_status: Status) -> None:
        # self.status is still the old one here: only a running goal is halted (a finished
        # behaviour is also stopped with INVALID when its parent resets it).
        if (new_status is Status.INVALID and self.status is Status.RUNNING and self.budget is not None
                and self.request is not None):
            self.budget.halted(self.request)
        super().terminate(new_status)

    def initialise(self) -> None:
        super().initialise()
        self.steps, self.last_action = 0, []

    def on_feedback(self, feedback: Any) -> None:
        self.steps, self.last_action = int(feedback.steps), list(feedback.last_action)

    def running_message(self) -> str:
        return f"policy running: {self.steps} steps"


class Generate(GoalBehaviour):
    """Run one generation goal; SUCCESS with ``self.result`` when ``result.success``.

    FAILURE on rejection, ``success=false``, an absent server or ``timeout_s``
    (the goal is then cancelled, as on interruption). Feedback pieces are
    appended to ``self.pieces``.
    """

    action = "generate"

    def __init__(self, name: str, client: Any, prompt: str, *, timeout_s: float = 60.0,
                 answer_timeout_s: float = DEFAULT_TIMEOUT_S, **goal_fields: Any) -> None:
        super().__init__(name, client, timeout_s=timeout_s, answer_timeout_s=answer_timeout_s)
        self.prompt, self.extra_fields = prompt, goal_fields
        self.pieces: list[str] = []

    def goal_fields(self) -> dict[str, Any]:
        return {"prompt": self.prompt, **self.extra_fields}

    def initialise(self) -> None:
        super().initialise()
        self.pieces = []

    def on_feedback(self, feedback: Any) -> None:
        self.pieces.append(feedback.text_piece)

    def running_message(self) -> str:
        return f"generating: {len(self.pieces)} tokens"


class StatusCondition(py_trees.behaviour.Behaviour):
    """Base: SUCCESS while ``condition`` holds on the node's latest ``~/status``, else FAILURE (one tick)."""

    condition: str = ""

    def __init__(self, name: str, client: Any) -> None:
        super().__init__(name)
        self.client = client

    def update(self) -> Status:
        holds, why = check_status(status_watch(self.client).latest, self.condition)
        self.feedback_message = why
        return Status.SUCCESS if holds else Status.FAILURE


class InputsFresh(StatusCondition):
    """Are the policy's inputs fresh (``~/status`` ``inputs_state``)?"""

    condition = "inputs_fresh"


class IsPolicyPaused(StatusCondition):
    """Is the policy loop paused (active policy node, ``~/status`` ``paused``)?"""

    condition = "policy_paused"


class PolicyPaused(py_trees.decorators.Decorator):
    """Guard: pause the policy, tick ``child`` to completion, resume the policy.

    The child runs only once the pause succeeded. The policy is resumed whatever
    the child's outcome; the guard returns the child's status, or FAILURE if
    pausing or resuming failed. If the guard is interrupted, a resume request
    is sent without waiting (a tree must not leave a robot's policy paused
    because another branch took over).
    """

    def __init__(self, name: str, client: Any, child: py_trees.behaviour.Behaviour, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name=name, child=child)
        self.client, self.timeout_s = client, timeout_s
        self._phase = "pausing"
        self._pause: ServiceRequest | None = None
        self._resume: ServiceRequest | None = None
        self._child_status = Status.INVALID

    def initialise(self) -> None:
        self._phase, self._child_status = "pausing", Status.INVALID
        self._pause = ServiceRequest(self.client, "pause", {}, self.timeout_s)
        self._resume = None

    def tick(self) -> Iterator[py_trees.behaviour.Behaviour]:
        if self.status != Status.RUNNING:
            self.initialise()
        if self._phase == "pausing":
            status = _STATUS[self._pause.poll()]
            if status is Status.FAILURE:
                yield from self._finish(Status.FAILURE, self._pause.message)
                return
            if status is Status.SUCCESS:
                self._phase = "running"
        if self._phase == "running":
            yield from self.decorated.tick()
            if self.decorated.status is not Status.RUNNING:
                self._child_status = self.decorated.status
                self._phase = "resuming"
                self._resume = ServiceRequest(self.client, "resume", {}, self.timeout_s)
        if self._phase == "resuming":
            status = _STATUS[self._resume.poll()]
            if status is Status.SUCCESS:
                yield from self._finish(self._child_status, f"child {self._child_status.value}, policy resumed")
                return
            if status is Status.FAILURE:
                yield from self._finish(Status.FAILURE, self._resume.message)
                return
        self.status = Status.RUNNING
        self.feedback_message = self._phase
        yield self

    def update(self) -> Status:   # unused: tick() drives the phases
        return self.status

    def _finish(self, status: Status, message: str) -> Iterator[py_trees.behaviour.Behaviour]:
        self.feedback_message = message
        self._phase = "done"
        self.stop(status)
        yield self

    def terminate(self, new_status: Status) -> None:
        if new_status is not Status.INVALID:
            return
        if self._phase in ("pausing", "running"):
            if self._pause is not None:
                self._pause.halt()
            if self._pause is not None and self._pause.future is not None:
                self.client.call_async("resume")   # fire and forget: never block the tick
                self.feedback_message = "interrupted: resume sent"
        elif self._phase == "resuming" and self._resume is not None:
            self._resume.halt()



__all__ = ["GoalBehaviour", "Generate", "InputsFresh", "IsPolicyPaused", "PolicyPaused", "RunPolicy",
           "ServiceBehaviour", "StatusCondition", "verb_behaviour", *VERB_BEHAVIOURS]
