"""The serving loops of a process that hosts a node: the flashrt node's, and a small server's.

``spin_until_shutdown`` is the flashrt node's executor loop (it outlives any exception a callback
lets escape); ``serve_until_interrupted`` serves one small node (the simulator, test servers)
until Ctrl-C or an rclpy shutdown. A client spins its node with
``flashrt_ros.client.background_executor.BackgroundExecutor`` instead.
"""
from __future__ import annotations

import threading
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
