"""``flashrt fake-sensors`` and ``flashrt watch-commands``: a robot's two ends, without the robot.

Why: everyone without a robot at hand wrote these two scripts first. ``fake-sensors``
publishes the inputs a checkpoint expects, on the topics the node's parameters name
(``ros.fake_sensors``); ``watch-commands`` says how the commands arrive: rate, gaps,
how old the latest is (``robot_io.command_stats``). Neither talks to the node's
services: they work before it runs and whatever it does.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from flashrt_ros.cli.exit_status import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE


def add_robot_tool_parsers(sub: Any) -> None:
    s = sub.add_parser("fake-sensors", help="publish the inputs a checkpoint expects (images, joint states) "
                                            "on the topics the node's parameters name, at a rate")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", metavar="DIR", help="a LeRobot checkpoint directory (reads its "
                                                          "config.json: the features the node's policy reads)")
    what.add_argument("--policy", metavar="SPEC", help="a policy as the node's policy parameter names it "
                                                       "(gru, transformer, lerobot:DIR, package.module:factory)")
    s.add_argument("--rate", type=float, default=30.0, metavar="HZ", help="messages per second on every "
                                                                          "topic (default 30)")
    s.add_argument("--duration", type=float, default=0.0, metavar="S", help="stop after S seconds "
                                                                            "(default: until Ctrl-C)")
    s.add_argument("--encoding", default="rgb8", help="raw image encoding (default rgb8; an unsupported "
                                                      "one, e.g. 32FC1, shows how the node refuses it)")
    s.add_argument("--image-size", metavar="WxH", help="frame size (default: the checkpoint's image size; "
                                                       "the node resizes and crops others)")
    s.add_argument("--params-file", help="the node's parameters YAML: its robot I/O parameters decide "
                                         "the topics, joints and cameras")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                   help="a robot I/O parameter as given to serve (input_joint_state_topic, "
                        "input_joint_names, input_image_topics, ...). Without any -p or "
                        "--params-file: conventional topics, and the serve flags to match are printed")

    s = sub.add_parser("watch-commands", help="how commands arrive on a topic: rate, gaps p50/p99/max, "
                                              "how old the latest is (Ctrl-C stops)")
    s.add_argument("topic", help="the command topic (e.g. /forward_position_controller/commands; ~/action "
                                 "is --node's own)")
    s.add_argument("--type", dest="msg_type", metavar="TYPE",
                   help="message type (e.g. std_msgs/msg/Float64MultiArray; default: found on the ROS graph)")
    s.add_argument("--interval", type=float, default=1.0, metavar="S", help="a report every S seconds "
                                                                            "(default 1)")
    s.add_argument("--duration", type=float, default=0.0, metavar="S",
                   help="stop after S seconds and print the summary (default: until Ctrl-C)")


def run_robot_tool(args: argparse.Namespace) -> int:
    if args.command == "fake-sensors":
        return fake_sensors_command(args)
    return watch_commands_command(args)


# --- fake-sensors -------------------------------------------------------------------------------
def fake_sensors_command(args: argparse.Namespace) -> int:
    if args.rate <= 0 or args.duration < 0:
        print("error: --rate must be > 0 and --duration >= 0", file=sys.stderr)
        return EXIT_USAGE
    size = _image_size(args.image_size)
    if args.image_size and size is None:
        print(f"error: --image-size {args.image_size!r}: write it as WIDTHxHEIGHT, e.g. 640x480", file=sys.stderr)
        return EXIT_USAGE
    from flashrt_ros.runtime.errors import InvalidArgument
    try:
        features = _features(args)
    except InvalidArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    import rclpy
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions

    from flashrt_ros.ros.fake_sensors import fake_streams, publish_forever, suggested_parameters
    from flashrt_ros.ros.parameters import declare_parameters
    from flashrt_ros.ros.robot_io_params import ROBOT_IO_PARAMS, read_robot_io_config

    suggested = {} if (args.param or args.params_file) else suggested_parameters(features)
    ros_args = ["flashrt", "--ros-args"]
    for extra in args.param:
        ros_args += ["-p", extra]
    if args.params_file:
        ros_args += ["--params-file", args.params_file]
    try:
        rclpy.init(args=ros_args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as exc:  # noqa: BLE001 - rcl's own message on a malformed -p or file
        print(f"error: the parameters could not be read: {exc}", file=sys.stderr)
        return EXIT_USAGE
    node = None
    try:
        node = rclpy.create_node(f"flashrt_fake_sensors_{os.getpid()}", start_parameter_services=False,
                                 parameter_overrides=[Parameter(k, value=v) for k, v in suggested.items()])
        try:
            declare_parameters(node, ROBOT_IO_PARAMS)
            io = read_robot_io_config(node)
            streams = fake_streams(io, features, args.node, lambda: node.get_clock().now().to_msg(),
                                   encoding=args.encoding, image_size=size)
        except (InvalidArgument, ValueError, TypeError) as exc:
            print(f"error: these robot I/O parameters cannot feed the policy's inputs (the node would "
                  f"refuse them too): {exc}", file=sys.stderr)
            return EXIT_USAGE
        source = args.checkpoint or args.policy
        print(f"fake sensors for {source} at {args.rate:g} Hz"
              + (f" for {args.duration:g} s" if args.duration else " (Ctrl-C stops)") + ":")
        width = max(len(s.topic) for s in streams)
        kinds = max(len(_type_name(s.msg_type)) for s in streams)
        for s in streams:
            print(f"  {s.topic.ljust(width)}  {_type_name(s.msg_type).ljust(kinds)}  {s.what} -> {s.feature}")
        if suggested:
            print("no -p / --params-file given: conventional topics; start the node with the same:\n  "
                  + " ".join(_flag(k, v) for k, v in suggested.items() if k != "input_state_topic" or
                             "input_joint_state_topic" not in suggested))
        sys.stdout.flush()
        rounds, interrupted = publish_forever(node, streams, args.rate, args.duration)
        print(f"{chr(10) if interrupted else ''}published {rounds} messages on each of {len(streams)} topics")
        if interrupted:
            raise KeyboardInterrupt
        return EXIT_OK
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


def _features(args: argparse.Namespace) -> dict[str, Any]:
    """The policy's input features: from the checkpoint's config.json, or the policy built as the node
    builds it (``--policy``: its weights are loaded)."""
    if args.checkpoint:
        from flashrt_ros.models.lerobot.checkpoint import declared_input_features
        return declared_input_features(args.checkpoint)
    from flashrt_ros.models.policy_factory import make_policy
    return dict(make_policy(args.policy).input_features())


def _image_size(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _type_name(msg_type: type) -> str:
    return f"{msg_type.__module__.split('.')[0]}/{msg_type.__name__}"


def _flag(name: str, value: Any) -> str:
    """A serve ``-p`` flag, quoted for a shell."""
    if isinstance(value, (list, tuple)):
        return f'-p "{name}:=[{", ".join(str(v) for v in value)}]"'
    if value == "":
        return f"-p '{name}:=\"\"'"
    return f"-p {name}:={value}"


# --- watch-commands -----------------------------------------------------------------------------
def watch_commands_command(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.duration < 0:
        print("error: --interval must be > 0 and --duration >= 0", file=sys.stderr)
        return EXIT_USAGE
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from flashrt_ros.bt.topics import TopicError, adapted_qos, message_class
    from flashrt_ros.robot_io.command_stats import summarize
    from flashrt_ros.ros.fake_sensors import resolve

    topic = resolve(args.topic, args.node)
    rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(f"flashrt_watch_commands_{os.getpid()}")
    try:
        type_name = args.msg_type or _graph_type(node, topic, args.timeout)
        if not type_name:
            print(f"error: no publisher on {topic} within {args.timeout:.1f} s (is the node active with "
                  "output_topic set to it? or give --type)", file=sys.stderr)
            return EXIT_UNREACHABLE
        try:
            msg_class = message_class(type_name)
        except TopicError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        receipts: list[float] = []
        delays: list[float] = []

        def receive(msg: Any) -> None:
            now = time.monotonic()
            receipts.append(now)
            header = getattr(msg, "header", None)
            if header is not None and (header.stamp.sec or header.stamp.nanosec):
                delays.append(time.time() - (header.stamp.sec + header.stamp.nanosec * 1e-9))

        node.create_subscription(msg_class, topic, receive,
                                 adapted_qos(node.get_publishers_info_by_topic(topic)))
        print(f"watching {topic} ({type_name})" + (f" for {args.duration:g} s" if args.duration
                                                   else "; Ctrl-C stops") + ":", flush=True)
        start = time.monotonic()
        next_report, shown = start + args.interval, 0
        try:
            while not args.duration or time.monotonic() - start < args.duration:
                rclpy.spin_once(node, timeout_sec=min(0.05, max(0.0, next_report - time.monotonic())))
                now = time.monotonic()
                if now >= next_report:
                    count = len(receipts)
                    window = summarize(receipts[shown:count], now, before=receipts[shown - 1] if shown else None)
                    print(f"last {args.interval:g} s: {window.line()}", flush=True)
                    shown, next_report = count, next_report + args.interval
        except KeyboardInterrupt:
            print(f"\nwhole run: {summarize(receipts, time.monotonic(), delays).line()}")
            raise
        print(f"whole run: {summarize(receipts, time.monotonic(), delays).line()}")
        if not receipts:
            print(f"error: no message on {topic} in {args.duration:g} s", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


def _graph_type(node: Any, topic: str, timeout_s: float) -> str:
    """The topic's type as its publishers advertise it ('' if none appears within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        types = dict(node.get_topic_names_and_types()).get(topic)
        if types:
            return types[0]
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.1)
