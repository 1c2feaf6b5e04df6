"""Helpers for tests that run ROS processes in subprocesses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def ros_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"      # a native crash (exit -11) in a child prints its Python stack
    env.update(extra)
    return env


#: Run a module as ``python -m`` would, with SIGINT at Python's default (KeyboardInterrupt).
_CTRL_C_MAIN = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def with_ctrl_c(module: str, *args: str) -> list[str]:
    """Python arguments running ``module`` with Ctrl-C working, as from a terminal.

    A suite started in the background (``cmd &`` without job control) has SIGINT
    ignored, and so would every child: a test that sends Ctrl-C to the CLI would wait
    for nothing (a fresh-clone run started that way failed so). Nodes install their own
    SIGINT handler (rclpy); our CLI, like Python, keeps an ignored SIGINT ignored."""
    return ["-c", _CTRL_C_MAIN, module, *args]


def start_python(args: Sequence[str], log_path: Path, **env: str) -> subprocess.Popen:
    """Start ``python args...`` with the repo importable, output to log_path."""
    log = open(log_path, "wb")
    return subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                            env=ros_env(**env), cwd=str(REPO), start_new_session=True)


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGINT, then wait; SIGKILL if it does not exit in time. Returns the exit code."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def wait_for_text(path: Path, text: str, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Whether ``text`` appears in ``path`` within ``timeout`` s x the machine's load factor."""
    from waiting import load_factor
    start, factor = time.monotonic(), load_factor()
    while time.monotonic() - start < timeout * factor:
        factor = max(factor, load_factor())
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


class NodeUnderTest:
    """A flashrt node in a subprocess plus a spinning client node in this process."""

    def __init__(self, tmp_path: Path, name: str, params: dict[str, str], autostart: bool = True,
                 params_file: str = "test/params_tiny_llm.yaml") -> None:
        self.namespace = f"/{name}"
        self.log = tmp_path / f"{name}.log"
        args = ["-m", "flashrt_ros.ros.node", "--ros-args", "--params-file", params_file,
                "-r", f"__ns:={self.namespace}", "-p", f"autostart:={str(autostart).lower()}",
                "-p", f"capsule_directory:={tmp_path / (name + '_capsules')}"]
        for key, value in params.items():
            args += ["-p", f"{key}:={value}"]
        self.proc = start_python(args, self.log)
        self.capsule_dir = tmp_path / f"{name}_capsules"

    def wait_active(self, timeout: float = 120.0) -> None:
        if not wait_for_text(self.log, "active: serving capsule services", timeout, self.proc):
            raise AssertionError(f"node did not become active:\n{self.log.read_text()}")

    def stop(self) -> int:
        return stop(self.proc)
