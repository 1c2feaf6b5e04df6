"""Does the interrupt-and-timing contract hold end to end? Halts, dead clients, node exits (issue #41).

What a user's robot computer sees, with real processes on this machine (a policy node in a
subprocess, the ``flashrt`` CLI as the clients, this process feeding observations at 100 Hz):

* **Timeout-wrapped interrupts.** ``flashrt bt run`` ticks a tree that runs ``RunPolicy``
  inside BT.CPP ``Timeout`` s of 50, 120, 250 and 400 ms, ``--interrupts`` times (the tree a
  user wrote, which hung 2 of 7 runs before): hangs (the runner not ending within its
  bound), goals still running after the tree ended, halts counted in its output.
* **Dead clients.** ``flashrt run-policy``, ``flashrt bt run`` and a Python program using
  ``FlashRTClient`` each start a goal and are killed (SIGKILL: nothing can cancel, the lease
  must; SIGTERM: the client cancels first). Measured: from the signal to the node no
  longer running the goal (its ``~/status``), and to its last command.
* **Node exit.** SIGINT and SIGTERM to the node while idle, while a goal steps, while a goal
  waits on stale inputs, and (an LLM node) while generating: seconds to exit, exit code.

    python -m benchmarks.interrupt_contract --out docs/benchmarks        # ~3 min on 2 CPU cores
    ../shared/tools/under-load.sh -n 2 -- python -m benchmarks.interrupt_contract --tag loaded

Writes ``interrupt_contract_<tag>.json`` and ``.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
TIMEOUTS_MS = (50, 120, 250, 400)
POLICY = {"engine_kind": "policy", "policy": "gru", "device": "cpu", "qos_deadline_factor": "0.0",
          "run_mode": "goal", "control_rate_hz": "50.0", "max_observation_age_s": "0.1"}


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env(),
                            cwd=str(ROOT), start_new_session=True)


def wait(cond: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"no {what} within {timeout_s:g} s")


class Node:
    """A flashrt node in a subprocess (``name`` is its namespace)."""

    def __init__(self, tmp: Path, name: str, params: dict[str, str]) -> None:
        self.name, self.log = name, tmp / f"{name}.log"
        args = ["-m", "flashrt_ros.ros.node", "--ros-args", "-r", f"__ns:=/{name}", "-p", "autostart:=true",
                "-p", f"capsule_directory:={tmp / (name + '_capsules')}"]
        for key, value in params.items():
            args += ["-p", f"{key}:={value}"]
        self.proc = start(args, self.log)
        wait(lambda: "active: serving" in self.log.read_text(errors="replace") or self.proc.poll() is not None,
             180, f"{name} to become active")
        if self.proc.poll() is not None:
            raise RuntimeError(self.log.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Watch:
    """This process's view of a node: its ~/status, its commands, observations fed at 100 Hz."""

    def __init__(self, ros: Any, namespace: str, feed: bool = True) -> None:
        from std_msgs.msg import Float32MultiArray

        from flashrt_ros.client import FlashRTClient
        self.client = FlashRTClient(ros, f"/{namespace}/flashrt")
        self.statuses: list[tuple[float, Any]] = []
        self.commands: list[float] = []
        self._status_sub = self.client.watch_status(lambda m: self.statuses.append((time.monotonic(), m)))
        self._action_sub = ros.create_subscription(Float32MultiArray, f"/{namespace}/flashrt/action",
                                                   lambda _m: self.commands.append(time.monotonic()), 100)
        self._stop = threading.Event()
        if feed:
            pub = ros.create_publisher(Float32MultiArray, f"/{namespace}/flashrt/observation", 10)
            msg = Float32MultiArray(data=[0.1, -0.2, 0.0, 0.05, 0.5, -0.5])
            threading.Thread(target=lambda: [pub.publish(msg) for _ in iter(lambda: self._stop.wait(0.01), True)],
                             daemon=True).start()

    def goal(self) -> str:
        return self.statuses[-1][1].goal_id if self.statuses else ""

    def close(self) -> None:
        self._stop.set()


