"""`flashrt status`, `run-policy`, `param` and `serve` against a policy node (subprocesses, real DDS)."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
from std_msgs.msg import Float32MultiArray

from flashrt_ros.cli import EXIT_CANCELLED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from node_fixtures import ros_node  # noqa: F401 - fixture
from waiting import wait_until
from policy_io_harness import Feeder
from rosproc import NodeUnderTest, ros_env, with_ctrl_c

OBS = lambda i: Float32MultiArray(data=[0.01 * (i % 13), -0.2, 0.0, 0.05, 0.5, -0.5])  # noqa: E731
POLICY = {"engine_kind": "policy", "policy": "gru", "device": "cpu", "control_rate_hz": "20.0",
          "run_mode": "goal", "status_period_s": "0.2"}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", *args], capture_output=True,
                          text=True, env=ros_env(), timeout=timeout)


@pytest.fixture(scope="module")
def policy_node(tmp_path_factory, ros_node):  # noqa: F811
    n = NodeUnderTest(tmp_path_factory.mktemp("clipol"), "clipol", POLICY)
    n.wait_active()
    feeder = Feeder(ros_node, "/clipol/flashrt/observation", OBS, period_s=0.05)
    yield ["--node", "/clipol/flashrt"]
    feeder.stop()
    assert n.stop() == 0, n.log.read_text()
    assert "Traceback" not in n.log.read_text(), n.log.read_text()


def test_status_prints_the_latched_status_once_or_watches(policy_node):
    r = cli(*policy_node, "status")
    assert r.returncode == EXIT_OK, r.stderr
    fields = dict(line.split(None, 1) for line in r.stdout.splitlines() if len(line.split(None, 1)) == 2)
    assert fields["lifecycle_state"] == "active" and fields["engine_kind"] == "policy"
    assert fields["model"] == "gru" and "rejected_messages" in fields
    r = cli(*policy_node, "status", "--watch", "--count", "3")
    assert r.returncode == EXIT_OK, r.stderr
    assert r.stdout.count("--- ") == 3 and r.stdout.count("lifecycle_state") == 3


def test_run_policy_prints_each_step_and_stops_at_max_steps(policy_node):
    r = cli(*policy_node, "run-policy", "--max-steps", "5")
    assert r.returncode == EXIT_OK, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == [f"step {i}" for i in range(1, 6)], r.stdout
    assert "5 steps, stop: max_steps" in r.stdout


def test_run_policy_into_head_cancels_its_goal_and_exits_quietly(policy_node):
    """``flashrt run-policy ... | head -3``: once head has its lines and closes the pipe, the next step's print
    fails; the goal is cancelled (as for Ctrl-C) and the command exits 141 without a traceback or a message."""
    env = ros_env()
    shell = (f"{sys.executable} -m flashrt_ros.cli {' '.join(policy_node)} run-policy --max-duration 120 "
             "| head -3; echo \"rc ${PIPESTATUS[0]}\"")
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=env, timeout=180)
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["step 1", "step 2", "step 3"], r.stdout
    assert lines[-1] == "rc 141", (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "interrupted" not in r.stderr, r.stderr
    # the goal was cancelled before the command exited, so no goal is left running (the latched status says so)
    wait_until(lambda: "no goal is running" in cli(*policy_node, "goals").stdout, 60, "the goal to be gone")


def test_run_policy_needs_a_bound(policy_node):
    r = cli(*policy_node, "run-policy")
    assert r.returncode == EXIT_USAGE and "--max-steps" in r.stderr


def test_ctrl_c_on_run_policy_cancels_and_rolls_back(policy_node):
    proc = subprocess.Popen([sys.executable, *with_ctrl_c("flashrt_ros.cli", *policy_node, "run-policy",
                                                          "--max-duration", "120", "--rollback-on-cancel")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ros_env())
    third = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 3:"):
                third.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert third.wait(120), "no third step was printed"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == EXIT_INTERRUPTED
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert "goal cancelled after" in err and "rolled back" in err, err
    assert "Traceback" not in err


def test_run_policy_cancelled_by_another_client_exits_4_and_says_so(policy_node):
    """A script must tell a goal cancelled by someone else from one that completed (both used to exit 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.cli", *policy_node, "run-policy",
                             "--max-duration", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ros_env())
    third = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("step 3:"):
                third.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert third.wait(120), "no third step was printed"
        cancel = cli(*policy_node, "cancel", "--all")
        assert cancel.returncode == EXIT_OK and "ended" in cancel.stdout, cancel.stdout + cancel.stderr
        assert proc.wait(60) == EXIT_CANCELLED
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert "goal cancelled by another client (flashrt cancel, or another program) after" in err, err
    assert "Traceback" not in err


def test_param_get_and_set(policy_node):
    r = cli(*policy_node, "param", "get", "rollback_on_cancel", "control_rate_hz")
    assert r.returncode == EXIT_OK, r.stderr
    assert "rollback_on_cancel: False" in r.stdout and "control_rate_hz: 20.0" in r.stdout
    r = cli(*policy_node, "param", "set", "rollback_on_cancel", "true")
    assert r.returncode == EXIT_OK, r.stderr
    assert "rollback_on_cancel: True" in cli(*policy_node, "param", "get", "rollback_on_cancel").stdout
    assert cli(*policy_node, "param", "set", "rollback_on_cancel", "false").returncode == EXIT_OK
    r = cli(*policy_node, "param", "set", "control_rate_hz", "5.0")       # read-only: refused
    assert r.returncode == EXIT_FAILED and "control_rate_hz" in r.stderr
    r = cli(*policy_node, "param", "set", "default_tier", "tape")          # not one of the choices
    assert r.returncode == EXIT_FAILED and "default_tier must be one of" in r.stderr
    r = cli(*policy_node, "param", "get", "no_such_parameter")
    assert r.returncode == EXIT_FAILED and "no_such_parameter" in r.stderr


def test_serve_exits_non_zero_when_the_node_cannot_activate(tmp_path):
    r = cli("serve", "--namespace", "/cannot", "--engine-kind", "policy", "--policy", "gru",
            "-p", "device:=cpu", "-p", f"capsule_directory:={tmp_path / 'c'}",
            "-p", "input_joint_state_topic:=/cannot/joints", "-p", "input_joint_names:=[a, b]",
            timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "input_joint_names" in out and "could not be configured and activated" in out
    assert "Traceback" not in out
