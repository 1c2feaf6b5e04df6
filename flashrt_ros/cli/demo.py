"""`flashrt demo`: a scripted capsule session against a real node, through ROS.

Starts ``flashrt serve`` (SmolLM2-135M-Instruct on CPU by default) in a child
process on a private namespace, then, only through services and the generate
action: generate an answer, snapshot it, ask a follow-up, restore the snapshot,
ask the same follow-up again, and check the two follow-up answers are
token-identical. Prints what it measured; exit status 1 if anything differs.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAMESPACE = "flashrt_demo"
PROMPT = "Name three colours."
FOLLOW_UP = "Now name three animals."


def _start_node(model: str, log_path: Path, capsule_dir: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "flashrt_ros.cli", "serve", "--model", model,
           "--node-namespace", f"/{NAMESPACE}", "-p", "device:=cpu", "-p", "max_context:=1024",
           "-p", f"capsule_directory:={capsule_dir}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _wait_active(proc: subprocess.Popen, log_path: Path, timeout: float, interrupted=lambda: None) -> None:
    deadline, shown = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        interrupted()                        # Ctrl-C / SIGTERM while the node starts
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        for line in text.splitlines()[shown:]:
            print(f"  node: {line.split('] ', 1)[-1]}", flush=True)
        shown = len(text.splitlines())
        if "active: serving capsule services" in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"node exited with {proc.returncode}; log: {log_path}")
        time.sleep(0.2)
    raise RuntimeError(f"node not active after {timeout:.0f} s; log: {log_path}")


def run_demo(model: str = "smollm2", tokens: int = 24) -> int:
    import rclpy
    from flashrt_ros.client import FlashRTClient

    workdir = Path(tempfile.mkdtemp(prefix="flashrt_demo_"))
    log_path = workdir / "node.log"
    print(f"[demo] starting the node ({model}, CPU); log in {log_path}", flush=True)
    t_start = time.perf_counter()
    proc = _start_node(model, log_path, str(workdir / "capsules"))
    rclpy.init(args=None)
    node = rclpy.create_node("flashrt_demo_client")
    client = FlashRTClient(node, f"/{NAMESPACE}/flashrt")
    status = 1
    try:
        # Ctrl-C and SIGTERM end the demo at a safe point, and the node it started goes with it
        with client.sigint_at_safe_points():
            _wait_active(proc, log_path, timeout=300, interrupted=client.raise_if_interrupted)
            print(f"[demo] node active after {time.perf_counter() - t_start:.1f} s", flush=True)
            status = _script(client, tokens)
            return status
    finally:
        client.close()
        node.destroy_node()
        rclpy.try_shutdown()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _clean_up(workdir, keep=status != 0)


def _clean_up(workdir: Path, keep: bool) -> None:
    """Remove the demo's folder (the node's log, its capsules); after a failure keep it, and say where:
    the node's log is what explains it."""
    if keep:
        print(f"[demo] the node's log and capsules are kept in {workdir}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _generate(client, prompt: str, tokens: int, reset: bool = False):
    print(f"\n> {prompt}\n", flush=True)
    t0 = time.perf_counter()
    outcome = client.generate(prompt, feedback=lambda fb: print(fb.text_piece, end="", flush=True),
                              max_new_tokens=tokens, use_chat_template=True, reset=reset)
    wall = time.perf_counter() - t0
    print(flush=True)
    if not outcome.accepted or not outcome.result.success:
        raise RuntimeError(f"generate failed: {outcome.result.message if outcome.result else 'rejected'}")
    r = outcome.result
    print(f"  [{len(r.token_ids)} tokens, stop: {r.stop_reason}, ttft {r.ttft_ms:.0f} ms, "
          f"{r.tokens_per_second:.1f} tok/s, position {r.position}, {wall:.2f} s through ROS]")
    return r


def _script(client, tokens: int) -> int:
    rows: list[tuple[str, str]] = []
    _generate(client, PROMPT, tokens, reset=True)

    t0 = time.perf_counter()
    snap = client.call("snapshot", name="home", overwrite=True)
    rows.append(("snapshot 'home' (round trip / in engine)",
                 f"{1e3 * (time.perf_counter() - t0):.2f} ms / {snap.engine_latency_ms:.3f} ms"))
    rows.append(("capsule size", f"{snap.capsule.bytes / 1e6:.2f} MB at position {snap.capsule.position}"))

    first = _generate(client, FOLLOW_UP, tokens)

    t0 = time.perf_counter()
    rest = client.call("restore", name="home")
    rows.append(("restore 'home' (round trip / in engine)",
                 f"{1e3 * (time.perf_counter() - t0):.2f} ms / {rest.engine_latency_ms:.3f} ms"))
    ver = client.call("verify", name="home", against_live=True)
    rows.append(("live state == capsule after restore", "yes" if ver.matches_live else "NO"))

    second = _generate(client, FOLLOW_UP, tokens)
    same = list(first.token_ids) == list(second.token_ids)
    rows.append(("follow-up after restore token-identical",
                 f"{'yes' if same else 'NO'} ({len(first.token_ids)} tokens)"))

    print("\n| step | result |\n| --- | --- |")
    for step, result in rows:
        print(f"| {step} | {result} |")
    ok = same and ver.matches_live
    print(f"\n[demo] {'OK: the continuation after restore is token-identical' if ok else 'FAILED'}")
    return 0 if ok else 1
