"""`flashrt`: the command line for machines without ros2cli.

Mirrors ``ros2 service call`` / ``ros2 action send_goal`` against a running
node (``--node``, its fully qualified name, default /flashrt), plus ``serve``
(run the node, configured and active; ``serve --namespace`` puts it in a ROS
namespace) and ``demo`` (the scripted session of the README).

Here: the parser, ``main`` and the dispatch. The commands live by concept:
``capsule_commands`` (one per capsule verb, made from ``interface/services.py``),
``goal_commands`` (generate, run-policy: their goal options made from ``interface/actions.py``;
goals, cancel), ``query_commands`` (status, param), ``diagnostics_command``,
``robot_tools`` (fake-sensors, watch-commands: a robot's topics without the robot);
``exit_status`` has every command's exit status.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import re
import sys
from typing import Any, Sequence

from flashrt_ros.cli.capsule_commands import BY_COMMAND, add_verb_command, call_verb
from flashrt_ros.cli.diagnostics_command import add_diagnostics_parser, diagnostics_command
from flashrt_ros.cli.exit_status import (EXIT_CANCELLED, EXIT_CODES, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK,
                                         EXIT_OUTPUT_CLOSED, EXIT_TERMINATED, EXIT_UNREACHABLE, EXIT_USAGE, code_name,
                                         interrupted_exit)
from flashrt_ros.cli.goal_commands import (add_goal_command, cancel_command, generate_command, goals_command,
                                           run_policy_command)
from flashrt_ros.cli.query_commands import param_command, status_command
from flashrt_ros.cli.robot_tools import add_robot_tool_parsers, run_robot_tool
from flashrt_ros.interface.actions import GENERATE, RUN_POLICY
from flashrt_ros.interface.services import VERBS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashrt", description=__doc__.split("\n\n")[0],
                                epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default="/flashrt", metavar="NAME",
                   help="fully qualified name of the node to talk to (default /flashrt; "
                        "a node started with serve --namespace /robot1 is /robot1/flashrt)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="bound on finding the node and on each answer (default 30); a "
                        "generation itself may run longer (generate --max-seconds)")
    p.add_argument("--lease", type=float, default=None, metavar="SECONDS",
                   help="lease of the goals this command sends (run-policy, generate, bt run): if "
                        "the command dies or freezes, the node ends its goal this long after the "
                        "last renewal (default 2; 0: no lease)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the node (configured and activated)")
    s.add_argument("--params-file", help="ROS parameters YAML (e.g. config/llm.yaml)")
    s.add_argument("--engine-kind", choices=("llm", "policy"))
    s.add_argument("--model", help="model source (default smollm2)")
    s.add_argument("--policy", help="policy for engine_kind=policy (gru | transformer | lerobot:<checkpoint dir>)")
    # --node-namespace: the former spelling, same meaning, kept as a hidden alias.
    s.add_argument("--namespace", "--node-namespace", dest="namespace", default="",
                   help="ROS namespace to start the node in (its name is then NS/flashrt)")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                   help="extra parameter, as in --ros-args -p")

    for verb in VERBS:
        add_verb_command(sub, verb)
    s = add_goal_command(sub, GENERATE)
    s.add_argument("--max-seconds", type=float, default=600.0,
                   help="give up (and cancel) after this long (default 600)")
    s = sub.add_parser("status", help="print the node's ~/status (lifecycle, engine, policy inputs)")
    s.add_argument("--watch", action="store_true", help="print every status message until Ctrl-C")
    s.add_argument("--count", type=int, default=0, metavar="N",
                   help="with --watch: stop after N messages (exit 0)")
    add_diagnostics_parser(sub)
    s = add_goal_command(sub, RUN_POLICY)
    s.add_argument("--quiet", action="store_true", help="no line per step (waiting lines are still printed)")
    s = sub.add_parser("cancel", help="cancel a running goal by its id (from `status` or a BUSY message), "
                                      "or every running goal")
    s.add_argument("goal_id", nargs="?", default="", metavar="GOAL_ID",
                   help="the goal's id, or a prefix naming one running goal")
    s.add_argument("--all", action="store_true", help="cancel every running goal (run_policy and generate)")
    s = sub.add_parser("goals", help="show the node's running goal: its id, action, owner and state")
    s = sub.add_parser("param", help="get or set a node parameter")
    verbs = s.add_subparsers(dest="param_verb", required=True, metavar="get|set")
    verbs.add_parser("get", help="print parameter values").add_argument("names", nargs="+", metavar="NAME")
    setter = verbs.add_parser("set", help="set a parameter (VALUE as in ros2 param set: 3, 0.5, "
                                          "true, text, [a, b])")
    setter.add_argument("name")
    setter.add_argument("value")
    s = sub.add_parser("bt", help="behaviour trees: 'bt run TREE.xml' ticks a BehaviorTree.CPP tree")
    bt_sub = s.add_subparsers(dest="bt_command", required=True, metavar="BT_COMMAND")
    s = bt_sub.add_parser("run", help="load a BehaviorTree.CPP v4 XML tree, tick it, print status changes")
    s.add_argument("tree", help="tree file, or the name of one in the installed library "
                                "(interrupt_pause_resume.xml, operator_override.xml, ...)")
    s.add_argument("--rate", type=float, default=20.0, metavar="HZ", help="tick rate (default 20)")
    s.add_argument("--groot", nargs="?", const=1667, type=int, metavar="PORT",
                   help="publish the tree to Groot2 (default port 1667)")
    s.add_argument("-b", "--blackboard", action="append", default=[], metavar="KEY:=VALUE",
                   help="set a blackboard entry before the first tick (true/false, int, float, else a "
                        "string; quote to force a string: -b 'name:=\"42\"')")
    s.add_argument("--bb-topic", action="append", default=[], metavar="KEY:=TOPIC[:TYPE]",
                   help="while the tree runs, write each message of TOPIC (std_msgs Bool, Int*, UInt*, "
                        "Float*, String; TYPE e.g. std_msgs/msg/Bool, else found on the ROS graph) to "
                        "blackboard entry KEY, between ticks")
    s.add_argument("--max-seconds", type=float, default=0.0,
                   help="halt the tree and exit 1 after this long (default: no limit)")
    s.add_argument("--btlog", metavar="FILE", help="write every node transition to FILE (.btlog, Groot2 "
                                                    "opens it in its log replay)")
    s.add_argument("--trace", action="store_true", help="print every node's transitions (built-in "
                                                         "nodes too), as BehaviorTree.CPP's StdCoutLogger")
    add_robot_tool_parsers(sub)
    s = sub.add_parser("demo", help="start a node on SmolLM2 and run the scripted capsule session")
    s.add_argument("--model", default="smollm2")
    s.add_argument("--tokens", type=int, default=24, help="tokens per generation")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # A crash in native code (rclpy, the DDS layer) prints the Python stack on stderr, so a
    # report of exit -11 says where it happened.
    faulthandler.enable()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    if args.lease is not None and args.lease < 0:
        parser.error("--lease must be >= 0 (0: no lease)")
    if args.command == "cancel" and args.all == bool(args.goal_id):
        parser.error("cancel: give a GOAL_ID or --all")
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "bt":
            from flashrt_ros.bt.run import run_tree
            return run_tree(args.tree, **bt_run_options(args))
        if args.command in ("fake-sensors", "watch-commands", "make-checkpoint"):
            return run_robot_tool(args)
        if args.command == "demo":
            from flashrt_ros.cli.demo import run_demo
            return run_demo(model=args.model, tokens=args.tokens)
        return _call(args)
    except KeyboardInterrupt as interrupt:
        from flashrt_ros.client.core import OutputClosed
        if isinstance(interrupt, OutputClosed):
            return quiet_exit_on_closed_output()
        print("\ninterrupted", file=sys.stderr)
        return interrupted_exit(interrupt)


def quiet_exit_on_closed_output() -> int:
    """The reader of stdout went away (``| head``): nothing more to say; 141 = 128 + SIGPIPE, as a shell tool
    killed by the closed pipe would report. stdout is pointed at /dev/null so Python's exit flush is silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OUTPUT_CLOSED


