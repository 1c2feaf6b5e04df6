"""`flashrt`: the command line for machines without ros2cli.

Mirrors ``ros2 service call`` / ``ros2 action send_goal`` against a running
node (``--node``, its fully qualified name, default /flashrt), plus ``serve``
(run the node, configured and active; ``serve --namespace`` puts it in a ROS
namespace) and ``demo`` (the scripted session of the README).
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import re
import sys
from typing import Any, Sequence

from flashrt_ros.ros.service_verbs import VERBS, ServiceVerb

#: capsule verbs by their sub-command (``close-session``)
BY_COMMAND = {verb.command: verb for verb in VERBS}

#: Exit status of every command (also printed by --help).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143
EXIT_CODES = f"""exit status:
  {EXIT_OK}    success
  {EXIT_FAILED}    the node answered success=false (or rejected the goal)
  {EXIT_USAGE}    bad usage
  {EXIT_UNREACHABLE}    the node could not be reached within --timeout
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a running generation, run-policy goal or tree is
       cancelled at its next committed boundary first
  {EXIT_TERMINATED}  terminated (SIGTERM): the same orderly stop as Ctrl-C"""


def interrupted_exit(interrupt: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (``client.Terminated``)."""
    from flashrt_ros.client import Terminated
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


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
                        "the command dies or hangs, the node ends its goal this long after the "
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
        _add_verb_command(sub, verb)
    s = sub.add_parser("generate", help="generate text (streams tokens)")
    s.add_argument("prompt")
    s.add_argument("--max-new-tokens", type=int, default=0)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--raw", action="store_true", help="no chat template")
    s.add_argument("--reset", action="store_true", help="start from an empty context")
    s.add_argument("--max-seconds", type=float, default=600.0,
                   help="give up (and cancel) after this long (default 600)")
    s.add_argument("--session", default="", help="conversation to continue (default: the current one)")
    s = sub.add_parser("status", help="print the node's ~/status (lifecycle, engine, policy inputs)")
    s.add_argument("--watch", action="store_true", help="print every status message until Ctrl-C")
    s.add_argument("--count", type=int, default=0, metavar="N",
                   help="with --watch: stop after N messages (exit 0)")
    s = sub.add_parser("run-policy", help="run the policy for a bounded time (RunPolicy action; "
                                          "prints each step; Ctrl-C cancels)")
    s.add_argument("--max-steps", type=int, default=0, metavar="N", help="stop after N policy steps")
    s.add_argument("--max-duration", type=float, default=0.0, metavar="S", help="stop after S seconds")
    s.add_argument("--session", default="", help="capsule session to run in (default: the current one)")
    s.add_argument("--rollback-on-cancel", action="store_true",
                   help="a cancel (Ctrl-C) restores the state the goal started from")
    s.add_argument("--stale-timeout", type=float, default=0.0, metavar="S",
                   help="end the goal (STALE_INPUTS) after S s without fresh inputs (default: the node's "
                        "goal_stale_timeout_s; < 0: wait for ever)")
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
    s = sub.add_parser("demo", help="start a node on SmolLM2 and run the scripted capsule session")
    s.add_argument("--model", default="smollm2")
    s.add_argument("--tokens", type=int, default=24, help="tokens per generation")
    return p


def _add_verb_command(sub: Any, verb: ServiceVerb) -> None:
    """A capsule verb's sub-command, from its declaration: positional fields as arguments, the
    others as options (a bool one as a switch)."""
    s = sub.add_parser(verb.command, help=verb.summary)
    for f in verb.fields:
        if f.positional:
            s.add_argument(f.name, type=f.kind if f.kind in (int, float) else None, help=f.doc)
        elif f.kind is bool:
            s.add_argument(f"--{f.cli_dest.replace('_', '-')}", dest=f.cli_dest, action="store_true", help=f.doc)
        else:
            s.add_argument(f"--{f.cli_dest.replace('_', '-')}", dest=f.cli_dest, type=f.kind, default=f.default,
                           choices=f.choices or None, help=f.doc)


def verb_usage(verb: ServiceVerb) -> str:
    """``flashrt snapshot NAME [--tier TIER] [--session SESSION] [--pin] [--overwrite]``."""
    words = [f"flashrt {verb.command}"] + [f.name.upper() for f in verb.fields if f.positional]
    for f in verb.fields:
        if not f.positional:
            flag = "--" + f.cli_dest.replace("_", "-")
            words.append(f"[{flag}]" if f.kind is bool else f"[{flag} {f.cli_dest.upper()}]")
    return " ".join(words)


