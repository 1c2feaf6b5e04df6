"""py_trees behaviours for a flashrt node: capsule verbs, generation, a pause guard.

Why these rules:
* **Never block the tick.** A tree ticks at control rate; a behaviour that
  waits on a service stalls every other branch. So each behaviour sends its
  request on the first tick and only polls the rclpy future on later ticks.
* **Check ``success`` yourself.** A service that answered is not a service that
  succeeded (py_trees_ros reports SUCCESS for any response). ``success=false``
  becomes FAILURE with the node's message (and error code) as
  ``feedback_message``; so do an absent server and a timeout.
* **A lost reply is not a hang.** DDS can lose a service reply for good
  (ros2/ros2#1253). Every behaviour has a deadline and then fails with
  ``TIMEOUT`` in its feedback; a request that is safe to repeat
  (``flashrt_ros.client.retry_safe``: list, verify, pin, unpin, save, pause,
  resume, restore, reset, snapshot with overwrite) is re-sent while it waits
  (2 s, 6 s, 14 s after the first), and the first reply to any copy counts.
  A Generate goal is never re-sent; if its acceptance never arrives it is
  cancelled by its goal id, and a result lost after the goal ended is asked
  for again.
* **Interruption is cheap and explicit.** When a higher-priority branch
  interrupts a behaviour, its pending service future is abandoned (a request
  already delivered may still be applied: services cannot be recalled) and a
  running generation goal is cancelled.

The futures complete only if someone spins the client's node: run the tree
next to an executor (a spin thread, or ``executor.spin_once(timeout_sec=0)``
between ticks) as ``examples/`` shows.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import py_trees
from py_trees.common import Status

from flashrt_ros.client import RESULT_GRACE_S, resend_times, retry_safe
from flashrt_ros.runtime.errors import ErrorCode

#: Capsule services answer in milliseconds, but one waits up to the node's boundary_timeout_s
#: (5 s by default) for a boundary, and a loaded machine adds its own delays: a deadline of a
#: few seconds failed healthy trees. Retry-safe requests are re-sent meanwhile (see above).
DEFAULT_TIMEOUT_S = 15.0


def _describe_failure(verb: str, response: Any) -> str:
    code = getattr(response, "error_code", None)
    try:
        tag = f" ({ErrorCode(code).name})" if code else ""
    except ValueError:
        tag = f" (error {code})"
    return f"{verb} failed{tag}: {response.message}"


class ServiceCall:
    """One service request in flight: sent by the first ``poll()``, never waited on."""

    def __init__(self, client: Any, verb: str, fields: dict[str, Any], timeout_s: float) -> None:
        self.client, self.verb, self.fields, self.timeout_s = client, verb, fields, timeout_s
        self.futures: list[Any] = []
        self.sent_at: float | None = None
        self.deadline: float | None = None
        self.response: Any = None
        self.message = ""
        self._resends = resend_times(timeout_s) if retry_safe(verb, fields) else []

    @property
    def future(self) -> Any:
        """The first request's future (None before it is sent)."""
        return self.futures[0] if self.futures else None

    def poll(self) -> Status:
        """RUNNING while pending; SUCCESS/FAILURE once answered, refused or timed out."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
        if not self.futures:
            if not self.client.wait_for(self.verb, 0.0):      # timeout 0: a readiness check, no sleep
                if now < self.deadline:
                    return Status.RUNNING
                self.message = f"{self.verb}: service not available within {self.timeout_s:g} s"
                return Status.FAILURE
            self.futures.append(self.client.call_async(self.verb, **self.fields))
            self.sent_at = now
        answered = next((f for f in self.futures if f.done() and not f.cancelled()), None)
        if answered is not None:
            self._forget_others(answered)
            return self._outcome(answered)
        if all(f.cancelled() for f in self.futures):   # an rclpy future that was cancelled never becomes done
            self.message = f"{self.verb}: request cancelled"
            return Status.FAILURE
        if now >= self.deadline:
            self.abandon()
            sent = f", sent {len(self.futures)} times" if len(self.futures) > 1 else ""
            self.message = f"{self.verb}: no response within {self.timeout_s:g} s (error TIMEOUT{sent})"
            return Status.FAILURE
        if self._resends and now - self.sent_at >= self._resends[0]:
            self._resends.pop(0)                       # a lost reply: send the same request again
            self.futures.append(self.client.call_async(self.verb, **self.fields))
        return Status.RUNNING

    def abandon(self) -> None:
        """Stop waiting for the response (the server may still apply the request)."""
        self._forget_others(None)

    def _forget_others(self, keep: Any) -> None:
        for f in self.futures:
            if f is not keep and not f.done():
                f.cancel()
                _forget_pending(self.client, self.verb, f)

    @property
    def pending(self) -> bool:
        return any(not f.done() and not f.cancelled() for f in self.futures)

    def _outcome(self, future: Any) -> Status:
        exc = future.exception()
        if exc is not None:
            self.message = f"{self.verb}: {type(exc).__name__}: {exc}"
            return Status.FAILURE
        self.response = future.result()
        if self.response is None:
            self.message = f"{self.verb}: empty response"
            return Status.FAILURE
        if not self.response.success:
            self.message = _describe_failure(self.verb, self.response)
            return Status.FAILURE
        self.message = self.response.message
        return Status.SUCCESS


def _forget_pending(client: Any, verb: str, future: Any) -> None:
    """Drop an abandoned request from the rclpy client's pending table (else it leaks)."""
    forget = getattr(client, "forget", None)      # test doubles may not have it
    if forget is not None:
        forget(verb, future)


