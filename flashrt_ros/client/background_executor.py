"""An executor spinning in a background thread that stops without leaving a callback behind.

Why: a script, a test or a supervisor that drives a flashrt node through ``FlashRTClient`` spins
its own node beside its main thread. Stopping a spinning ``MultiThreadedExecutor`` with
``executor.shutdown()`` from another thread races with the handlers it has already dispatched to
its thread pool: shutdown destroys the guard condition each handler triggers when it is done
(rclpy 9 skips its own wait for outstanding work there), so a handler still running ends with
``InvalidHandle`` and, since nobody looks at it any more, Python prints "The following
exception was never retrieved: cannot use Destroyable because destruction was requested"
at exit (the MuJoCo demo did; a 30-iteration loop reproduces it 2 to 6 times). ``stop()``
therefore stops spinning first, joins the thread, waits for the handlers already
dispatched, and only then shuts the executor down. Release engines and destroy nodes
after ``stop()``. A raising callback is logged and spinning goes on.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any

from rclpy.executors import ExternalShutdownException


class BackgroundExecutor:
    """``executor`` spun in a daemon thread until ``stop()``."""

    def __init__(self, executor: Any, *, slice_s: float = 0.1) -> None:
        self.executor = executor
        self._slice_s = slice_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True, name="flashrt-spin")
        self._thread.start()

    def _spin(self) -> None:
        while not self._stopping.is_set():
            try:
                self.executor.spin_once(timeout_sec=self._slice_s)
            except ExternalShutdownException:
                return
            except Exception as exc:  # noqa: BLE001 - one failed callback must not stop the others
                print(f"a callback raised {type(exc).__name__}: {exc}", file=sys.stderr)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop spinning, let dispatched callbacks finish, shut the executor down; False on timeout."""
        deadline = time.monotonic() + timeout_s
        self._stopping.set()
        self._thread.join(timeout_s)
        # rclpy's MultiThreadedExecutor keeps the handlers it dispatched to its pool here
        dispatched = list(getattr(self.executor, "_futures", ()))
        while not all(f.done() for f in dispatched) and time.monotonic() < deadline:
            time.sleep(0.005)
        finished = not self._thread.is_alive() and all(f.done() for f in dispatched)
        self.executor.shutdown()
        return finished
