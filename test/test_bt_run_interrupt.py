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


# --- Ctrl-C waits until the cancelled goals have ended ---------------------------------------------
# Found in a fresh-clone run on an idle machine: bt run gave the cancel a fixed second and exited;
# the node ended the cancelled goal later (at its next boundary), so the next tree's RunPolicy was
# refused BUSY. BT.CPP's halt is synchronous, and so is ours now: bt run exits once every cancelled
# goal has reported its result. A stand-in node (held_cancel_server.py) ends the goal only when told.

@pytest.fixture
def held_node(tmp_path):
    from rosproc import start_python, stop, wait_for_text
    markers = tmp_path / "markers"
    markers.mkdir()
    log = tmp_path / "server.log"
    server = start_python(["test/held_cancel_server.py", str(markers)], log)
    try:
        assert wait_for_text(log, "held cancel server ready", 60, server), log.read_text()
        yield markers
    finally:
        (markers / "release").touch()
        stop(server)


def _start_tree(tmp_path):
    from rosproc import start_python, with_ctrl_c
    tree = tmp_path / "run.xml"
    tree.write_text('<root BTCPP_format="4"><BehaviorTree ID="R"><RunPolicy max_steps="100000"/>'
                    '</BehaviorTree></root>')
    log = tmp_path / "bt_run.log"
    return start_python(with_ctrl_c("flashrt_ros.cli", "--node", "/held/flashrt", "bt", "run", str(tree)), log), log


def test_ctrl_c_exits_only_after_the_cancelled_goal_has_ended(tmp_path, held_node):
    import subprocess

    from rosproc import stop
    from waiting import wait_until
    proc, log = _start_tree(tmp_path)
    try:
        wait_until(lambda: (held_node / "accepted").exists(), 90, "the tree's RunPolicy goal to be accepted")
        os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: (held_node / "cancel_requested").exists(), 60, "the cancel to reach the node")
        try:        # a window to see an early exit in (the old code exited 1 s after the halt)
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        exited_before_the_goal_ended = proc.poll() is not None
        (held_node / "release").touch()
        assert not exited_before_the_goal_ended, "bt run exited while the cancelled goal still ran:\n" + log.read_text()
        assert proc.wait(60) == 130, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert (held_node / "result_sent").exists()
    assert "waiting for 1 cancelled goal to end" in text, text
    assert "interrupted: tree halted, every cancelled goal ended" in text, text
    assert "Traceback" not in text, text


def test_a_second_ctrl_c_stops_waiting_for_the_cancelled_goal(tmp_path, held_node):
    from rosproc import stop
    from waiting import wait_until
    proc, log = _start_tree(tmp_path)
    try:
        wait_until(lambda: (held_node / "accepted").exists(), 90, "the tree's RunPolicy goal to be accepted")
        os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: "waiting for 1 cancelled goal to end" in log.read_text(), 60, "bt run to wait")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert not (held_node / "result_sent").exists(), "the goal was never released: it cannot have ended"
    assert "stopped waiting: 1 cancelled goal had not ended (the node may still be running it)" in text, text
    assert "Traceback" not in text, text