class ServiceBehaviour(py_trees.behaviour.Behaviour):
    """Base: call ``verb`` with ``request_fields()``; the response is kept in ``self.response``."""

    verb: str = ""

    def __init__(self, name: str, client: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name)
        self.client, self.timeout_s = client, timeout_s
        self.call: ServiceCall | None = None
        self.response: Any = None

    def request_fields(self) -> dict[str, Any]:
        """The request's fields, read when the request is sent (override to read a blackboard)."""
        return {}

    def initialise(self) -> None:
        self.call, self.response = None, None

    def update(self) -> Status:
        if self.call is None:
            self.call = ServiceCall(self.client, self.verb, self.request_fields(), self.timeout_s)
        status = self.call.poll()
        if status is Status.RUNNING:
            self.feedback_message = f"waiting for {self.verb}"
        else:
            self.response = self.call.response
            self.feedback_message = self.call.message
        return status

    def terminate(self, new_status: Status) -> None:
        if new_status is Status.INVALID and self.call is not None and self.call.pending:
            self.call.abandon()
            self.feedback_message = f"{self.verb}: interrupted, response abandoned"


class Snapshot(ServiceBehaviour):
    """Take capsule ``capsule`` of the node's state at its next boundary."""

    verb = "snapshot"

    def __init__(self, name: str, client: Any, capsule: str, *, tier: str = "", session: str = "",
                 pin: bool = False, overwrite: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name, client, timeout_s=timeout_s)
        self.fields = dict(name=capsule, tier=tier, session=session, pin=pin, overwrite=overwrite)

    def request_fields(self) -> dict[str, Any]:
        return dict(self.fields)


class Restore(ServiceBehaviour):
    """Restore capsule ``capsule`` into the live state (optionally re-hashing it first)."""

    verb = "restore"

    def __init__(self, name: str, client: Any, capsule: str, *, verify: bool = False,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name, client, timeout_s=timeout_s)
        self.fields = dict(name=capsule, verify=verify)

    def request_fields(self) -> dict[str, Any]:
        return dict(self.fields)


class Fork(ServiceBehaviour):
    """Copy capsule ``source`` to an independent capsule ``new_name``."""

    verb = "fork"

    def __init__(self, name: str, client: Any, source: str, new_name: str, *, tier: str = "",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name, client, timeout_s=timeout_s)
        self.fields = dict(source=source, name=new_name, tier=tier)

    def request_fields(self) -> dict[str, Any]:
        return dict(self.fields)


class Rollback(ServiceBehaviour):
    """Undo the last ``steps`` committed boundaries."""

    verb = "rollback"

    def __init__(self, name: str, client: Any, steps: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name, client, timeout_s=timeout_s)
        self.steps = steps

    def request_fields(self) -> dict[str, Any]:
        return {"steps": int(self.steps)}


class PausePolicy(ServiceBehaviour):
    """Stop the policy loop at a boundary; its state stays exactly where it was."""

    verb = "pause"


class ResumePolicy(ServiceBehaviour):
    """Restart the policy loop."""

    verb = "resume"


