"""Deadlines for tests that wait on a condition: generous, and scaled by how busy the machine is.

Why: a fixed 30 s wait for DDS discovery and a few messages passed on an idle machine and
failed with five other jobs on two cores (issue #20). A test must not depend on how busy
the machine is, so every condition wait here runs until ``base_s`` times the machine's
load factor has passed: the 1-minute load average per CPU (at least 1), measured while
waiting, so a machine that gets busier mid-wait extends the deadline too.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

#: The base deadline for "the node reacts": discovery plus a few messages on an idle machine
#: take well under a second; 60 s is generous before any scaling.
BASE_S = 60.0


def load_factor() -> float:
    """Runnable tasks per CPU over the last minute, at least 1 (how much slower than idle we run)."""
    try:
        load = os.getloadavg()[0]
    except OSError:          # not available on this platform: assume an idle machine
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scaled(base_s: float = BASE_S) -> float:
    """``base_s`` scaled by the current ``load_factor()``."""
    return base_s * load_factor()


def wait_until(cond: Callable[[], Any], timeout: float = BASE_S, what: str = "condition",
               poll_s: float = 0.02) -> Any:
    """Poll ``cond`` until truthy (returns its value); fail after ``timeout`` x the load factor."""
    start = time.monotonic()
    factor = load_factor()
    while True:
        value = cond()
        if value:
            return value
        elapsed = time.monotonic() - start
        factor = max(factor, load_factor())
        if elapsed > timeout * factor:
            raise AssertionError(f"timed out after {elapsed:.0f} s ({timeout:g} s x load factor "
                                 f"{factor:.1f}) waiting for {what}")
        time.sleep(poll_s)
