"""A stand-in policy node whose cancelled RunPolicy goal ends only when the test says so.

Used by test_bt_run_interrupt.py: a real node ends a cancelled goal at its next committed
boundary, after any rollback, which on a busy machine can take longer than a client expects.
Here that moment is the test's choice, so what ``flashrt bt run`` does before it is seen
deterministically. Markers in DIR: ``accepted``, ``cancel_requested``, ``result_sent``; the
test creates ``release`` to let the cancelled goal end.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import rclpy
from rclpy.action import ActionServer, CancelResponse
from rclpy.callback_groups import ReentrantCallbackGroup

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.ros.spinning import serve_until_interrupted
from flashrt_ros.srv import ListCapsules

NAMESPACE = "/held/flashrt"


def main(markers: Path) -> None:
    def run_policy(goal_handle):
        (markers / "accepted").touch()
        while not goal_handle.is_cancel_requested:
            time.sleep(0.02)
        (markers / "cancel_requested").touch()
        while not (markers / "release").exists():
            time.sleep(0.02)
        goal_handle.canceled()
        (markers / "result_sent").touch()
        return RunPolicy.Result(success=True, stop_reason="cancelled", message="cancelled when released")

    def generate(goal_handle):
        goal_handle.abort()
        return Generate.Result(success=False, message="not a language model")

    rclpy.init()
    node = rclpy.create_node("held_cancel_server")
    group = ReentrantCallbackGroup()
    # list and generate only so that bt run finds a whole flashrt node and starts at once
    node.create_service(ListCapsules, f"{NAMESPACE}/list", lambda _req, resp: resp, callback_group=group)
    ActionServer(node, Generate, f"{NAMESPACE}/generate", execute_callback=generate, callback_group=group)
    ActionServer(node, RunPolicy, f"{NAMESPACE}/run_policy", execute_callback=run_policy,
                 cancel_callback=lambda _goal: CancelResponse.ACCEPT, callback_group=group)
    print("held cancel server ready", flush=True)
    serve_until_interrupted(node, num_threads=4, on_exit=(markers / "release").touch)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
