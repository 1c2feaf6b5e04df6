"""The `flashrt` command line: Ctrl-C, --timeout, hints, flag names, exit codes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from flashrt_ros.cli import EXIT_INTERRUPTED, EXIT_UNREACHABLE, _parser, cli_hint
from rosproc import NodeUnderTest, ros_env, with_ctrl_c


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", *args], capture_output=True,
                          text=True, env=ros_env(), timeout=timeout)


def test_help_lists_the_exit_codes():
    out = cli("--help").stdout
    for code, meaning in (("0", "success"), ("1", "success=false"), ("2", "bad usage"),
                          ("3", "could not be reached"), ("130", "interrupted")):
        assert any(line.split()[:1] == [code] and meaning in line for line in out.splitlines()), out


def test_client_and_serve_flags_cannot_be_confused():
    args = _parser().parse_args(["--node", "/robot1/flashrt", "list"])
    assert args.node == "/robot1/flashrt"
    serve = _parser().parse_args(["serve", "--namespace", "/robot1"])
    assert serve.namespace == "/robot1"
    # The old serve spelling is an alias of the same option, not a second meaning.
    assert _parser().parse_args(["serve", "--node-namespace", "/r"]).namespace == "/r"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--namespace", "/robot1/flashrt", "list"])


def test_hints_name_the_cli_flag():
    message = "capsule 'home' already exists (pass overwrite=True to replace it)"
    snapshot = _parser().parse_args(["snapshot", "home"])
    assert cli_hint(message, snapshot) == "capsule 'home' already exists (add --overwrite to replace it)"
    fork = _parser().parse_args(["fork", "a", "home"])   # fork has no such flag: left as is
    assert cli_hint(message, fork) == message


@pytest.mark.parametrize("command", [["list"], ["generate", "hi"]])
def test_timeout_bounds_discovery(command):
    r = cli("--timeout", "1.5", "--node", f"/absent_{os.getpid()}/flashrt", *command)
    assert r.returncode == EXIT_UNREACHABLE, r.stderr
    assert "not available after 1.5 s" in r.stderr and "Traceback" not in r.stderr


def test_status_watch_without_a_node_says_so_and_exits_unreachable():
    r = cli("--timeout", "1.5", "--node", f"/absent_{os.getpid()}/flashrt", "status", "--watch")
    assert r.returncode == EXIT_UNREACHABLE, r.stderr
    assert "status message within 1.5 s" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeUnderTest(tmp_path_factory.mktemp("cli"), "cli",
                      {"max_context": "4096", "max_new_tokens": "4000"})
    n.wait_active()
    yield n
    assert n.stop() == 0, n.log.read_text()


def test_ctrl_c_on_generate_cancels_the_goal_and_exits_130(node):
    target = ["--node", f"{node.namespace}/flashrt"]
    proc = subprocess.Popen([sys.executable, *with_ctrl_c("flashrt_ros.cli", *target, "generate", "hi",
                                                          "--raw", "--reset", "--max-new-tokens", "4000")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ros_env())
    streamed = threading.Event()
    chunks: list[bytes] = []

    def read_stdout() -> None:
        while chunk := proc.stdout.read1(64):
            chunks.append(chunk)
            streamed.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        assert streamed.wait(120), "no token was streamed"
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None                                  # reported below with what the CLI said
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    err = proc.stderr.read().decode(errors="replace")
    assert rc is not None, f"the CLI did not exit within 60 s of Ctrl-C; its stderr:\n{err}"
    assert rc == EXIT_INTERRUPTED, err
    assert "interrupted: generation cancelled at position" in err and "Traceback" not in err, err
    # The goal ended at a boundary before the CLI exited: the node takes the next goal
    # at once (a goal still running would get this one rejected, exit 1).
    r = cli(*target, "generate", "hi", "--raw", "--max-new-tokens", "2")
    assert r.returncode == 0 and "2 tokens" in r.stderr, r.stderr
