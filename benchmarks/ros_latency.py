"""Round-trip latency of capsule services through DDS on loopback (node in a subprocess).

Usage: python -m benchmarks.ros_latency [--model smollm2] [--calls 200]
Prints a markdown table: p50/p99 of the client-observed round trip and of the engine-side time,
for restore and snapshot, with the machine, the executors and the machine's load named.
Goal (issue 14): restore p50 <= 2 ms, p99 <= 5 ms for SmolLM2's state on CPU.
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=64)

    args = ap.parse_args()
    os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    tmp = Path(tempfile.mkdtemp(prefix="flashrt_bench_"))
    log = tmp / "node.log"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.cli", "serve", "--model", args.model,
                             "--namespace", "/bench", "-p", "device:=cpu",
                             "-p", f"capsule_directory:={tmp / 'capsules'}"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from flashrt_ros.client import FlashRTClient
    from flashrt_ros.engine.stats import percentile
    from flashrt_ros.client.background_executor import BackgroundExecutor

    rclpy.init()
    node = rclpy.create_node("bench_client")
    ex = MultiThreadedExecutor(num_threads=2)
    ex.add_node(node)
    spinner = BackgroundExecutor(ex)
    try:
        deadline = time.monotonic() + 300
        while "active: serving" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or proc.poll() is not None:
                print(log.read_text())
                return 1
            time.sleep(0.2)
        client = FlashRTClient(node, "/bench/flashrt")
        prompt = " ".join(["robot"] * args.prompt_tokens)
        client.generate(prompt, max_new_tokens=8, use_chat_template=False, reset=True)
        snap = client.call("snapshot", name="bench", overwrite=True)
        rows = {}
        for verb, fields in (("restore", {"name": "bench"}),
                             ("snapshot", {"name": "bench2", "overwrite": True})):
            rt, eng = [], []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                r = client.call(verb, **fields)
                rt.append(1e3 * (time.perf_counter() - t0))
                eng.append(r.engine_latency_ms)
            rows[verb] = (rt, eng)
        print(f"\nmachine: {platform.node()} {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}; model {args.model}; "
              f"capsule {snap.capsule.bytes / 1e6:.2f} MB at position {snap.capsule.position}; "
              f"{args.calls} calls each; node executor: MultiThreadedExecutor (6 threads), "
              f"client: MultiThreadedExecutor (2 threads); "
              f"load average {os.getloadavg()[0]:.1f} (1 min) at the end\n")
        print("| service | round trip p50 (ms) | p99 (ms) | in engine p50 (ms) | p99 (ms) |")
        print("| --- | --- | --- | --- | --- |")
        for verb, (rt, eng) in rows.items():
            print(f"| {verb} | {statistics.median(rt):.3f} | {percentile(rt, 99):.3f} | "
                  f"{statistics.median(eng):.3f} | {percentile(eng, 99):.3f} |")
        return 0
    finally:
        spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(20)


if __name__ == "__main__":
    sys.exit(main())