def timeout_interrupts(tmp: Path, watch: Watch, count: int) -> dict[str, Any]:
    cycles = max(1, count // len(TIMEOUTS_MS))
    timeouts = "".join(f'<ForceSuccess><Timeout msec="{ms}"><RunPolicy name="drive {ms} ms" max_steps="100000"/>'
                       "</Timeout></ForceSuccess>" for ms in TIMEOUTS_MS)
    tree = tmp / "user_timeouts.xml"
    tree.write_text(f'<root BTCPP_format="4" main_tree_to_execute="M"><BehaviorTree ID="M">'
                    f'<Repeat num_cycles="{cycles}"><Sequence>{timeouts}</Sequence></Repeat></BehaviorTree></root>')
    log = tmp / "timeouts.log"
    bound_s = 60 + cycles * len(TIMEOUTS_MS) * 2.0
    t0 = time.monotonic()
    proc = start(["-m", "flashrt_ros.cli", "--node", "/contract/flashrt", "bt", "run", str(tree), "--rate", "50"], log)
    try:
        code, hung = proc.wait(bound_s), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code, hung = proc.wait(), True
    elapsed = time.monotonic() - t0
    text = log.read_text(errors="replace")
    seen = len(watch.statuses)
    wait(lambda: len(watch.statuses) > seen, 30, "a status after the tree")
    return {"interrupts": cycles * len(TIMEOUTS_MS), "timeouts_ms": list(TIMEOUTS_MS), "exit_code": code,
            "hung": hung, "seconds": round(elapsed, 2), "halts_reported": text.count(": halted ("),
            "expired_reported": text.count(": expired ("),
            "goal_running_after_exit": watch.goal() != ""}


def client_args(kind: str, tmp: Path, lease_s: float) -> list[str]:
    cli = ["-m", "flashrt_ros.cli", "--node", "/contract/flashrt", "--lease", str(lease_s)]
    if kind == "run-policy":
        return cli + ["run-policy", "--max-steps", "100000", "--quiet"]
    if kind == "bt run":
        return cli + ["bt", "run", "interrupt_pause_resume.xml", "-b", "mission_steps:=100000", "-b",
                      "interrupt:=false"]
    script = tmp / "python_client.py"
    script.write_text(textwrap.dedent(f"""
        import rclpy
        from flashrt_ros.client import FlashRTClient
        rclpy.init()
        FlashRTClient(rclpy.create_node("python_client"), "/contract/flashrt", lease_s={lease_s}).run_policy(
            max_steps=100000)
    """))
    return [str(script)]


def dead_client(tmp: Path, watch: Watch, kind: str, signum: int, lease_s: float) -> dict[str, Any]:
    log = tmp / "client.log"
    proc = start(client_args(kind, tmp, lease_s), log)
    try:
        goal = wait(lambda: watch.goal() if watch.statuses and watch.statuses[-1][1].goal_state == "stepping"
                    else "", 120, f"{kind}'s goal to step")
        os.killpg(proc.pid, signum)
        killed = time.monotonic()
        ended_at = wait(lambda: next((t for t, m in watch.statuses if t >= killed and m.goal_id != goal), None),
                        60, "the goal to end")
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    last_command = max((t for t in watch.commands if t >= killed), default=killed)
    return {"client": kind, "signal": signal.Signals(signum).name, "lease_s": lease_s,
            "goal_ended_s": round(ended_at - killed, 3), "last_command_s": round(last_command - killed, 3),
            "client_exit": proc.returncode}


def node_exit(tmp: Path, ros: Any, state: str, signum: int) -> dict[str, Any]:
    llm = state == "generating"
    name = f"exit_{state}_{signal.Signals(signum).name.lower()}"
    node = Node(tmp, name, {"model": "random-llama-tiny", "max_context": "8192"} if llm else POLICY)
    watch = Watch(ros, name, feed=state == "stepping")
    try:
        wait(lambda: watch.statuses, 60, "the node's status")
        if state != "idle":
            if llm:
                watch.client.generate_async("go", max_new_tokens=8000, reset=True)
                wanted = "generating"
            else:
                watch.client.run_policy_async(max_steps=100000, stale_timeout_s=-1.0, lease_s=0.0)
                wanted = "stepping" if state == "stepping" else "waiting"
            wait(lambda: watch.statuses and watch.statuses[-1][1].goal_state.startswith(wanted), 120,
                 f"the node to be {wanted}")
        os.killpg(node.proc.pid, signum)
        t0 = time.monotonic()
        code = node.proc.wait(60)
        return {"state": state, "signal": signal.Signals(signum).name, "exit_s": round(time.monotonic() - t0, 3),
                "exit_code": code}
    finally:
        watch.close()
        node.stop()


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout)
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "commit": commit.strip(),
            "dirty": dirty, "load_1min_at_end": round(os.getloadavg()[0], 2)}


