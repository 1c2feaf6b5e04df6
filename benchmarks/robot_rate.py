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
    python -m benchmarks.robot_rate --policy smolvla --device cuda --dtype bfloat16 --rate 50   # GPU
    python -m benchmarks.robot_rate --policy diffusion --device cuda --rate 30 --timeline       # + stall causes

``--policy act2cam`` (default) is the 2-camera ACT below; ``act``, ``diffusion``, ``smolvla``, ``pi0`` and
``pi05`` are ``benchmarks.policies`` / ``benchmarks.smolvla`` / ``benchmarks.pi0``'s checkpoints at ``--size``
(full: the
ALOHA ACT, PushT Diffusion, SmolVLA at its published size with 3 cameras 256x256 and its
instruction),
whose cameras are published at the policy's own image size unless ``--camera-size``
says otherwise. ``--timeline`` attributes every gap over 1.5 periods to its cause
(``benchmarks.stall_analysis``).

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
import signal
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


def build_checkpoint(args: argparse.Namespace, directory: Path) -> tuple[str, str | None]:
    """Build ``args.policy``'s checkpoint in ``directory``; returns its description and instruction (VLAs)."""
    if args.policy == "act2cam":
        build_act(directory, tuple(args.policy_hw), args.dim_model, smoke=args.smoke)
        return (f"built: ACT{' (smoke shapes)' if args.smoke else ''}, 2 cameras, policy images "
                f"{args.policy_hw[0]}x{args.policy_hw[1]}, dim_model {32 if args.smoke else args.dim_model}"), None
    size = "smoke" if args.smoke else args.size
    if args.policy == "smolvla":
        from benchmarks.smolvla import TASK, make_checkpoint
        make_checkpoint(directory, smoke=size == "smoke")
        return f"built: SmolVLA ({'smoke' if size == 'smoke' else 'published'} size)", TASK
    if args.policy in ("pi0", "pi05"):       # the race's checkpoint (benchmarks.pi0 --build): 2 cameras 224x224
        from benchmarks.pi0 import TASK, build
        cameras = 2 if args.policy == "pi0" else 3
        build(directory, args.policy, cameras, smoke=size == "smoke")
        return f"built: {args.policy} ({'reduced' if size == 'smoke' else 'published'} size, {cameras} cameras)", TASK
    from benchmarks.policies import make_checkpoint
    make_checkpoint(args.policy, directory, size)
    return f"built: {args.policy} ({size} size)", None


def camera_size(directory: Path, camera: str) -> tuple[int, int]:
    """(W, H) of a checkpoint's camera feature: what a driver would publish for it."""
    from flashrt_ros.models.lerobot.checkpoint import read_checkpoint
    _kind, shape = read_checkpoint(directory).input_features[camera]
    return int(shape[-1]), int(shape[-2])


