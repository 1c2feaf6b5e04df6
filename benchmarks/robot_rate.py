"""Does a policy node hold its control rate on live sensor topics, and are fresh inputs ever reported stale?

What a robot sees, end to end: this process publishes two cameras
(``sensor_msgs/Image`` rgb8, default 320x240) and a ``sensor_msgs/JointState`` at
the control rate (default 15 Hz), like a driver would; a policy node in a
subprocess (``python -m flashrt_ros.ros.node``) runs a LeRobot ACT checkpoint on
the CPU at ``control_rate_hz`` and publishes ``Float64MultiArray`` commands.
Measured over a window after warm-up:

* achieved command rate (commands / window) against the requested rate;
* the gaps between commands (p50 / p99 / max) and between our own sensor
  publications (the inputs really were fresh);
* stale flips: transitions of ``inputs_state`` to ``stale`` on ``~/status``
  and ``policy inputs stale`` lines in the node's log, during the window and
  since the first step (the first, slow step included);
* the policy step time the node reports (``step_p50_ms`` / ``step_p99_ms``) and
  the machine's load average and core count.

    python -m benchmarks.robot_rate                        # builds a 2-camera ACT (needs LeRobot)
    python -m benchmarks.robot_rate --checkpoint DIR --rate 15 --seconds 60

Without ``--checkpoint`` the ACT is built with LeRobot's own classes and
seeded random weights (``benchmarks.policies.make_checkpoint``; the test-time
LeRobot of ``scripts/install_lerobot_reference.sh``). A given checkpoint must
observe ``observation.state`` and one or more cameras: every camera feature
gets a topic.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CAMERAS = ("observation.images.top", "observation.images.wrist")


def build_act(directory: Path, policy_hw: tuple[int, int], dim_model: int, smoke: bool = False) -> None:
    """A two-camera ACT (14 joints, ALOHA-like) saved with LeRobot's save_pretrained
    (``smoke``: the tiny shapes of ``policies --smoke``, to check the script runs)."""
    from benchmarks.policies import make_checkpoint
    if smoke:
        make_checkpoint("act", directory, "smoke", cameras=CAMERAS, hw=policy_hw)
    else:
        make_checkpoint("act", directory, "full", cameras=CAMERAS, hw=policy_hw,
                        dim_model=dim_model, n_heads=8, dim_feedforward=4 * dim_model)


def checkpoint_inputs(directory: Path) -> tuple[int, list[str]]:
    """(state size, camera features) a checkpoint declares."""
    from flashrt_ros.models.lerobot.checkpoint import read_checkpoint
    features = read_checkpoint(directory).input_features
    cameras = [name for name, (kind, _shape) in features.items() if kind == "VISUAL"]
    state = features.get("observation.state")
    if state is None or not cameras:
        raise SystemExit(f"{directory}: needs observation.state and a camera (has {sorted(features)})")
    return int(state[1][0]), cameras


def start_node(ns: str, checkpoint: Path, rate: float, max_age: float, joints: list[str],
               cameras: list[str], log_path: Path, capsules: Path, torch_threads: int = 0,
               replan: str = "sync") -> Any:
    import subprocess
    params = {"engine_kind": "policy", "policy": f"lerobot:{checkpoint}", "device": "cpu",
              "control_rate_hz": str(rate), "status_period_s": "0.5", "autostart": "true",
              "max_observation_age_s": str(max_age), "replan": replan,
              "capsule_directory": str(capsules), "input_state_topic": "''",
              "input_joint_state_topic": f"{ns}/joint_states",
              "input_joint_names": "[" + ", ".join(joints) + "]",
              "input_image_topics": "[" + ", ".join(f"{ns}/{c.rsplit('.', 1)[-1]}/image_raw"
                                                    for c in cameras) + "]",
              "input_image_features": "[" + ", ".join(cameras) + "]",
              "output_type": "float64_array", "output_topic": f"{ns}/forward_controller/commands"}
    args = [sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args", "-r", f"__ns:={ns}"]
    for key, value in params.items():
        args += ["-p", f"{key}:={value}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if torch_threads:                       # torch's intra-op threads of the node (OMP_NUM_THREADS)
        env["OMP_NUM_THREADS"] = str(torch_threads)
    return subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def percentiles(values: list[float]) -> tuple[float, float, float]:
    from flashrt_ros.engine.stats import percentile
    if not values:
        return (float("nan"),) * 3
    return percentile(values, 50), percentile(values, 99), max(values)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray

    from flashrt_ros.msg import EngineStatus
    from flashrt_ros.client.background_executor import BackgroundExecutor

    work = Path(tempfile.mkdtemp(prefix="robot_rate_"))
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / "act"
    if not args.checkpoint:
        print(f"building a two-camera ACT checkpoint in {checkpoint} ...", file=sys.stderr)
        build_act(checkpoint, tuple(args.policy_hw), args.dim_model, smoke=args.smoke)
    state_size, cameras = checkpoint_inputs(checkpoint)
    joints = [f"joint{i}" for i in range(state_size)]
    ns = f"/robot_rate_{os.getpid()}"
    log_path = work / "node.log"
    load_before = os.getloadavg()
    proc = start_node(ns, checkpoint, args.rate, args.max_age, joints, cameras, log_path, work / "capsules",
                      args.torch_threads, args.replan)

    rclpy.init()
    node = rclpy.create_node("robot_rate_sensors", namespace=ns)
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    spinner = BackgroundExecutor(executor)
    commands: list[float] = []
    statuses: list[tuple[float, Any]] = []
    node.create_subscription(Float64MultiArray, f"{ns}/forward_controller/commands",
                             lambda _m: commands.append(time.monotonic()), 100)
    latched = QoSProfile(depth=100, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                         reliability=ReliabilityPolicy.RELIABLE)
    node.create_subscription(EngineStatus, f"{ns}/flashrt/status",
                             lambda m: statuses.append((time.monotonic(), m)), latched)
    diagnostics: list[Any] = []                # the node's replan_* counts are on /diagnostics
    node.create_subscription(DiagnosticArray, "/diagnostics",
                             lambda m: diagnostics.extend(s for s in m.status if s.name.startswith(ns.lstrip("/"))),
                             10)
    cams = [node.create_publisher(Image, f"{ns}/{c.rsplit('.', 1)[-1]}/image_raw", qos_profile_sensor_data)
            for c in cameras]
    joint_pub = node.create_publisher(JointState, f"{ns}/joint_states", qos_profile_sensor_data)
    width, height = args.camera_size
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8).tobytes() for _ in range(4)]
    published: list[float] = []
    stop = threading.Event()

    def sensors() -> None:            # a driver: all inputs once per period, on a steady schedule
        period, k = 1.0 / args.rate, 0
        start = time.monotonic()
        while not stop.is_set():
            stamp = node.get_clock().now().to_msg()
            for pub in cams:
                msg = Image(height=height, width=width, encoding="rgb8", step=3 * width,
                            data=frames[k % len(frames)])
                msg.header.stamp = stamp
                pub.publish(msg)
            js = JointState(name=joints, position=[0.01 * ((k + i) % 50) for i in range(len(joints))])
            js.header.stamp = stamp
            joint_pub.publish(js)
            published.append(time.monotonic())
            k += 1
            stop.wait(max(0.0, start + k * period - time.monotonic()))

    feeder = threading.Thread(target=sensors, daemon=True)
    feeder.start()
    try:
        deadline = time.monotonic() + args.start_timeout
        while not commands:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the node sent no command (exit {proc.poll()}); log:\n"
                                 + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        first = commands[0]
        window_start = first + args.warmup
        time.sleep(max(0.0, window_start + args.seconds - time.monotonic()))
        window_end = time.monotonic()
    finally:
        stop.set()
        feeder.join(5)
        time.sleep(0.5)
        load_after = os.getloadavg()
        import signal
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except Exception:  # noqa: BLE001
                os.killpg(proc.pid, signal.SIGKILL)
        spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()

    in_window = [t for t in commands if window_start <= t <= window_end]
    gaps = [1e3 * (b - a) for a, b in zip(in_window, in_window[1:])]
    sensor = [t for t in published if window_start <= t <= window_end]
    sensor_gaps = [1e3 * (b - a) for a, b in zip(sensor, sensor[1:])]
    max_age_ms = 1e3 * (args.max_age or 1.5 / args.rate)
    late = sum(gap > max_age_ms for gap in sensor_gaps)        # our own publisher fell behind
    flips_window = flips_all = 0
    flip_times: list[float] = []               # seconds into the window: to set beside the largest gaps
    previous = None
    for t, msg in statuses:
        if msg.inputs_state == "stale" and previous == "fresh":
            flips_all += 1
            flips_window += window_start <= t <= window_end
            flip_times.append(round(t - window_start, 3))
        previous = msg.inputs_state or previous
    largest = sorted(((1e3 * (b - a), a - window_start) for a, b in zip(in_window, in_window[1:])), reverse=True)[:3]
    log = log_path.read_text(errors="replace")
    stale_lines = len(re.findall(r"policy inputs stale", log))
    last = statuses[-1][1] if statuses else None
    achieved = len(in_window) / (window_end - window_start)
    return {
        "requested_hz": args.rate, "achieved_hz": achieved, "ratio": achieved / args.rate,
        "window_s": window_end - window_start, "commands_in_window": len(in_window),
        "command_gap_ms": percentiles(gaps), "sensor_gap_ms": percentiles(sensor_gaps),
        "stale_flips_window": flips_window, "stale_flips_since_first_step": flips_all,
        "stale_log_lines": stale_lines, "max_age_ms": max_age_ms, "late_sensor_gaps": late,
        "largest_command_gaps": [{"at_s": round(at, 3), "gap_ms": round(gap, 1)} for gap, at in largest],
        "stale_flip_times_s": flip_times,
        "step_p50_ms": last.step_p50_ms if last else float("nan"),
        "step_p99_ms": last.step_p99_ms if last else float("nan"),
        "cameras": f"{len(cameras)} x {width}x{height} rgb8", "joints": len(joints),
        "checkpoint": str(args.checkpoint or f"built: ACT{' (smoke shapes)' if args.smoke else ''}, "
                          f"2 cameras, policy images {args.policy_hw[0]}x{args.policy_hw[1]}, "
                          f"dim_model {32 if args.smoke else args.dim_model}"),
        "replan": args.replan, "replan_counts": replan_counts(diagnostics[-1]) if diagnostics else {},
        "torch_threads": args.torch_threads or "default", "load_avg_before": load_before, "load_avg_after": load_after, "cpus": os.cpu_count(),
        "node_log": str(log_path),
    }


def replan_counts(status: Any) -> dict[str, str]:
    """The node's ``replan_*`` diagnostics (plans launched, merged, held steps, late, dropped)."""
    return {kv.key[len("replan_"):]: kv.value for kv in status.values if kv.key.startswith("replan_")}