def markdown(report: dict[str, Any]) -> str:
    m, t = report["machine"], report["timeouts"]
    lines = [f"# Interrupt contract ({report['tag']}): {m['cores']} cores, {m['cpu']}, commit {m['commit']}"
             f"{' (dirty)' if m['dirty'] else ''}, load {m['load_1min_at_end']} at the end", "",
             "`python -m benchmarks.interrupt_contract`; each figure measured in this run.", "",
             "## Timeout-wrapped interrupts (flashrt bt run, RunPolicy in BT.CPP Timeouts of "
             f"{', '.join(map(str, t['timeouts_ms']))} ms)", "",
             "| interrupts | hung | exit | halts reported | Timeouts expired | goal running after exit | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- |",
             f"| {t['interrupts']} | {t['hung']} | {t['exit_code']} | {t['halts_reported']} | {t['expired_reported']} "
             f"| {t['goal_running_after_exit']} | {t['seconds']} |", "",
             "## A client dies mid-goal (seconds from the signal; control period 0.02 s)", "",
             "| client | signal | lease s | goal ended (median, max) | last command (median, max) | runs |",
             "| --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple, list] = {}
    for r in report["dead_clients"]:
        groups.setdefault((r["client"], r["signal"], r["lease_s"]), []).append(r)
    for (client, sig, lease), runs in groups.items():
        ended = [r["goal_ended_s"] for r in runs]
        last = [r["last_command_s"] for r in runs]
        lines.append(f"| {client} | {sig} | {lease:g} | {statistics.median(ended):.2f}, {max(ended):.2f} | "
                     f"{statistics.median(last):.2f}, {max(last):.2f} | {len(runs)} |")
    lines += ["", "## The node exits on a signal", "", "| state | signal | exit s | exit code |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['state']} | {r['signal']} | {r['exit_s']:.2f} | {r['exit_code']} |" for r in report["node_exits"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--interrupts", type=int, default=200)
    ap.add_argument("--kills", type=int, default=3, help="runs per client and signal")
    ap.add_argument("--lease", type=float, default=2.0, help="the clients' lease (s)")
    args = ap.parse_args(argv)
    os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from flashrt_ros.client.background_executor import BackgroundExecutor
    rclpy.init()
    ros = rclpy.create_node("interrupt_contract")
    spinner = BackgroundExecutor(MultiThreadedExecutor(num_threads=4))
    spinner.executor.add_node(ros)
    tmp = Path(tempfile.mkdtemp(prefix="interrupt_contract_"))
    report: dict[str, Any] = {"tag": args.tag, "dead_clients": [], "node_exits": []}
    node = Node(tmp, "contract", POLICY)
    watch = Watch(ros, "contract")
    try:
        wait(lambda: watch.client.run_policy_ready() and watch.statuses, 60, "the node")
        report["timeouts"] = timeout_interrupts(tmp, watch, args.interrupts)
        print(report["timeouts"], flush=True)
        for kind in ("run-policy", "bt run", "python"):
            for signum in (signal.SIGKILL, signal.SIGTERM):
                if kind == "python" and signum == signal.SIGTERM:
                    continue            # a plain Python program dies on SIGTERM: the lease's case, as SIGKILL
                for _ in range(args.kills):
                    report["dead_clients"].append(dead_client(tmp, watch, kind, signum, args.lease))
                    print(report["dead_clients"][-1], flush=True)
    finally:
        watch.close()
        node.stop()
    for state in ("idle", "stepping", "waiting", "generating"):
        for signum in (signal.SIGINT, signal.SIGTERM):
            report["node_exits"].append(node_exit(tmp, ros, state, signum))
            print(report["node_exits"][-1], flush=True)
    spinner.stop()
    ros.destroy_node()
    rclpy.try_shutdown()
    report["machine"] = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"interrupt_contract_{args.tag}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"interrupt_contract_{args.tag}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