def verb_commands_markdown() -> str:
    """The capsule commands' table of docs/cli.md (generated; a test keeps the doc current)."""
    rows = ["| command | service | what |", "| --- | --- | --- |"]
    rows += [f"| `{verb_usage(v)}` | `~/{v.name}` | {v.summary} |" for v in VERBS]
    return "\n".join(rows) + "\n"


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
        if args.command == "demo":
            from flashrt_ros.demo import run_demo
            return run_demo(model=args.model, tokens=args.tokens)
        return _call(args)
    except KeyboardInterrupt as interrupt:
        print("\ninterrupted", file=sys.stderr)
        return interrupted_exit(interrupt)


def code_name(code: int) -> str:
    """An error code's name (``STALE_INPUTS``), or its number if this version does not know it."""
    from flashrt_ros.runtime.errors import ErrorCode
    try:
        return ErrorCode(int(code)).name
    except ValueError:
        return str(int(code))


def lease_of(args: argparse.Namespace) -> float:
    from flashrt_ros.goal_lease import DEFAULT_LEASE_S
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
        return _call_verb(verb, args, client)
    command = {"generate": _generate, "status": _status, "run-policy": _run_policy, "param": _param,
               "cancel": _cancel, "goals": _goals}.get(args.command)
    if command is None:  # pragma: no cover - argparse prevents it
        return EXIT_USAGE
    return command(args, client)


def _call_verb(verb: ServiceVerb, args: argparse.Namespace, client: Any) -> int:
    """Call a capsule verb with the command line's fields; print its answer."""
    fields = {f.name: getattr(args, f.cli_dest) for f in verb.fields}
    refused = next(filter(None, (f.below_minimum(fields[f.name]) for f in verb.fields)), None)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return EXIT_USAGE
    # --timeout bounds finding the node as well as the answer.
    r = client.call(verb.name, timeout_s=args.timeout, wait_s=args.timeout, **fields)
    if verb.name in _VERB_OUTPUT:
        print(_VERB_OUTPUT[verb.name](r))
        return EXIT_OK
    latency = getattr(r, "engine_latency_ms", None)
    print(r.message + (f"  [{latency:.3f} ms in engine]" if latency is not None else ""))
    return EXIT_OK


def _capsule_list(response: Any) -> str:
    return (format_capsule_table(response.capsules) + "\n"
            + f"tiers: device {response.device_bytes} B, host {response.host_bytes} B, disk {response.disk_bytes} B")


#: verbs whose answer is printed as more than its message
_VERB_OUTPUT = {"list": _capsule_list}


def _generate(args: argparse.Namespace, client: Any) -> int:
    printed: list[str] = []

    def stream(feedback: Any) -> None:
        printed.append(feedback.text_piece)
        print(feedback.text_piece, end="", flush=True)

    try:
        outcome = client.generate(args.prompt, feedback=stream, wait_s=args.timeout,
                                  timeout_s=args.max_seconds,
                                  max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed,
                                  use_chat_template=not args.raw, reset=args.reset,
                                  session=args.session)
    except KeyboardInterrupt as interrupt:
        print()
        result = getattr(interrupt, "result", None)
        where = f" at position {result.position}" if result is not None else ""
        print(f"interrupted: generation cancelled{where}", file=sys.stderr)
        return interrupted_exit(interrupt)
    if not outcome.accepted:
        print()
        print("error: goal rejected (node not active, or a generation is already running)",
              file=sys.stderr)
        return EXIT_FAILED
    r = outcome.result
    _print_missing_text("".join(printed), r.text)
    print()
    if not r.success:
        print(f"error ({code_name(r.error_code)}): {r.message}", file=sys.stderr)
        return EXIT_FAILED
    print(f"[{len(r.token_ids)} tokens, stop: {r.stop_reason}, ttft {r.ttft_ms:.1f} ms, "
          f"{r.tokens_per_second:.1f} tok/s, position {r.position}]", file=sys.stderr)
    return EXIT_OK


def format_status(msg: Any) -> str:
    """An EngineStatus as ``field: value`` lines (policy fields only for a policy node)."""
    fields = ["lifecycle_state", "engine_kind", "model", "device", "session", "busy", "position",
              "boundary_id", "capsule_count", "arena_bytes", "live_bytes", "step_p50_ms", "step_p99_ms"]
    if msg.engine_kind == "policy":
        fields += ["inputs_state", "inputs_detail", "policy_steps", "deadline_misses",
                   "rejected_messages"]
    width = max(map(len, fields))
    return "\n".join(f"{f.ljust(width)}  {getattr(msg, f)}" for f in fields)


