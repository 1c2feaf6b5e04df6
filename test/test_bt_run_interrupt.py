"""``flashrt bt run`` takes Ctrl-C only between spin slices, never inside rclpy.

Found in a fresh-clone run under two busy loops: the SIGINT landed while rclpy was
converting a RunPolicy feedback message, the KeyboardInterrupt became a TypeError
("Unable to convert function return value"), and the CLI exited 1 instead of halting
the tree and exiting 130. Here a SIGINT is sent from inside an executor slice, the
place it landed, deterministically; no flashrt node is needed (the tree only sleeps).
"""
from __future__ import annotations

import io
import os
import signal

import pytest

pytest.importorskip("behaviortreepy", reason="behaviortreepy has wheels for x86_64 Linux only")
pytest.importorskip("rclpy")


def test_ctrl_c_inside_a_spin_slice_lets_the_slice_finish_then_halts_the_tree(tmp_path, monkeypatch):
    import rclpy.executors

    from flashrt_ros.bt import run as bt_run

    tree = tmp_path / "sleeps.xml"
    tree.write_text('<root BTCPP_format="4"><BehaviorTree ID="S"><Sleep msec="600000"/></BehaviorTree></root>')
    slices = {"count": 0, "finished_after_sigint": 0}

    class SigintInsideASlice(rclpy.executors.SingleThreadedExecutor):
        def spin_once(self, timeout_sec: float | None = None) -> None:
            slices["count"] += 1
            if slices["count"] == 5:                 # a few slices into ticking
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, as a real Ctrl-C would
                slices["finished_after_sigint"] += 1
            super().spin_once(timeout_sec=timeout_sec)

    monkeypatch.setattr(rclpy.executors, "SingleThreadedExecutor", SigintInsideASlice)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal
    out = io.StringIO()
    try:
        code = bt_run.run_tree(str(tree), node="/nobody_here/flashrt", wait_s=0.0, out=out)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == bt_run.EXIT_INTERRUPTED, out.getvalue()
    assert slices["finished_after_sigint"] == 1, "the KeyboardInterrupt was raised inside the executor's slice"
    assert "interrupted: tree halted" in out.getvalue()