def start_node(ns: str, checkpoint: Path, rate: float, max_age: float, joints: list[str],
               cameras: list[str], log_path: Path, capsules: Path, torch_threads: int = 0,
               replan: str = "default", timeline: Path | None = None, device: str = "cpu",
               dtype: str = "auto", instruction: str | None = None) -> Any:
    import subprocess
    params = {"engine_kind": "policy", "policy": f"lerobot:{checkpoint}", "device": device, "dtype": dtype,
              "control_rate_hz": str(rate), "status_period_s": "0.5", "autostart": "true",
              "max_observation_age_s": str(max_age),
              "capsule_directory": str(capsules), "input_state_topic": "''",
              "input_joint_state_topic": f"{ns}/joint_states",
              "input_joint_names": "[" + ", ".join(joints) + "]",
              "input_image_topics": "[" + ", ".join(f"{ns}/{c.rsplit('.', 1)[-1]}/image_raw"
                                                    for c in cameras) + "]",
              "input_image_features": "[" + ", ".join(cameras) + "]",
              "output_type": "float64_array", "output_topic": f"{ns}/forward_controller/commands"}
    if replan != "default":                  # else the node's default (auto)
        params["replan"] = replan
    if instruction:
        params["policy_instruction"] = f'"{instruction}"'
    args = [sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args", "-r", f"__ns:={ns}"]
    for key, value in params.items():
        args += ["-p", f"{key}:={value}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if torch_threads:                       # torch's intra-op threads of the node (OMP_NUM_THREADS)
        env["OMP_NUM_THREADS"] = str(torch_threads)
    if timeline is not None:                # the node's per-tick timeline (benchmarks.stall_analysis)
        env["FLASHRT_CONTROL_TIMELINE"] = str(timeline)
    return subprocess.Popen(args, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def percentiles(values: list[float]) -> tuple[float, float, float]:
    from flashrt_ros.engine.stats import percentile
    if not values:
        return (float("nan"),) * 3
    return percentile(values, 50), percentile(values, 99), max(values)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from diagnostic_msgs.msg import DiagnosticArray
    from std_msgs.msg import Float64MultiArray

    from flashrt_ros.msg import EngineStatus
    from flashrt_ros.client.background_executor import BackgroundExecutor

    work = Path(tempfile.mkdtemp(prefix="robot_rate_"))
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / args.policy
    described, instruction = str(args.checkpoint), args.instruction
    if not checkpoint.exists():          # built, here or into the given directory (to reuse it)
        print(f"building a {args.policy} checkpoint in {checkpoint} ...", file=sys.stderr)
        described, built_instruction = build_checkpoint(args, checkpoint)
        instruction = instruction or built_instruction
    state_size, cameras = checkpoint_inputs(checkpoint)
    if args.camera_size is None:
        args.camera_size = (320, 240) if args.policy == "act2cam" else camera_size(checkpoint, cameras[0])
    joints = [f"joint{i}" for i in range(state_size)]
    ns = f"/robot_rate_{os.getpid()}"
    log_path = work / "node.log"
    load_before = os.getloadavg()
    timeline = work / "timeline.json" if args.timeline else None
    proc = start_node(ns, checkpoint, args.rate, args.max_age, joints, cameras, log_path, work / "capsules",
                      args.torch_threads, args.replan, timeline, args.device, args.dtype, instruction)

    rclpy.init()
    node = rclpy.create_node("robot_rate_sensors", namespace=ns)
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    spinner = BackgroundExecutor(executor)
    commands: list[float] = []                 # when our callback ran (monotonic)
    wire: list[tuple[float, float]] = []       # (the node's publish, the middleware's receipt), monotonic
    to_mono = time.time() - time.monotonic()   # system clock -> monotonic (the message info is system time)

    def on_command(_msg: Any, info: Any) -> None:        # two arguments: rclpy passes the message info
        commands.append(time.monotonic())
        if info:
            wire.append((info["source_timestamp"] * 1e-9 - to_mono, info["received_timestamp"] * 1e-9 - to_mono))
    statuses: list[tuple[float, Any]] = []
    node.create_subscription(Float64MultiArray, f"{ns}/forward_controller/commands",
                             on_command, 100)
    latched = QoSProfile(depth=100, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                         reliability=ReliabilityPolicy.RELIABLE)
    node.create_subscription(EngineStatus, f"{ns}/flashrt/status",
                             lambda m: statuses.append((time.monotonic(), m)), latched)
    diagnostics: list[Any] = []                # the node's replan_* counts are on /diagnostics
    node.create_subscription(DiagnosticArray, "/diagnostics",
                             lambda m: diagnostics.extend(s for s in m.status if s.name.startswith(ns.lstrip("/"))),
                             10)
    width, height = args.camera_size
    published: list[float] = []
    stop = threading.Event()

    driver: list[str] = []

    def sensors() -> None:            # a driver: all inputs once per period, on a steady schedule
        if args.driver_priority:       # as a real-time driver would run: its lateness is not the node's
            from flashrt_ros.robot_io.control_thread import raise_other_threads, raise_priority
            driver.append(f"{raise_priority(args.driver_priority)}; {raise_other_threads()}")
        from benchmarks.sensor_driver import publish_sensors
        publish_sensors(node, ns, [c.rsplit(".", 1)[-1] for c in cameras], joints, (width, height), args.rate,
                        stop, published)

    feeder = threading.Thread(target=sensors, daemon=True)
    driver_proc = None
    if args.driver == "process":           # the sensors from a process of their own (benchmarks.sensor_driver)
        import subprocess
        driver_proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.sensor_driver", "--ns", ns,
             "--cameras", ",".join(c.rsplit(".", 1)[-1] for c in cameras), "--joints", str(len(joints)),
             "--size", str(width), str(height), "--rate", str(args.rate), "--priority", str(args.driver_priority),
             "--stamps", str(work / "published.json")],
            stdout=open(work / "driver.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    else:
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
        probe = None
        if args.timeline:
            from benchmarks.stall_analysis import start_os_probe
            probe = start_os_probe(1.0 / args.rate, max(0.0, window_start + args.seconds - time.monotonic()))
        time.sleep(max(0.0, window_start + args.seconds - time.monotonic()))
        window_end = time.monotonic()
    finally:
        stop.set()
        if driver_proc is not None:
            driver_proc.send_signal(signal.SIGINT)
            driver_proc.wait(30)
            stamps = json.loads((work / "published.json").read_text())
            published.extend(stamps["published"])
            driver.append(f"process of its own, {stamps['priority']}")
        else:
            feeder.join(5)
        time.sleep(0.5)
        load_after = os.getloadavg()
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
    callback_gaps = [1e3 * (b - a) for a, b in zip(in_window, in_window[1:])]
    # at the topic: the middleware's receipt (a C++ controller's view; our callback adds this process's
    # executor), and the node's publish stamps (the node's own share)
    received = [r for _s, r in wire if window_start <= r <= window_end]
    sent = [s for s, _r in wire if window_start <= s <= window_end]
    gaps = [1e3 * (b - a) for a, b in zip(received, received[1:])] or callback_gaps
    publish_gaps = [1e3 * (b - a) for a, b in zip(sent, sent[1:])]
    sensor = [t for t in published if window_start <= t <= window_end]
    sensor_gaps = [1e3 * (b - a) for a, b in zip(sensor, sensor[1:])]
    node_values = {kv.key: kv.value for kv in diagnostics[-1].values} if diagnostics else {}
    # the node's age limit (derived when --max-age is 0: the node reports it on /diagnostics)
    max_age_ms = 1e3 * (args.max_age or float(node_values.get("max_observation_age_s", 1.5 / args.rate)))
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
    at_topic = received or in_window
    largest = sorted(((1e3 * (b - a), a - window_start) for a, b in zip(at_topic, at_topic[1:])), reverse=True)[:3]
    log = log_path.read_text(errors="replace")
    stale_lines = len(re.findall(r"policy inputs stale", log))
    stale_log_times = [float(t) - to_mono for t in re.findall(r"\[(\d+\.\d+)\] \[[^]]*\]: policy inputs stale", log)]
    stale_lines_window = sum(window_start <= t <= window_end for t in stale_log_times)
    last = statuses[-1][1] if statuses else None
    achieved = len(in_window) / (window_end - window_start)
    stalls = None
    if timeline is not None:
        from benchmarks.stall_analysis import analyse, probe_result
        os_probe = probe_result(probe) if probe is not None else None
        received_all = [r for _s, r in wire] or commands
        (work / "commands.json").write_text(json.dumps({"commands": received_all, "window": [window_start, window_end],
                                                        "period_s": 1.0 / args.rate, "os_probe_ms": os_probe}))
        stalls = (analyse(timeline, received_all, (window_start, window_end), 1.0 / args.rate) if timeline.exists()
                  else {"error": "the node wrote no timeline"})
        stalls["os_probe_ms"] = os_probe
    return {
        "requested_hz": args.rate, "achieved_hz": achieved, "ratio": achieved / args.rate,
        "window_s": window_end - window_start, "commands_in_window": len(in_window),
        "command_gap_ms": percentiles(gaps), "sensor_gap_ms": percentiles(sensor_gaps),
        "command_gap_source": "middleware receipt" if received else "subscriber callback",
        "command_gap_callback_ms": percentiles(callback_gaps), "command_gap_publish_ms": percentiles(publish_gaps),
        "gaps_over_2_periods": sum(g > 2e3 / args.rate for g in gaps), "stale_log_lines_window": stale_lines_window,
        "stale_flips_window": flips_window, "stale_flips_since_first_step": flips_all,
        "stale_log_lines": stale_lines, "max_age_ms": max_age_ms, "late_sensor_gaps": late,
        "largest_command_gaps": [{"at_s": round(at, 3), "gap_ms": round(gap, 1)} for gap, at in largest],
        "stale_flip_times_s": flip_times,
        "step_p50_ms": last.step_p50_ms if last else float("nan"),
        "step_p99_ms": last.step_p99_ms if last else float("nan"),
        "cameras": f"{len(cameras)} x {width}x{height} rgb8", "joints": len(joints),
        "checkpoint": described, "device": args.device, "dtype": args.dtype,
        "replan": args.replan, "replan_counts": replan_counts(diagnostics[-1]) if diagnostics else {},
        "control": {k: node_values[k] for k in ("control_priority", "control_overruns", "control_gc_max_ms",
                                                 "input_periods_s") if k in node_values},
        "driver": args.driver, "driver_priority": driver[0] if driver else "default",
        "torch_threads": args.torch_threads or "default", "load_avg_before": load_before, "load_avg_after": load_after, "cpus": os.cpu_count(),
        "node_log": str(log_path), "stalls": stalls,
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
        (f"command gap p50 / p99 / max ({r.get('command_gap_source', 'subscriber callback')})",
         f"{g[0]:.1f} / {g[1]:.1f} / {g[2]:.1f} ms; {r.get('gaps_over_2_periods', '-')} over 2 periods"),
        ("command gap at the node's publish / at our callback (max)",
         f"{r['command_gap_publish_ms'][2]:.1f} / {r['command_gap_callback_ms'][2]:.1f} ms"),
        ("sensor publish gap p50 / p99 / max", f"{s[0]:.1f} / {s[1]:.1f} / {s[2]:.1f} ms"),
        ("stale flips in the window / since the first step", f"{r['stale_flips_window']} / "
                                                             f"{r['stale_flips_since_first_step']}"),
        ("'policy inputs stale' log lines (window / whole run)", f"{r.get('stale_log_lines_window', '-')} / "
                                                                 f"{r['stale_log_lines']}"),
        ("sensor publish gaps > max_observation_age_s "
         f"({r['max_age_ms']:.0f} ms) in the window", str(r["late_sensor_gaps"])),
        ("largest command gaps (s into the window: ms)", ", ".join(
            f"{g_['at_s']:.1f}: {g_['gap_ms']:.0f}" for g_ in r.get("largest_command_gaps", [])) or "-"),
        ("stale flips at (s into the window)", ", ".join(f"{t:.1f}" for t in r.get("stale_flip_times_s", [])) or "-"),
        ("policy step p50 / p99 (node)", f"{r['step_p50_ms']:.1f} / {r['step_p99_ms']:.1f} ms"),
        ("inputs", f"{r['cameras']} + JointState ({r['joints']} joints)"),
        ("policy", f"{r['checkpoint']} on {r.get('device', 'cpu')} ({r.get('dtype', 'auto')})"),
        ("replan", f"{r['replan']}" + (f" ({', '.join(f'{k} {v}' for k, v in r['replan_counts'].items())})"
                                        if r["replan_counts"] else "")),
        ("control thread", ", ".join(f"{k.removeprefix('control_')} {v}" for k, v in r.get("control", {}).items())
         or "-"),
        ("machine", f"{r['cpus']} CPUs, load average {r['load_avg_before'][0]:.1f} before, "
                    f"{r['load_avg_after'][0]:.1f} after (1 min); node torch threads "
                    f"{r['torch_threads']}; sensor driver {r.get('driver_priority', 'default')}"),
    ]
    return "\n".join(["| quantity | value |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="LeRobot checkpoint directory (default: build --policy in a temporary "
                                        "directory; a directory that does not exist yet: build it there, to reuse)")
    p.add_argument("--policy", choices=("act2cam", "act", "diffusion", "smolvla", "pi0", "pi05"), default="act2cam",
                   help="the policy to build (act2cam: the 2-camera ACT of the CPU runs; act, diffusion, smolvla: "
                        "benchmarks.policies / benchmarks.smolvla's at --size; pi0 / pi05: benchmarks.pi0's race "
                        "checkpoint, 2 / 3 cameras, published size, or reduced with --size smoke)")
    p.add_argument("--size", choices=("full", "cpu", "smoke"), default="full",
                   help="act / diffusion / smolvla size (full: ALOHA ACT, PushT Diffusion, SmolVLA's published size)")
    p.add_argument("--device", default="cpu", help="the node's device (cpu, cuda)")
    p.add_argument("--dtype", default="auto", help="the node's dtype (auto, float32, bfloat16)")
    p.add_argument("--instruction", help="policy_instruction of a VLA (default: the built SmolVLA's task)")
    p.add_argument("--rate", type=float, default=15.0, help="sensor and control rate (Hz)")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after the first command not measured")
    p.add_argument("--camera-size", type=int, nargs=2, default=None, metavar=("W", "H"),
                   help="published camera frames (default: 320x240 for act, else the policy's image size)")
    p.add_argument("--policy-hw", type=int, nargs=2, default=(96, 128), metavar=("H", "W"),
                   help="image size of the built ACT (cameras are resized and cropped to it)")
    p.add_argument("--dim-model", type=int, default=256, help="transformer width of the built ACT")
    p.add_argument("--max-age", type=float, default=0.0,
                   help="max_observation_age_s of the node (default 0: 1.5 control periods)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--torch-threads", type=int, default=0,
                   help="OMP_NUM_THREADS of the node (default: torch's choice, one per core)")
    p.add_argument("--replan", choices=("default", "auto", "sync", "async", "rtc"), default="default",
                   help="the node's replan parameter (default: not set, the node's default: auto)")
    p.add_argument("--smoke", action="store_true", help="a tiny built ACT (checks the script runs)")
    p.add_argument("--driver", choices=("process", "thread"), default="process",
                   help="publish the sensors from a process of their own (benchmarks.sensor_driver; default), or "
                        "from a thread of this measuring process (the runs before issue #55's)")
    p.add_argument("--driver-priority", type=int, default=0,
                   help="run the sensor publisher at SCHED_FIFO N (a thread: this process's other threads at nice "
                        "-10 too), as a real-time driver: its own lateness then stops the node less (0: default)")
    p.add_argument("--timeline", action="store_true",
                   help="record the node's per-tick timeline and GC pauses and attribute every gap over 1.5 periods "
                        "(benchmarks.stall_analysis), with an OS wake-up probe beside it")
    p.add_argument("--json", help="also write the result as JSON here")
    args = p.parse_args(argv)
    result = run(args)
    print(markdown(result))
    if result.get("stalls") and "phase_ms" in result["stalls"]:
        from benchmarks.stall_analysis import markdown as stalls_markdown
        print("\n" + stalls_markdown(result["stalls"], result["stalls"].get("os_probe_ms")))
    if args.json:
        from benchmarks.provenance import provenance      # imports torch: only when a JSON is written
        Path(args.json).write_text(json.dumps({**result, "provenance": provenance("cpu")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
