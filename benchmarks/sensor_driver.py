"""A sensor driver in a process of its own: 2 x rgb8 cameras and a JointState, once per period, on a steady schedule.

Why a process: ``benchmarks.robot_rate`` once published its sensors from a thread of the measuring process,
whose Python executor (command, status and diagnostics callbacks) shares the interpreter with it; one stall of
that process (485 ms in issue #55's 5-minute run, while the OS woke a sleeping probe within 35 ms) starved the
node of data and was counted against it. A robot's camera and joint drivers are processes of their own too.

    python -m benchmarks.sensor_driver --ns /robot_rate_1 --cameras top,wrist --joints 14 --size 320 240 \
        --rate 15 --priority 50 --stamps published.json

Runs until SIGINT or SIGTERM, then writes the monotonic time of every publish round to ``--stamps`` (JSON:
``{"published": [...], "priority": "..."}``); every process on the machine shares ``CLOCK_MONOTONIC``.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def publish_sensors(node: Any, ns: str, cameras: list[str], joints: list[str], size: tuple[int, int], rate: float,
                    stop: threading.Event, published: list[float]) -> None:
    """Until ``stop``: every camera (rgb8 noise frames) and the JointState once per period on a steady schedule,
    each round's monotonic time appended to ``published``. The loop of this process, and of
    ``benchmarks.robot_rate --driver thread``."""
    import numpy as np
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState

    cams = [node.create_publisher(Image, f"{ns}/{c}/image_raw", qos_profile_sensor_data) for c in cameras]
    joint_pub = node.create_publisher(JointState, f"{ns}/joint_states", qos_profile_sensor_data)
    width, height = size
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8).tobytes() for _ in range(4)]
    period, k = 1.0 / rate, 0
    start = time.monotonic()
    while not stop.is_set():
        stamp = node.get_clock().now().to_msg()
        for pub in cams:
            msg = Image(height=height, width=width, encoding="rgb8", step=3 * width, data=frames[k % len(frames)])
            msg.header.stamp = stamp
            pub.publish(msg)
        js = JointState(name=joints, position=[0.01 * ((k + i) % 50) for i in range(len(joints))])
        js.header.stamp = stamp
        joint_pub.publish(js)
        published.append(time.monotonic())
        k += 1
        stop.wait(max(0.0, start + k * period - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", required=True, help="topic namespace: NS/<camera>/image_raw, NS/joint_states")
    p.add_argument("--cameras", required=True, help="camera names, comma-separated")
    p.add_argument("--joints", type=int, required=True, help="joint count (names joint0..)")
    p.add_argument("--size", type=int, nargs=2, default=(320, 240), metavar=("W", "H"))
    p.add_argument("--rate", type=float, default=15.0)
    p.add_argument("--priority", type=int, default=0, help="SCHED_FIFO priority of the publishing thread (0: default)")
    p.add_argument("--stamps", required=True, help="where to write the publish times on exit")
    args = p.parse_args(argv)

    import rclpy

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    rclpy.init(signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("sensor_driver", namespace=args.ns)
    priority = "default"
    if args.priority:
        from flashrt_ros.robot_io.control_thread import raise_priority
        priority = raise_priority(args.priority)
    published: list[float] = []
    try:
        publish_sensors(node, args.ns, [c for c in args.cameras.split(",") if c],
                        [f"joint{i}" for i in range(args.joints)], tuple(args.size), args.rate, stop, published)
    finally:
        Path(args.stamps).write_text(json.dumps({"published": published, "priority": priority}))
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
