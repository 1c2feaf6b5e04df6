"""Bounded torture run against a real node: concurrent mixed verbs, fuzzed fields, kill -9 during saves.

Usage: ``python test/torture.py [--seconds 60] [--clients 3] [--kills 2] [--seed 1]``
(``test/test_torture.py`` runs a short mode). It starts a node (SmolLM2 on the CPU: the
namespaced node does not get test/params_tiny_llm.yaml) in a subprocess and, for ``--seconds``:

- ``--clients`` threads call random verbs (snapshot, restore, fork, drop, list, save,
  load, verify with and without ``against_live``, rollback, reset, generate) with names
  from a small shared pool (so they collide) and fuzzed names and fields (path escapes,
  10 kB strings, unicode, NaN/inf/negative sampling fields, huge steps and seeds);
- a saver thread overwrites disk capsules ``keep-0`` .. ``keep-2`` in a loop and notes
  every save the node confirmed;
- ``--kills`` times, at evenly spaced moments, the node is killed with SIGKILL while the
  saver is saving, restarted on the same capsule directory, and every confirmed
  ``keep-*`` capsule must be listed and restore with ``verify=True`` (a BUSY or TIMEOUT
  answer, the engine busy in a step, is re-sent until the call timeout).

Counts: ``calls``, ``ok``, ``clear_errors`` (success=false with a code other than
INTERNAL and a message), ``internal`` (INTERNAL answers), ``hangs`` (no answer within
``--call-timeout`` while the node was up), ``interrupted`` (in flight when we killed the
node), ``crashes`` (the node exited without our kill), ``lost`` (confirmed capsules
missing or damaged after a restart). Exit status 0 iff crashes = hangs = lost = internal = 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_ros.runtime.errors import ErrorCode  # noqa: E402
from rosproc import start_python, wait_for_text  # noqa: E402

INTERNAL, NOT_FOUND, CORRUPT, BUSY, TIMEOUT = (ErrorCode.INTERNAL, ErrorCode.NOT_FOUND, ErrorCode.CORRUPT,
                                               ErrorCode.BUSY, ErrorCode.TIMEOUT)
ENGINE_NOT_AT_BOUNDARY = (BUSY, TIMEOUT)     # a clear "try again": the node restored nothing
POOL = ["a", "b", "c", "home", "x.y", "z-1"]
FUZZ_NAMES = ["", "../x", "/abs", "a/b", "." + "hidden", "..", "ü", "a b", "x" * 10_000, "keep\x00",
              "k" * 128, "k" * 129, "CON", "-", "a.safetensors", "a.json"]
KEEP = ["keep-0", "keep-1", "keep-2"]


@dataclass
class Counts:
    calls: int = 0
    ok: int = 0
    clear_errors: int = 0
    internal: int = 0
    hangs: int = 0
    interrupted: int = 0
    crashes: int = 0
    lost: int = 0
    kills: int = 0
    restarts_checked: int = 0
    details: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.details) < 40:
            self.details.append(text)


class Node:
    """The node under torture: a subprocess we can kill and restart on the same directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.capsule_dir = workdir / "capsules"
        self.runs = 0
        self.proc: Any = None
        self.epoch = 0                   # bumped on every kill: calls in flight then are "interrupted"
        self.up = threading.Event()
        self.killed_on_purpose = False

    def start(self) -> None:
        self.runs += 1
        log = self.workdir / f"node{self.runs}.log"
        self.log = log
        args = ["-m", "flashrt_ros.ros.node", "--ros-args", "--params-file", "test/params_tiny_llm.yaml",
                "-r", "__ns:=/torture", "-p", "autostart:=true", "-p", f"capsule_directory:={self.capsule_dir}",
                "-p", "capsule_disk_budget_mb:=512"]
        self.proc = start_python(args, log)
        self.killed_on_purpose = False
        if not wait_for_text(log, "active: serving capsule services", 180, self.proc):
            raise RuntimeError(f"node did not become active:\n{log.read_text()[-3000:]}")
        self.up.set()

    def kill(self) -> None:
        self.up.clear()
        self.epoch += 1
        self.killed_on_purpose = True
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        self.up.clear()
        self.epoch += 1
        self.killed_on_purpose = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except Exception:  # noqa: BLE001
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        return self.proc.returncode


