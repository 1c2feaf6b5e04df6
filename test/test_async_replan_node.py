"""``replan: async`` through ROS: a policy node plans beside its loop, reports it, and refuses it where it cannot.

The shipped trained ACT (state + target in, two joint commands out) on Float32MultiArray topics fed
by this test, RunPolicy goals, the node's /diagnostics.
"""
from __future__ import annotations

import threading

import pytest

from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from rosproc import NodeUnderTest, stop
from waiting import wait_until


def _params(mode: str) -> dict[str, str]:
    from flashrt_ros.sim.arm_policy import TRAINED
    return {"engine_kind": "policy", "policy": f"lerobot:{TRAINED['act']}", "device": "cpu", "run_mode": "goal",
            "input_environment_state_topic": "~/target", "qos_deadline_factor": "0.0", "control_rate_hz": "50.0",
            "max_observation_age_s": "1.0", "replan": mode, "replan_delay_steps": "3"}


class Feed:
    """State and target at 100 Hz from a thread (the policy's inputs stay fresh)."""

    def __init__(self, ros, namespace: str) -> None:
        from std_msgs.msg import Float32MultiArray
        self._state = ros.create_publisher(Float32MultiArray, f"{namespace}/flashrt/observation", 10)
        self._target = ros.create_publisher(Float32MultiArray, f"{namespace}/flashrt/target", 10)
        self._stop = threading.Event()
        msg_s, msg_t = Float32MultiArray(data=[0.3, -0.4, 0.0, 0.0]), Float32MultiArray(data=[0.12, 0.1])
        self._thread = threading.Thread(target=lambda: [(self._state.publish(msg_s), self._target.publish(msg_t))
                                                       for _ in iter(lambda: self._stop.wait(0.01), True)],
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_node_plans_beside_its_loop_and_reports_it(tmp_path, ros_node):  # noqa: F811
    from diagnostic_msgs.msg import DiagnosticArray
    seen: list[dict[str, str]] = []
    sub = ros_node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: seen.extend(
        {kv.key: kv.value for kv in s.values} for s in m.status if s.name.startswith("asyncnode/")), 10)
    with active_node(tmp_path, "asyncnode", _params("async")) as node:
        feed = Feed(ros_node, node.namespace)
        try:
            client = client_of(node, ros_node)
            wait_until(client.run_policy_ready, 60, "the action server")
            outcome = client.run_policy(max_steps=60, wait_s=60)
            assert outcome.result.success and outcome.result.steps == 60
            latest = wait_until(lambda: next((d for d in reversed(seen) if int(d.get("replan_merged", "0")) > 0),
                                             None), 60, "diagnostics with merged plans")
            assert latest["replan_mode"] == "async" and latest["replan_delay_steps"] == "3"
            assert int(latest["replan_launched"]) >= 5
            _the_cli_and_the_log_show_it(node)
        finally:
            feed.close()
    ros_node.destroy_subscription(sub)


def _the_cli_and_the_log_show_it(node) -> None:
    """Replanning seen without ros2cli (issue #50): `flashrt status`, `flashrt diagnostics`, the serve log."""
    import subprocess
    import sys

    from rosproc import ros_env, wait_for_text

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node", f"{node.namespace}/flashrt",
                               *args], capture_output=True, text=True, env=ros_env(), timeout=300)
    r = cli("status")
    assert r.returncode == 0, r.stderr
    shown = dict(line.split(None, 1) for line in r.stdout.splitlines() if len(line.split(None, 1)) == 2)
    assert shown.get("replan_mode") == "async" and shown["replan_delay_steps"] == "3", r.stdout + node.log.read_text()
    assert int(shown["replan_merged"]) > 0 and {"replan_late", "replan_held", "replan_turnaround_p95_ms"} <= set(shown)
    r = cli("diagnostics")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[OK] asyncnode/flashrt: engine: active") and "replan_mode" in r.stdout, r.stdout
    assert "replan async: delay 3 steps, a merged chunk lasts" in node.log.read_text(), node.log.read_text()
    assert wait_for_text(node.log, "since the last report: ", 60), node.log.read_text()


def test_async_on_a_policy_without_an_action_queue_fails_configure_with_the_reason(tmp_path):
    node = NodeUnderTest(tmp_path, "asyncgru", {"engine_kind": "policy", "policy": "gru", "device": "cpu",
                                                "replan": "async"})
    try:
        assert node.proc.wait(120) == 1, node.log.read_text()
    finally:
        stop(node.proc)
    assert "replan must be sync" in node.log.read_text()