def markdown(r: dict[str, Any]) -> str:
    g, s = r["command_gap_ms"], r["sensor_gap_ms"]
    rows = [
        ("requested / achieved rate", f"{r['requested_hz']:.1f} Hz / {r['achieved_hz']:.2f} Hz "
                                      f"({100 * r['ratio']:.1f} %)"),
        ("window", f"{r['window_s']:.1f} s, {r['commands_in_window']} commands"),
        ("command gap p50 / p99 / max", f"{g[0]:.1f} / {g[1]:.1f} / {g[2]:.1f} ms"),
        ("sensor publish gap p50 / p99 / max", f"{s[0]:.1f} / {s[1]:.1f} / {s[2]:.1f} ms"),
        ("stale flips in the window / since the first step", f"{r['stale_flips_window']} / "
                                                             f"{r['stale_flips_since_first_step']}"),
        ("'policy inputs stale' log lines (whole run)", str(r["stale_log_lines"])),
        ("sensor publish gaps > max_observation_age_s "
         f"({r['max_age_ms']:.0f} ms) in the window", str(r["late_sensor_gaps"])),
        ("largest command gaps (s into the window: ms)", ", ".join(
            f"{g_['at_s']:.1f}: {g_['gap_ms']:.0f}" for g_ in r.get("largest_command_gaps", [])) or "-"),
        ("stale flips at (s into the window)", ", ".join(f"{t:.1f}" for t in r.get("stale_flip_times_s", [])) or "-"),
        ("policy step p50 / p99 (node)", f"{r['step_p50_ms']:.1f} / {r['step_p99_ms']:.1f} ms"),
        ("inputs", f"{r['cameras']} + JointState ({r['joints']} joints)"),
        ("policy", r["checkpoint"]),
        ("replan", f"{r['replan']}" + (f" ({', '.join(f'{k} {v}' for k, v in r['replan_counts'].items())})"
                                        if r["replan_counts"] else "")),
        ("machine", f"{r['cpus']} CPUs, load average {r['load_avg_before'][0]:.1f} before, "
                    f"{r['load_avg_after'][0]:.1f} after (1 min); node torch threads "
                    f"{r['torch_threads']}"),
    ]
    return "\n".join(["| quantity | value |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="LeRobot ACT checkpoint directory (default: build one)")
    p.add_argument("--rate", type=float, default=15.0, help="sensor and control rate (Hz)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after the first command not measured")
    p.add_argument("--camera-size", type=int, nargs=2, default=(320, 240), metavar=("W", "H"))
    p.add_argument("--policy-hw", type=int, nargs=2, default=(96, 128), metavar=("H", "W"),
                   help="image size of the built ACT (cameras are resized and cropped to it)")
    p.add_argument("--dim-model", type=int, default=256, help="transformer width of the built ACT")
    p.add_argument("--max-age", type=float, default=0.0,
                   help="max_observation_age_s of the node (default 0: 1.5 control periods)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--torch-threads", type=int, default=0,
                   help="OMP_NUM_THREADS of the node (default: torch's choice, one per core)")
    p.add_argument("--replan", choices=("sync", "async"), default="sync",
                   help="the node's replan parameter (async: chunks planned beside the control loop)")
    p.add_argument("--smoke", action="store_true", help="a tiny built ACT (checks the script runs)")
    p.add_argument("--json", help="also write the result as JSON here")
    args = p.parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        from benchmarks.provenance import provenance      # imports torch: only when a JSON is written
        Path(args.json).write_text(json.dumps({**result, "provenance": provenance("cpu")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