class Torturer:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        import rclpy
        from rclpy.executors import MultiThreadedExecutor

        from flashrt_ros.client import FlashRTClient
        from flashrt_ros.client.background_executor import BackgroundExecutor

        self.args = args
        self.node = Node(workdir)
        self.counts = Counts()
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.confirmed: dict[str, str] = {}          # keep name -> content hash the node confirmed
        self.in_flight: dict[str, bool] = {}
        rclpy.init()
        self.ros_node = rclpy.create_node("torture_client")
        self.executor = MultiThreadedExecutor(num_threads=4)
        self.executor.add_node(self.ros_node)
        self.spinner = BackgroundExecutor(self.executor)
        self.client = FlashRTClient(self.ros_node, "/torture/flashrt")

    # --- one call -----------------------------------------------------------
    def call(self, verb: str, **fields: Any) -> Any:
        """Send one request and classify the outcome; returns the response or None."""
        if not self.node.up.wait(240):
            return None
        epoch = self.node.epoch
        try:
            if not self.client.wait_for(verb, 60):
                return self._no_answer(verb, fields, epoch, "service never appeared")
            future = self.client.call_async(verb, **fields)
        except Exception as exc:  # noqa: BLE001 - a client-side refusal (e.g. an unrepresentable field)
            with self.lock:
                self.counts.calls += 1
                self.counts.clear_errors += 1
            return None
        # A reply lost to the DDS race after a restart (ros2/ros2#1253, or a request matched only to
        # the killed server's stale endpoint) is not a hang: a retry-safe request is re-sent as our
        # own clients do (client.resend_times); only silence to every copy counts as a hang.
        start = time.monotonic()
        deadline = start + self.args.call_timeout
        from flashrt_ros.client import resend_times, retry_safe
        resends = resend_times(self.args.call_timeout) if retry_safe(verb, fields) else []
        futures = [future]
        while not any(f.done() for f in futures):
            if self.node.epoch != epoch:
                for f in futures:
                    self.client.forget(verb, f)
                with self.lock:
                    self.counts.calls += 1
                    self.counts.interrupted += 1
                return None
            now = time.monotonic()
            if now > deadline:
                for f in futures:
                    self.client.forget(verb, f)
                return self._no_answer(verb, fields, epoch, f"no response (sent {len(futures)} times)")
            if resends and now - start >= resends[0]:
                resends.pop(0)
                futures.append(self.client.call_async(verb, **fields))
            time.sleep(0.005)
        answered = next(f for f in futures if f.done())
        for f in futures:
            if f is not answered:
                self.client.forget(verb, f)
        return self._classify(verb, fields, answered.result())

    def _no_answer(self, verb: str, fields: dict, epoch: int, why: str) -> None:
        with self.lock:
            self.counts.calls += 1
            if self.node.epoch != epoch:
                self.counts.interrupted += 1
            else:
                self.counts.hangs += 1
                self.counts.note(f"HANG {verb} {_short(fields)}: {why}")
        return None

    def _classify(self, verb: str, fields: dict, response: Any) -> Any:
        with self.lock:
            self.counts.calls += 1
            if response.success:
                self.counts.ok += 1
            else:
                code = getattr(response, "error_code", None)
                if code == INTERNAL or (code is None and "[INTERNAL]" in response.message) or not response.message:
                    self.counts.internal += 1
                    self.counts.note(f"INTERNAL {verb} {_short(fields)}: {response.message[:200]}")
                else:
                    self.counts.clear_errors += 1
        return response

    def generate(self, rng: random.Random) -> None:
        fields = dict(max_new_tokens=rng.choice([1, 2, 4]), use_chat_template=rng.random() < 0.3,
                      temperature=rng.choice([0.0, 0.7, -1.0, math.nan, math.inf, 1e30]),
                      top_p=rng.choice([1.0, 0.9, 0.0, 2.0, math.nan]), top_k=rng.choice([0, 5, -1]),
                      seed=rng.choice([0, 1, 2 ** 64 - 1, 2 ** 63]), reset=rng.random() < 0.1)
        prompt = rng.choice(["hello", "", "a longer prompt about robots", "ü" * 40])
        if not self.node.up.wait(240):
            return
        epoch = self.node.epoch
        with self.lock:
            self.counts.calls += 1
        try:
            outcome = self.client.generate(prompt, timeout_s=self.args.call_timeout, feedback_grace_s=1.0,
                                           **fields)
        except Exception as exc:  # noqa: BLE001
            with self.lock:
                if self.node.epoch != epoch or "not available" in str(exc) or "no answer" in str(exc):
                    self.counts.interrupted += 1
                elif "no result" in str(exc):
                    self.counts.hangs += 1
                    self.counts.note(f"HANG generate {_short(fields)}: {exc}")
                else:
                    self.counts.clear_errors += 1
            return
        with self.lock:
            if not outcome.accepted:
                self.counts.clear_errors += 1        # rejected: another goal runs
            elif outcome.result.success:
                self.counts.ok += 1
            elif outcome.result.error_code == INTERNAL:
                self.counts.internal += 1
                self.counts.note(f"INTERNAL generate {_short(fields)}: {outcome.result.message[:200]}")
            else:
                self.counts.clear_errors += 1

    # --- workers ------------------------------------------------------------
    def fuzzer(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        while not self.stop_flag.is_set():
            name = rng.choice(POOL) if rng.random() < 0.8 else rng.choice(FUZZ_NAMES)
            other = rng.choice(POOL)
            verb = rng.choice(["snapshot", "snapshot", "restore", "fork", "drop", "list", "save", "load",
                               "verify", "verify", "rollback", "reset", "generate", "generate"])
            if verb == "generate":
                self.generate(rng)
            elif verb == "snapshot":
                self.call("snapshot", name=name, tier=rng.choice(["", "device", "host", "disk", "moon"]),
                          overwrite=rng.random() < 0.6, pin=rng.random() < 0.05,
                          session=rng.choice(["", "s1", "../x", "s" * 5000]))
            elif verb == "restore":
                self.call("restore", name=name, verify=rng.random() < 0.5)
            elif verb == "fork":
                self.call("fork", source=name, name=other, tier=rng.choice(["", "host", "disk"]))
            elif verb in ("drop", "save", "load"):
                self.call(verb, name=name)
            elif verb == "list":
                self.call("list", session=rng.choice(["", "s1", "x" * 3000]))
            elif verb == "verify":
                self.call("verify", name=name, against_live=rng.random() < 0.6)
            elif verb == "rollback":
                self.call("rollback", steps=rng.choice([1, 2, 0, -5, 2 ** 31 - 1]))
            elif verb == "reset":
                self.call("reset")

    def saver(self) -> None:
        rng = random.Random(self.args.seed)
        while not self.stop_flag.is_set():
            name = rng.choice(KEEP)
            response = self.call("snapshot", name=name, tier="disk", overwrite=True)
            if response is not None and response.success:
                with self.lock:
                    self.confirmed[name] = response.capsule.content_hash

    def check_after_restart(self) -> None:
        """Every confirmed keep-* capsule must be listed and restore verified."""
        listing = self.call("list")
        names = {c.name for c in listing.capsules} if listing is not None and listing.success else set()
        with self.lock:
            confirmed = dict(self.confirmed)
            self.counts.restarts_checked += 1
        for name, content in confirmed.items():
            response = restore_until_decided(lambda: self.call("restore", name=name, verify=True),
                                             self.args.call_timeout)
            if name not in names or response is None or not response.success:
                with self.lock:
                    self.counts.lost += 1
                    self.counts.note(f"LOST {name}: listed={name in names} "
                                     f"restore={getattr(response, 'message', None)}")

    def watch(self) -> None:
        """Count a node that dies on its own as a crash, and bring it back."""
        while not self.stop_flag.is_set():
            proc = self.node.proc
            if proc is not None and proc.poll() is not None and not self.node.killed_on_purpose:
                with self.lock:
                    self.counts.crashes += 1
                    self.counts.note(f"CRASH exit {proc.returncode}: {self.node.log.read_text()[-1500:]}")
                self.node.up.clear()
                self.node.epoch += 1
                self.node.start()
            time.sleep(0.1)

    # --- the run ------------------------------------------------------------
    def run(self) -> Counts:
        self.node.start()
        workers = [threading.Thread(target=self.fuzzer, args=(i,), daemon=True) for i in range(self.args.clients)]
        workers.append(threading.Thread(target=self.saver, daemon=True))
        watcher = threading.Thread(target=self.watch, daemon=True)
        for t in workers:
            t.start()
        watcher.start()
        start = time.monotonic()
        for k in range(self.args.kills):
            kill_at = start + self.args.seconds * (k + 1) / (self.args.kills + 1)
            while time.monotonic() < kill_at:
                time.sleep(0.05)
            self.node.kill()
            with self.lock:
                self.counts.kills += 1
            self.node.start()
            self.check_after_restart()
        while time.monotonic() < start + self.args.seconds:
            time.sleep(0.05)
        self.stop_flag.set()
        for t in workers:
            t.join(self.args.call_timeout + 30)
            if t.is_alive():
                with self.lock:
                    self.counts.hangs += 1
                    self.counts.note("HANG: a client thread never finished")
        watcher.join(5)
        self.check_after_restart()       # the final state too
        code = self.node.stop()
        if code not in (0, -signal.SIGINT):
            with self.lock:
                self.counts.crashes += 1
                self.counts.note(f"node exited {code} on SIGINT")
        log_text = "".join(p.read_text(errors="replace") for p in sorted(self.node.workdir.glob("node*.log")))
        if "Traceback" in log_text:
            with self.lock:
                self.counts.note("a node log holds a Traceback")
                self.counts.internal += 1
        return self.counts

    def close(self) -> None:
        import rclpy
        self.spinner.stop()
        self.ros_node.destroy_node()
        rclpy.try_shutdown()


def restore_until_decided(restore: Callable[[], Any], deadline_s: float, *,
                          clock: Callable[[], float] = time.monotonic,
                          pause: Callable[[float], None] = time.sleep) -> Any:
    """Re-send a capsule check's restore while the node answers BUSY or TIMEOUT.

    Those answers mean the engine was inside a step for the whole boundary wait (a fuzzer's
    generation on a node that has just restarted, on a loaded machine) and nothing was restored:
    they say nothing about the capsule. Any other answer decides at once; no answer (None: the
    call already counted a hang or an interruption) too. A capsule that is still not verified
    at the deadline counts as lost.
    """
    end = clock() + deadline_s
    while True:
        response = restore()
        undecided = (response is not None and not response.success
                     and getattr(response, "error_code", None) in ENGINE_NOT_AT_BOUNDARY)
        if not undecided or clock() >= end:
            return response
        pause(0.2)


def _short(fields: dict) -> str:
    return json.dumps({k: (v[:20] + "..." if isinstance(v, str) and len(v) > 20 else v)
                       for k, v in fields.items()}, default=str)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--call-timeout", type=float, default=60.0)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="flashrt_torture_"))
    workdir.mkdir(parents=True, exist_ok=True)
    torturer = Torturer(args, workdir)
    try:
        counts = torturer.run()
    finally:
        torturer.close()
    out = asdict(counts)
    print("TORTURE " + json.dumps({k: v for k, v in out.items() if k != "details"}))
    for line in counts.details:
        print("  " + line)
    bad = counts.crashes + counts.hangs + counts.lost + counts.internal
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