def lease_of(args: argparse.Namespace) -> float:
    from flashrt_ros.client.lease import DEFAULT_LEASE_S
    return DEFAULT_LEASE_S if args.lease is None else float(args.lease)


def owner_of(args: argparse.Namespace) -> str:
    """``'flashrt run-policy (pid N on HOST)'``: the owner a refused goal's message names."""
    import socket
    what = "bt run " + args.tree if args.command == "bt" else args.command
    return f"flashrt {what} (pid {os.getpid()} on {socket.gethostname()})"


def bt_run_options(args: argparse.Namespace) -> dict[str, Any]:
    """``run_tree``'s keyword arguments from ``flashrt bt run``'s."""
    return dict(node=args.node, rate_hz=args.rate, groot_port=args.groot, blackboard=args.blackboard,
                max_seconds=args.max_seconds, wait_s=args.timeout, lease_s=lease_of(args),
                owner=owner_of(args), bb_topics=args.bb_topic, btlog=args.btlog, trace=args.trace)


def _serve(args: argparse.Namespace) -> int:
    from flashrt_ros.ros.node import main as node_main
    ros_args = ["flashrt", "--ros-args", "-p", "autostart:=true"]
    if args.params_file:
        ros_args += ["--params-file", args.params_file]
    for name in ("engine_kind", "model", "policy"):
        value = getattr(args, name)
        if value:
            ros_args += ["-p", f"{name}:={value}"]
    for extra in args.param:
        ros_args += ["-p", extra]
    if args.namespace:
        ros_args += ["-r", f"__ns:={args.namespace}"]
    return node_main(ros_args)


