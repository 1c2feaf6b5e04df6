"""The client's core: errors, the owner's name, and waiting on the client's node.

Why apart: every request the client makes (a service call, a goal, a parameter
read) waits the same way: bounded, spinning the client's node itself when
nothing else spins it, and raising Ctrl-C (and SIGTERM) only at safe points
between spin slices, never inside rclpy.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator

from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.task import Future

from flashrt_ros.interface.errors import ErrorCode

TIMEOUT_CODE = int(ErrorCode.TIMEOUT)
NODE_GONE_CODE = int(ErrorCode.NODE_GONE)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised at a safe point like Ctrl-C (``sigint_at_safe_points``): the same
    orderly stop (running goals cancelled first), exit status 143 instead of 130."""


def default_owner(node: Node) -> str:
    """``'<node name> (pid N on HOST)'``: who sent a goal, as a refused goal's message names it."""
    return f"{node.get_name()} (pid {os.getpid()} on {socket.gethostname()})"


class ServiceCallError(RuntimeError):
    """A call that did not succeed; ``error_code`` is the response's (or TIMEOUT)."""

    def __init__(self, message: str, error_code: int = 0, response: Any = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.response = response


class OutputClosed(KeyboardInterrupt):
    """The reader of our output went away (``flashrt run-policy | head``): the same orderly stop as Ctrl-C
    (a running goal is cancelled first), then a quiet exit (``request_stop``)."""


class NodeGone(ServiceCallError):
    """The node died, froze or restarted while a call waited (``NODE_GONE``; ``client.node_watch``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (NODE_GONE)", NODE_GONE_CODE)


class ClientCore:
    """One client of one flashrt node: its ROS node, the node's namespace, who it is, its waits."""

    def __init__(self, node: Node, namespace: str, owner: str = "") -> None:
        self.node = node
        self.namespace = namespace.rstrip("/") or ""
        self.owner = owner or default_owner(node)
        self._watch: Any = None                      # client.node_watch.NodeWatch, made on first use
        # Spin the node ourselves only if no executor owns it when we first wait.
        self._own_executor: Any = None
        self._decided = False
        self._signal_pending: int | None = None     # see sigint_at_safe_points

    # --- Ctrl-C ---------------------------------------------------------
    @contextlib.contextmanager
    def sigint_at_safe_points(self) -> Iterator[None]:
        """Ctrl-C (and SIGTERM) as a KeyboardInterrupt raised only by our own waits, between spin slices.

        Python raises it wherever the main thread is, rclpy's executor and action
        client included: landing there it can leave a task half-run or a request
        half-registered, and the cancel that follows the interrupt could then
        wait for good. Here the signal only marks it; a second signal before the
        next slice raises at once (for a stuck wait). SIGTERM takes the same
        orderly path (running goals are cancelled first) and raises ``Terminated``,
        so a CLI killed by a supervisor or ``timeout`` leaves no goal behind.
        Main thread only (signal handlers live there). A signal the process was
        started with ignored (a job started with ``&`` without job control) stays
        ignored, as Python itself leaves it.
        """
        def on_signal(signum: int, frame: Any) -> None:
            if self._signal_pending is not None:
                raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
            self._signal_pending = signum

        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, on_signal)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._signal_pending = None

    def request_stop(self) -> None:
        """From a callback (a feedback printer whose pipe closed): stop at the next safe point, as Ctrl-C does,
        raising ``OutputClosed``."""
        self._signal_pending = signal.SIGPIPE

    def raise_if_interrupted(self) -> None:
        """Raise the KeyboardInterrupt (``Terminated`` for SIGTERM, ``OutputClosed`` after ``request_stop``)
        that ``sigint_at_safe_points`` deferred, if any: a safe point."""
        signum, self._signal_pending = self._signal_pending, None
        if signum is not None:
            raise {signal.SIGTERM: Terminated, signal.SIGPIPE: OutputClosed}.get(signum, KeyboardInterrupt)

    # --- the node's life -------------------------------------------------
    @property
    def node_watch(self) -> Any:
        """The node's heartbeat as this client hears it (``client.node_watch.NodeWatch``)."""
        if self._watch is None:
            from flashrt_ros.client.node_watch import NodeWatch
            self._watch = NodeWatch(self.node, self.namespace)
        return self._watch

    def node_active(self) -> bool | None:
        """Whether the node's latest heartbeat says it is active; None while none was heard."""
        heard = self.node_watch.heard()
        return None if heard.at is None else heard.lifecycle_state == "active"

    def wait_node_active(self, wait_s: float, what: str) -> None:
        """Before sending ``what`` (a goal): wait, within ``wait_s``, for the node's heartbeat and its activation
        (a node still configuring would refuse it). Raises ``ServiceCallError`` NOT_ACTIVE naming the state the
        node stayed in. A node never heard within ``wait_s`` (one that does not beat) is left to the call's own
        bounded wait."""
        if self._wait_until(lambda: self.node_active() is True, wait_s):
            return
        heard = self.node_watch.heard()
        if heard.at is not None and heard.lifecycle_state != "active":
            raise ServiceCallError(f"{what}: node {self.namespace} is {heard.lifecycle_state or 'starting'}, not "
                                   f"active, after waiting {wait_s:g} s (configure and activate it: flashrt serve "
                                   "does both; or give the command a longer --timeout)", int(ErrorCode.NOT_ACTIVE))

    def raise_if_node_gone(self, instance_id: str = "") -> None:
        """Raise ``NodeGone`` when the node stopped beating or restarted since ``instance_id`` (``NodeWatch.gone``)."""
        why = self.node_watch.gone(instance_id)
        if why:
            raise NodeGone(why)

    # --- waiting ----------------------------------------------------------
    def _wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``condition`` (spinning our node if we own its executor) until true or timeout."""
        self._decide_executor()
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            self.raise_if_interrupted()
            if self._own_executor is not None:
                self._own_executor.spin_once(timeout_sec=0.05)
            else:
                time.sleep(0.01)
        self.raise_if_interrupted()
        return condition()

    def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Spin (if we own the executor) until ``condition()`` or the timeout; e.g. for watch_status."""
        return self._wait_until(condition, timeout_s)

    def close(self) -> None:
        """Shut down the executor this client made for itself, if any; call before destroying the node.

        Why: teardown in the order rclpy expects (executor, then node, then context), as
        ``flashrt bt run`` does, instead of leaving the executor to the garbage collector."""
        if self._own_executor is not None:
            self._own_executor.shutdown()
            self._own_executor = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _decide_executor(self) -> None:
        """On the first wait: spin our node ourselves unless an executor already owns it."""
        if not self._decided:
            self._decided = True
            if self.node.executor is None:
                self._own_executor = SingleThreadedExecutor()
                self._own_executor.add_node(self.node)

    def _wait(self, future: Future, timeout_s: float, instance_id: str | None = None) -> Any:
        """Wait for a future whether or not another thread spins our node (``instance_id``: see ``_wait_any``)."""
        self._wait_any([future], timeout_s, instance_id)
        return future.result() if future.done() else None

    def _wait_any(self, futures: list[Future], timeout_s: float, instance_id: str | None = None) -> None:
        """Wait until one of ``futures`` is done or ``timeout_s`` passed (spinning our node if we own it).
        ``instance_id`` (not None): end the wait with ``NodeGone`` once the node stops beating or restarts
        since that instance ("": any instance; silence only)."""
        self._decide_executor()
        deadline = time.monotonic() + timeout_s

        def check() -> None:
            self.raise_if_interrupted()
            if instance_id is not None:
                self.raise_if_node_gone(instance_id)
        if self._own_executor is not None:
            # Short slices: a KeyboardInterrupt is raised between them, not after timeout_s.
            while not any(f.done() for f in futures) and (left := deadline - time.monotonic()) > 0:
                check()
                self._own_executor.spin_once(timeout_sec=min(left, 0.05))
        else:
            done = threading.Event()
            for f in futures:
                f.add_done_callback(lambda _f: done.set())
            while not done.is_set() and (left := deadline - time.monotonic()) > 0:
                check()
                done.wait(min(left, 0.05))
        self.raise_if_interrupted()