def _status(args: argparse.Namespace, client: Any) -> int:
    if not args.watch:
        print(format_status(client.status(timeout_s=args.timeout)))
        return EXIT_OK
    seen: list[Any] = []

    def show(msg: Any) -> None:
        if args.count and len(seen) >= args.count:
            return                                       # several can arrive in one spin
        seen.append(msg)
        stamp = msg.stamp.sec + msg.stamp.nanosec * 1e-9
        print(f"--- {stamp:.3f}\n{format_status(msg)}", flush=True)

    client.watch_status(show)
    if not client.wait_until(lambda: bool(seen), args.timeout):
        print(f"error: no {client.namespace}/status message within {args.timeout:.1f} s (is the node "
              "running, and on the same ROS_DOMAIN_ID?)", file=sys.stderr)
        return EXIT_UNREACHABLE
    while not args.count or len(seen) < args.count:       # Ctrl-C ends it (exit 130)
        client.wait_until(lambda: False, 0.5)
    return EXIT_OK


def _run_policy(args: argparse.Namespace, client: Any) -> int:
    if args.max_steps < 0 or args.max_duration < 0 or not (args.max_steps or args.max_duration):
        print("error: give --max-steps N and/or --max-duration S (a goal must end by itself)",
              file=sys.stderr)
        return EXIT_USAGE

    def step(feedback: Any) -> None:
        if feedback.state == "waiting":                  # printed even with --quiet: it explains a stall
            print(f"waiting {feedback.waiting_s:.1f} s after {feedback.steps} steps: {feedback.waiting_for}",
                  flush=True)
        elif not args.quiet:
            action = ", ".join(f"{a:.4f}" for a in feedback.last_action)
            print(f"step {feedback.steps}: [{action}]", flush=True)

    try:
        outcome = client.run_policy(max_steps=args.max_steps, max_duration_s=args.max_duration,
                                    session=args.session, rollback_on_cancel=args.rollback_on_cancel,
                                    feedback=step, wait_s=args.timeout, stale_timeout_s=args.stale_timeout)
    except KeyboardInterrupt as interrupt:
        result = getattr(interrupt, "result", None)
        where = f" after {result.steps} steps" if result is not None else ""
        back = ", rolled back to the goal's start" if result is not None and result.rolled_back else ""
        print(f"\ninterrupted: goal cancelled{where}{back}", file=sys.stderr)
        return interrupted_exit(interrupt)
    if not outcome.accepted:
        print("error: goal rejected (node not active with a policy engine, or a goal is already "
              "running)", file=sys.stderr)
        return EXIT_FAILED
    r = outcome.result
    if not r.success:
        print(f"error ({code_name(r.error_code)}): {r.message}", file=sys.stderr)
        return EXIT_FAILED
    print(r.message)
    return EXIT_OK


def _cancel(args: argparse.Namespace, client: Any) -> int:
    from flashrt_ros.goal_admin import cancel_goals
    cancelled = cancel_goals(client, "" if args.all else args.goal_id, timeout_s=args.timeout)
    if not cancelled:
        print(f"no goal was running on {args.node}")
        return EXIT_OK
    for goal in cancelled:
        owner = f" from '{goal.owner}'" if goal.owner else ""
        print(f"cancelled {goal.action} goal {goal.goal_id}{owner}: {goal.state}")
    return EXIT_OK if all(g.state == "ended" for g in cancelled) else EXIT_FAILED


def _goals(args: argparse.Namespace, client: Any) -> int:
    from flashrt_ros.goal_admin import running_goal
    goal = running_goal(client, timeout_s=args.timeout)
    if goal is None:
        print(f"no goal is running on {args.node}")
    else:
        print(f"{goal.goal_id}  {goal.action}  from '{goal.owner or '(no owner given)'}'  {goal.state}")
    return EXIT_OK


def _param(args: argparse.Namespace, client: Any) -> int:
    if args.param_verb == "get":
        for name, value in client.get_parameters(args.names, timeout_s=args.timeout).items():
            print(f"{name}: {value!r}")
        return EXIT_OK
    from rclpy.parameter import get_parameter_value, parameter_value_to_python
    value = parameter_value_to_python(get_parameter_value(args.value))
    client.set_parameter(args.name, value, timeout_s=args.timeout)
    print(f"set {args.name} = {value!r}")
    return EXIT_OK


def _print_missing_text(streamed: str, full: str) -> None:
    """Feedback can arrive late or not at all: complete the streamed text from the result's."""
    if streamed == full:
        return
    if full.startswith(streamed):
        print(full[len(streamed):], end="")
    else:
        print(f"\n[streamed feedback was incomplete; the whole text:]\n{full}", end="")


def format_capsule_table(capsules: Sequence[Any]) -> str:
    """A fixed-width table of CapsuleInfo messages."""
    head = ("name", "session", "position", "boundary", "bytes", "tier", "pinned", "hash")
    rows = [head] + [(c.name, c.session, str(c.position), str(c.boundary_id), str(c.bytes), c.tier,
                      "yes" if c.pinned else "", c.content_hash[:12]) for c in capsules]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if not capsules:
        lines.append("(no capsules)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