def _call(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from flashrt_ros.client import TIMEOUT_CODE, FlashRTClient, ServiceCallError

    # No rclpy signal handlers: Ctrl-C raises KeyboardInterrupt from the client's waits (never
    # inside rclpy), and the context stays usable so a running goal can still be cancelled.
    rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(f"flashrt_cli_{os.getpid()}")
    client = FlashRTClient(node, args.node, lease_s=lease_of(args), owner=owner_of(args))
    try:
        with client.sigint_at_safe_points():
            return _dispatch(args, client)
    except ServiceCallError as exc:
        print(f"error: {cli_hint(str(exc), args)}", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.response is None and exc.error_code == TIMEOUT_CODE else EXIT_FAILED
    finally:
        client.close()
        node.destroy_node()
        rclpy.try_shutdown()


def cli_hint(message: str, args: argparse.Namespace) -> str:
    """Say `--flag` where the node's message names a request field (``overwrite=True``).

    The node's messages are written for every client (Python, ros2 service call); on
    the command line the same field is a flag of the command, if it has one.
    """
    def replace(match: re.Match) -> str:
        field = match.group(1)
        return f"add --{field.replace('_', '-')}" if field in vars(args) else match.group(0)

    return re.sub(r"pass (\w+)=True", replace, message)


def _dispatch(args: argparse.Namespace, client: Any) -> int:
    verb = BY_COMMAND.get(args.command)
    if verb is not None:
        return call_verb(verb, args, client)
    command = {"generate": generate_command, "run-policy": run_policy_command, "cancel": cancel_command,
               "goals": goals_command, "status": status_command, "param": param_command,
               "diagnostics": diagnostics_command}.get(args.command)
    if command is None:  # pragma: no cover - argparse prevents it
        return EXIT_USAGE
    return command(args, client)


__all__ = ["EXIT_CANCELLED", "EXIT_CODES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED",
           "EXIT_UNREACHABLE", "EXIT_USAGE", "BY_COMMAND", "bt_run_options", "cli_hint", "code_name",
           "interrupted_exit", "main"]
