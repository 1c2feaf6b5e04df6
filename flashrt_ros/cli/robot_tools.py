"""``flashrt fake-sensors``, ``flashrt watch-commands`` and ``flashrt make-checkpoint``: a robot's two ends and a
policy, without the robot.

Why: everyone without a robot at hand wrote these two scripts first. ``fake-sensors``
publishes the inputs a checkpoint expects, on the topics the node's parameters name
(``ros.fake_sensors``); ``watch-commands`` says how the commands arrive: rate, gaps,
how old the latest is (``robot_io.command_stats``); ``make-checkpoint`` writes a camera ACT
checkpoint of seeded random weights (``models.lerobot.make_checkpoint``) for a first try. None
talks to the node's services: they work before it runs and whatever it does.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flashrt_ros.cli.exit_status import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from flashrt_ros.interface.qos import resolve_topic


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


    s = sub.add_parser("make-checkpoint", help="write a LeRobot ACT checkpoint with cameras (seeded random weights, "
                                               "no LeRobot needed) to try the robot quick start")
    s.add_argument("directory", help="where to write it (a new or empty directory)")
    s.add_argument("--joints", type=int, required=True, help="joints of observation.state and of the action")
    s.add_argument("--cameras", required=True, metavar="NAMES",
                   help="comma-separated camera features, e.g. top,wrist (observation.images.<name>)")
    s.add_argument("--image-size", default="128x96", metavar="WxH", help="the cameras' frame size (default 128x96)")
    s.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")


def run_robot_tool(args: argparse.Namespace) -> int:
    if args.command == "fake-sensors":
        return fake_sensors_command(args)
    if args.command == "make-checkpoint":
        return make_checkpoint_command(args)
    return watch_commands_command(args)


def make_checkpoint_command(args: argparse.Namespace) -> int:
    size = _image_size(args.image_size)
    if size is None:
        print(f"error: --image-size {args.image_size!r}: write it as WIDTHxHEIGHT, e.g. 128x96", file=sys.stderr)
        return EXIT_USAGE
    cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
    cameras = [c if c.startswith("observation.images.") else f"observation.images.{c}" for c in cameras]
    from flashrt_ros.models.lerobot import make_checkpoint     # torch: only this command pays for it
    try:
        directory = make_checkpoint.make_act_checkpoint(args.directory, args.joints, cameras, (size[1], size[0]),
                                                        args.seed)
    except make_checkpoint.InvalidArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote an ACT checkpoint to {directory}: {args.joints} joints, cameras {', '.join(cameras)} "
          f"({size[0]}x{size[1]}), seeded random weights (seed {args.seed}): it moves, it does no task")
    return EXIT_OK


# --- fake-sensors -------------------------------------------------------------------------------
def fake_sensors_command(args: argparse.Namespace) -> int:
    if args.rate <= 0 or args.duration < 0:
        print("error: --rate must be > 0 and --duration >= 0", file=sys.stderr)
        return EXIT_USAGE
    size = _image_size(args.image_size)
    if args.image_size and size is None:
        print(f"error: --image-size {args.image_size!r}: write it as WIDTHxHEIGHT, e.g. 640x480", file=sys.stderr)
        return EXIT_USAGE
    # the CLI's way into the server side, as `serve`'s is ros.node: the tool runs a ROS node of its own
    from flashrt_ros.ros.fake_sensors import FakeSensors, Refused, policy_features
    try:
        features = policy_features(args.checkpoint, args.policy)
        sensors = FakeSensors(args.node, features, args.param, args.params_file, args.encoding, size)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        source = args.checkpoint or args.policy
        print(f"fake sensors for {source} at {args.rate:g} Hz"
              + (f" for {args.duration:g} s" if args.duration else " (Ctrl-C stops)") + ":")
        width = max(len(s.topic) for s in sensors.streams)
        kinds = max(len(_type_name(s.msg_type)) for s in sensors.streams)
        for s in sensors.streams:
            print(f"  {s.topic.ljust(width)}  {_type_name(s.msg_type).ljust(kinds)}  {s.what} -> {s.feature}")
        suggested = sensors.suggested
        if suggested:
            print("no -p / --params-file given: conventional topics; start the node with the same:\n  "
                  + " ".join(_flag(k, v) for k, v in suggested.items() if k != "input_state_topic" or
                             "input_joint_state_topic" not in suggested))
        sys.stdout.flush()
        rounds, interrupted = sensors.publish(args.rate, args.duration)
        print(f"{chr(10) if interrupted else ''}published {rounds} messages on each of {len(sensors.streams)} topics")
    finally:
        sensors.close()
    if interrupted:
        raise KeyboardInterrupt
    return EXIT_OK


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
    from flashrt_ros.ros.command_watch import CommandWatch, NoPublisher
    topic = resolve_topic(args.topic, args.node)
    try:
        watch = CommandWatch(topic, args.msg_type or "", args.timeout)
    except NoPublisher as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if "no publisher" in str(exc) else EXIT_USAGE
    try:
        print(f"watching {topic} ({watch.type_name})" + (f" for {args.duration:g} s" if args.duration
                                                         else "; Ctrl-C stops") + ":", flush=True)
        interrupted = watch.run(args.interval, args.duration,
                                lambda s: print(f"last {args.interval:g} s: {s.line()}", flush=True))
        whole = watch.whole_run()
        print(f"{chr(10) if interrupted else ''}whole run: {whole.line()}", flush=True)
    finally:
        watch.close()
    if interrupted:
        raise KeyboardInterrupt
    if whole.count == 0:
        print(f"error: no message on {topic} in {args.duration:g} s", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK

