"""A small Python client for a running flashrt node (CLI, tests, behaviour trees).

Why one module: every caller needs the same things — wait for a service with a
timeout, retry while it is not yet available, turn ``success=false`` into a
clear error, and stream an action's feedback — so they live here once, in the
style of nav2_simple_commander. Two flavours:

- ``call_async(verb, **fields)`` returns an rclpy future (non-blocking; the
  behaviour trees poll it from their tick);
- ``call(verb, **fields)`` blocks until the response (it spins the client's
  own node when nothing else spins it) and raises ``ServiceCallError`` on
  failure responses, timeouts or an absent node.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.task import Future

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.ros.service_qos import FEEDBACK_QOS, SERVICE_QOS
from flashrt_ros.srv import (CloseSession, Drop, Fork, ListCapsules, Load, Pin, Restore, Rollback, Save,
                             Snapshot, SwitchSession, Unpin, Verify)
from std_srvs.srv import Trigger
from unique_identifier_msgs.msg import UUID

#: verb -> (service type, service name relative to the node's namespace)
SERVICES: dict[str, tuple[type, str]] = {
    "snapshot": (Snapshot, "snapshot"),
    "restore": (Restore, "restore"),
    "fork": (Fork, "fork"),
    "rollback": (Rollback, "rollback"),
    "drop": (Drop, "drop"),
    "list": (ListCapsules, "list"),
    "save": (Save, "save"),
    "load": (Load, "load"),
    "verify": (Verify, "verify"),
    "pin": (Pin, "pin"),
    "unpin": (Unpin, "unpin"),
    "close_session": (CloseSession, "close_session"),
    "switch_session": (SwitchSession, "switch_session"),
    "pause": (Trigger, "pause"),
    "resume": (Trigger, "resume"),
    "reset": (Trigger, "reset"),
}


class ServiceCallError(RuntimeError):
    """A call that did not succeed; ``error_code`` is the response's (or TIMEOUT)."""

    def __init__(self, message: str, error_code: int = 0, response: Any = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.response = response


@dataclass
class GenerateOutcome:
    result: Any            # Generate.Result (its ``text`` is always the whole generated text)
    accepted: bool
    status: int            # action_msgs/GoalStatus
    feedback_complete: bool = True   # every token's feedback arrived (False: some came late or never)


class FlashRTClient:
    """Typed access to one flashrt node's services and its generate action."""

    def __init__(self, node: Node, namespace: str = "/flashrt") -> None:
        self.node = node
        self.namespace = namespace.rstrip("/") or ""
        self._clients = {verb: node.create_client(srv, f"{self.namespace}/{name}", qos_profile=SERVICE_QOS)
                         for verb, (srv, name) in SERVICES.items()}
        self._generate = ActionClient(node, Generate, f"{self.namespace}/generate")
        self._run_policy = ActionClient(node, RunPolicy, f"{self.namespace}/run_policy")
        # Our own subscription to the action's feedback topic: rclpy's ActionClient drops a goal's
        # feedback callback as soon as its result arrives, and feedback travels on another topic,
        # so the last pieces can come after the result (and were silently lost).
        self._feedback_callbacks: dict[bytes, Callable[[Any], None]] = {}
        self._feedback_sub = node.create_subscription(
            Generate.Impl.FeedbackMessage, f"{self.namespace}/generate/_action/feedback",
            self._on_feedback, FEEDBACK_QOS)
        # Spin the node ourselves only if no executor owns it when we first wait.
        self._own_executor: Any = None
        self._decided = False

    # --- services -------------------------------------------------------
    def request(self, verb: str, **fields: Any) -> Any:
        srv_type, _ = SERVICES[verb]
        req = srv_type.Request()
        for key, value in fields.items():
            if not hasattr(req, key):
                raise ValueError(f"{verb}: unknown field {key!r}")
            setattr(req, key, value)
        return req

    def wait_for(self, verb: str, timeout_s: float) -> bool:
        return self._clients[verb].wait_for_service(timeout_sec=timeout_s)

    def forget(self, verb: str, future: Future) -> None:
        """Abandon a request sent with call_async (its answer, if any, is dropped)."""
        self._clients[verb].remove_pending_request(future)

    def generate_ready(self) -> bool:
        """Whether the generate action server is up (non-blocking)."""
        return bool(self._generate.server_is_ready())

    def call_async(self, verb: str, **fields: Any) -> Future:
        """Send without waiting; the caller polls ``future.done()``."""
        return self._clients[verb].call_async(self.request(verb, **fields))

    def call(self, verb: str, *, timeout_s: float = 10.0, wait_s: float = 10.0,
             check: bool = True, **fields: Any) -> Any:
        """Call and wait; raises ServiceCallError unless the response succeeded."""
        client = self._clients[verb]
        deadline = time.monotonic() + wait_s
        while not client.wait_for_service(timeout_sec=0.2):
            if time.monotonic() > deadline:
                raise ServiceCallError(
                    f"service {client.srv_name} not available after {wait_s:.1f} s "
                    "(is the node running and active, and on the same ROS_DOMAIN_ID?)", 13)
        future = client.call_async(self.request(verb, **fields))
        response = self._wait(future, timeout_s)
        if response is None:
            raise ServiceCallError(f"{client.srv_name}: no response within {timeout_s:.1f} s", 13)
        if check and not response.success:
            raise ServiceCallError(f"{verb} failed: {response.message}",
                                   getattr(response, "error_code", 0), response)
        return response

    # --- generate action ------------------------------------------------
    def generate_async(self, prompt: str, *, feedback: Callable[[Any], None] | None = None,
                       wait_s: float = 10.0, **fields: Any) -> Future:
        """Send a goal; the future resolves to a ClientGoalHandle."""
        goal = Generate.Goal()
        goal.prompt = prompt
        goal.top_p = 1.0
        for key, value in fields.items():
            if not hasattr(goal, key):
                raise ValueError(f"generate: unknown goal field {key!r}")
            setattr(goal, key, value)
        if not self._generate.wait_for_server(timeout_sec=wait_s):
            raise ServiceCallError(
                f"action {self.namespace}/generate not available after {wait_s:.1f} s", 13)
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        if feedback is not None:
            self._feedback_callbacks[bytes(goal_id.uuid)] = feedback
        return self._generate.send_goal_async(goal, goal_uuid=goal_id)

    def run_policy_ready(self) -> bool:
        """Whether the run_policy action server is up (non-blocking)."""
        return bool(self._run_policy.server_is_ready())

    def run_policy_async(self, *, feedback: Callable[[Any], None] | None = None, **fields: Any) -> Future:
        """Send a RunPolicy goal without waiting (check ``run_policy_ready`` first); resolves to a goal handle."""
        goal = RunPolicy.Goal()
        for key, value in fields.items():
            if not hasattr(goal, key):
                raise ValueError(f"run_policy: unknown goal field {key!r}")
            setattr(goal, key, value)
        return self._run_policy.send_goal_async(goal, feedback_callback=(
            None if feedback is None else lambda msg: feedback(msg.feedback)))

    def forget_feedback(self, handle: Any) -> None:
        """Stop delivering feedback of a finished goal (its late pieces are then dropped)."""
        self._feedback_callbacks.pop(bytes(handle.goal_id.uuid), None)

    def _on_feedback(self, msg: Any) -> None:
        callback = self._feedback_callbacks.get(bytes(msg.goal_id.uuid))
        if callback is not None:
            callback(msg.feedback)

    def generate(self, prompt: str, *, timeout_s: float = 600.0, wait_s: float = 10.0,
                 feedback: Callable[[Any], None] | None = None, feedback_grace_s: float = 5.0,
                 **fields: Any) -> GenerateOutcome:
        """Run one goal to its result; on KeyboardInterrupt cancel it first (see _cancel).

        Feedback and result travel on different topics, so the last feedback
        can arrive after the result. Once the result is in, this waits up to
        ``feedback_grace_s`` for the feedback of every token it reports
        (``feedback_complete`` says whether all came); ``result.text`` is the
        whole text in any case, so a caller that printed pieces can print the rest.
        """
        received: set[int] = set()

        def on_feedback(fb: Any) -> None:
            if int(fb.index) in received:
                return
            received.add(int(fb.index))
            if feedback is not None:
                feedback(fb)

        handle = self._wait(self.generate_async(prompt, feedback=on_feedback, wait_s=wait_s,
                                                **fields), wait_s)
        if handle is None:
            raise ServiceCallError("generate: no answer to the goal request", 13)
        if not handle.accepted:
            return GenerateOutcome(result=None, accepted=False, status=0)
        try:
            wrapped = self._wait(handle.get_result_async(), timeout_s)
        except KeyboardInterrupt as interrupt:
            interrupt.result = self._cancel(handle, wait_s)
            raise
        if wrapped is None:
            handle.cancel_goal_async()
            raise ServiceCallError(f"generate: no result within {timeout_s:.0f} s", 13)
        expected = len(wrapped.result.token_ids)
        complete = self._wait_until(lambda: len(received) >= expected, feedback_grace_s)
        self.forget_feedback(handle)
        return GenerateOutcome(result=wrapped.result, accepted=True, status=wrapped.status,
                               feedback_complete=complete)

    def _cancel(self, handle: Any, wait_s: float) -> Any:
        """Cancel a goal and return its final result (the node stops at a committed boundary)."""
        if self._wait(handle.cancel_goal_async(), wait_s) is None:
            return None
        wrapped = self._wait(handle.get_result_async(), wait_s)
        return wrapped.result if wrapped is not None else None

    # --- plumbing -------------------------------------------------------
    def _wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``condition`` (spinning our node if we own its executor) until true or timeout."""
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            if self._own_executor is not None:
                self._own_executor.spin_once(timeout_sec=0.05)
            else:
                time.sleep(0.01)
        return condition()

    def _wait(self, future: Future, timeout_s: float) -> Any:
        """Wait for a future whether or not another thread spins our node."""
        if not self._decided:
            self._decided = True
            if self.node.executor is None:
                self._own_executor = SingleThreadedExecutor()
                self._own_executor.add_node(self.node)
        if self._own_executor is not None:
            # Short slices: a KeyboardInterrupt is raised between them, not after timeout_s.
            deadline = time.monotonic() + timeout_s
            while not future.done() and (left := deadline - time.monotonic()) > 0:
                self._own_executor.spin_until_future_complete(future, timeout_sec=min(left, 0.2))
        else:
            done = threading.Event()
            future.add_done_callback(lambda _f: done.set())
            done.wait(timeout_s)
        return future.result() if future.done() else None