class Generate(py_trees.behaviour.Behaviour):
    """Run one generation goal; SUCCESS with ``self.result`` when ``result.success``.

    Sends the goal on the first tick (once the action server is ready), then
    polls the goal and result futures. FAILURE on rejection, ``success=false``,
    an absent server or ``timeout_s``; on timeout or interruption the goal is
    cancelled. Feedback pieces are appended to ``self.pieces``.
    """

    def __init__(self, name: str, client: Any, prompt: str, *, timeout_s: float = 60.0,
                 **goal_fields: Any) -> None:
        super().__init__(name)
        self.client, self.prompt, self.timeout_s, self.goal_fields = client, prompt, timeout_s, goal_fields
        self._reset()

    def _reset(self) -> None:
        self.goal_future: Any = None
        self.goal_id: Any = None
        self.handle: Any = None
        self.result_future: Any = None
        self.result_futures: list[Any] = []
        self.ended_at: float | None = None
        self.result: Any = None
        self.pieces: list[str] = []
        self.deadline: float | None = None

    def initialise(self) -> None:
        self._reset()

    def update(self) -> Status:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
        if self.goal_future is None:
            if not _generate_ready(self.client):
                return self._running_or_timeout(now, "generate: action server not available")
            self.goal_future = self.client.generate_async(
                self.prompt, feedback=lambda fb: self.pieces.append(fb.text_piece), **self.goal_fields)
            sent_goal_id = getattr(self.client, "sent_goal_id", None)      # test doubles may lack it
            self.goal_id = sent_goal_id(self.goal_future) if sent_goal_id is not None else None
        if self.handle is None:
            if not self.goal_future.done():
                return self._running_or_timeout(now, "generate: goal not answered")
            self.handle = self.goal_future.result()
            if self.handle is None or not self.handle.accepted:
                self.feedback_message = "generate: goal rejected (another generation running, or node inactive)"
                return Status.FAILURE
            self.result_future = self.handle.get_result_async()
            self.result_futures = [self.result_future]
        answered = next((f for f in self.result_futures if f.done()), None)
        if answered is None:
            # a lost result reply: once the goal's status says it ended, ask again (read-only)
            if self.ended_at is None and getattr(self.handle, "status", 0) in _TERMINAL:
                self.ended_at = now
            if self.ended_at is not None and now - self.ended_at >= RESULT_GRACE_S:
                self.result_futures.append(self.handle.get_result_async())
                self.ended_at = now
            self.feedback_message = f"generating: {len(self.pieces)} tokens"
            return self._running_or_timeout(now, "generate: no result")
        self.result_future = answered
        self.result = answered.result().result
        if not self.result.success:
            self.feedback_message = _describe_failure("generate", self.result)
            return Status.FAILURE
        self.feedback_message = f"generated {len(self.result.token_ids)} tokens ({self.result.stop_reason})"
        return Status.SUCCESS

    def _running_or_timeout(self, now: float, what: str) -> Status:
        if now < self.deadline:
            return Status.RUNNING
        self._cancel()
        self.feedback_message = f"{what} within {self.timeout_s:g} s (error TIMEOUT)"
        return Status.FAILURE

    def _cancel(self) -> None:
        if self.handle is not None and self.result_future is not None and not self.result_future.done():
            self.handle.cancel_goal_async()
        elif self.goal_future is not None and not self.goal_future.done():
            # its acceptance never arrived: the goal may be running all the same, cancel it by id
            self.goal_future.cancel()
            if self.goal_id is not None:
                self.client.cancel_goal_id(self.goal_id)

    def terminate(self, new_status: Status) -> None:
        if new_status is Status.INVALID:
            self._cancel()


_TERMINAL = (4, 5, 6)     # action_msgs/GoalStatus SUCCEEDED, CANCELED, ABORTED


def _generate_ready(client: Any) -> bool:
    """Non-blocking readiness of the generate action (``generate_async`` itself may wait)."""
    return bool(client.generate_ready())


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
        self._pause: ServiceCall | None = None
        self._resume: ServiceCall | None = None
        self._child_status = Status.INVALID

    def initialise(self) -> None:
        self._phase, self._child_status = "pausing", Status.INVALID
        self._pause = ServiceCall(self.client, "pause", {}, self.timeout_s)
        self._resume = None

    def tick(self) -> Iterator[py_trees.behaviour.Behaviour]:
        if self.status != Status.RUNNING:
            self.initialise()
        if self._phase == "pausing":
            status = self._pause.poll()
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
                self._resume = ServiceCall(self.client, "resume", {}, self.timeout_s)
        if self._phase == "resuming":
            status = self._resume.poll()
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
                self._pause.abandon()
            if self._pause is not None and self._pause.future is not None:
                self.client.call_async("resume")   # fire and forget: never block the tick
                self.feedback_message = "interrupted: resume sent"
        elif self._phase == "resuming" and self._resume is not None:
            self._resume.abandon()

