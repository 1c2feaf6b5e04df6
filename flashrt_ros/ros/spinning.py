"""The serving loops of a process that hosts a node: the flashrt node's, and a small server's.

``spin_until_shutdown`` is the flashrt node's executor loop (it outlives any exception a callback
lets escape); ``serve_until_interrupted`` serves one small node (the simulator, test servers)
until Ctrl-C or an rclpy shutdown. Both end with ``finish_dispatched``: the handlers already in
the executor's pool finish before the executor goes. A client spins its node with
``flashrt_ros.client.background_executor.BackgroundExecutor`` instead (which waits alike).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node


def serve_until_interrupted(node: Node, *, num_threads: int,
                            on_exit: Callable[[], None] | None = None) -> None:
    """Spin ``node`` until Ctrl-C or an rclpy shutdown, then tear down executor, node, rclpy.

    ``on_exit`` runs first, while the node still exists (e.g. to release a handler that
    would otherwise keep the executor from shutting down).
    """
    executor = MultiThreadedExecutor(num_threads=num_threads)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if on_exit is not None:
            on_exit()
        finish_dispatched(executor, 5.0)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()


def spin_until_shutdown(executor: MultiThreadedExecutor, logger: Any,
                        stop: threading.Event | None = None) -> None:
    """``executor.spin()`` that outlives any exception a callback lets escape, until ``stop`` is set.

    rclpy re-raises a callback's exception from ``spin_once`` and ``spin()``
    would end with it, taking the node down; here it is logged and spinning
    goes on. Service callbacks never let one escape (errors become responses,
    and ``conversions.sendable`` replaces an unserializable response with an
    INTERNAL one), so this is the last line of defence, e.g. for timers.
    """
    while rclpy.ok() and not (stop is not None and stop.is_set()):
        try:
            executor.spin_once(timeout_sec=0.1)
        except ExternalShutdownException:
            return
        except Exception as exc:  # noqa: BLE001 - the node must keep serving
            logger.error(f"a callback raised {type(exc).__name__}: {str(exc)[:500]}; the node keeps serving")


def finish_dispatched(executor: Any, timeout_s: float, log: Callable[[str], None] | None = None) -> bool:
    """Wait (up to ``timeout_s``) for the handlers ``executor`` already dispatched to its thread pool;
    call only once nothing spins it any more. True when all finished.

    Why: rclpy 9's ``shutdown`` destroys the guard condition each handler triggers when it has taken
    its message, without waiting for the handlers still queued; such a handler then fails with
    ``InvalidHandle`` and, as nobody asks for its result any more, Python prints "The following
    exception was never retrieved: cannot use Destroyable because destruction was requested" (every
    node shutdown did: its control timer's handler was in the pool). A finished handler's exception is
    fetched here (and passed to ``log``), so none is left unretrieved either."""
    dispatched = list(getattr(executor, "_futures", ()))      # the MultiThreadedExecutor's handlers
    deadline = time.monotonic() + timeout_s
    while not all(f.done() for f in dispatched) and time.monotonic() < deadline:
        time.sleep(0.005)
    for future in dispatched:
        if future.done():
            exc = future.exception()                           # marks it retrieved
            if exc is not None and log is not None:
                log(f"a callback raised {type(exc).__name__}: {str(exc)[:500]}")
    return all(f.done() for f in dispatched)
