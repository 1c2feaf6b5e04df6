"""`flashrt`: the command line for machines without ros2cli.

Mirrors ``ros2 service call`` / ``ros2 action send_goal`` against a running
node (``--namespace``, default /flashrt), plus ``serve`` (run the node, configured
and active) and ``demo`` (the scripted session of the README). Exit status 0 on
success, 1 when the node answered success=false, 2 on usage errors, 3 when the
node could not be reached.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashrt", description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", default="/flashrt",
                   help="the node's fully qualified name (default /flashrt)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the node (configured and activated)")
    s.add_argument("--params-file", help="ROS parameters YAML (e.g. config/llm.yaml)")
    s.add_argument("--engine-kind", choices=("llm", "policy"))
    s.add_argument("--model", help="model source (default smollm2)")
    s.add_argument("--policy", help="policy for engine_kind=policy (gru | transformer)")
    s.add_argument("--node-namespace", default="", help="ROS namespace of the node")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                   help="extra parameter, as in --ros-args -p")

    s = sub.add_parser("snapshot", help="snapshot the live state into a capsule")
    s.add_argument("name")
    s.add_argument("--tier", default="", choices=("", "device", "host", "disk"))
    s.add_argument("--session", default="")
    s.add_argument("--pin", action="store_true")
    s.add_argument("--overwrite", action="store_true")
    s = sub.add_parser("restore", help="restore a capsule into the live state")
    s.add_argument("name")
    s.add_argument("--verify", action="store_true", help="re-hash the capsule first")
    s = sub.add_parser("fork", help="copy a capsule into a new one")
    s.add_argument("source")
    s.add_argument("name")
    s.add_argument("--tier", default="", choices=("", "device", "host", "disk"))
    s = sub.add_parser("rollback", help="go back N committed boundaries")
    s.add_argument("steps", type=int)
    for verb, text in (("drop", "delete a capsule"), ("save", "write a capsule to disk"),
                       ("load", "read a capsule from the capsule directory")):
        sub.add_parser(verb, help=text).add_argument("name")
    s = sub.add_parser("verify", help="re-hash a capsule (and compare with the live state)")
    s.add_argument("name")
    s.add_argument("--live", action="store_true", help="also compare with the live state")
    s = sub.add_parser("list", help="list capsules")
    s.add_argument("--session", default="")
    for verb, text in (("reset", "reset the engine state (capsules stay)"),
                       ("pause", "pause the policy loop"), ("resume", "resume the policy loop")):
        sub.add_parser(verb, help=text)
    s = sub.add_parser("generate", help="generate text (streams tokens)")
    s.add_argument("prompt")
    s.add_argument("--max-new-tokens", type=int, default=0)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--raw", action="store_true", help="no chat template")
    s.add_argument("--reset", action="store_true", help="start from an empty context")
    s = sub.add_parser("demo", help="start a node on SmolLM2 and run the scripted capsule session")
    s.add_argument("--model", default="smollm2")
    s.add_argument("--tokens", type=int, default=24, help="tokens per generation")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "demo":
        from flashrt_ros.demo import run_demo
        return run_demo(model=args.model, tokens=args.tokens)
    return _call(args)


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
    if args.node_namespace:
        ros_args += ["-r", f"__ns:={args.node_namespace}"]
    return node_main(ros_args)


def _call(args: argparse.Namespace) -> int:
    import rclpy
    from flashrt_ros.client import FlashRTClient, ServiceCallError

    rclpy.init(args=None)
    node = rclpy.create_node(f"flashrt_cli_{os.getpid()}")
    client = FlashRTClient(node, args.namespace)
    try:
        return _dispatch(args, client)
    except ServiceCallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if exc.response is None else 1
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


def _dispatch(args: argparse.Namespace, client: Any) -> int:
    t = args.timeout
    c = args.command
    if c == "snapshot":
        r = client.call("snapshot", timeout_s=t, name=args.name, tier=args.tier,
                        session=args.session, pin=args.pin, overwrite=args.overwrite)
    elif c == "restore":
        r = client.call("restore", timeout_s=t, name=args.name, verify=args.verify)
    elif c == "fork":
        r = client.call("fork", timeout_s=t, source=args.source, name=args.name, tier=args.tier)
    elif c == "rollback":
        if args.steps < 1:
            print("error: steps must be >= 1", file=sys.stderr)
            return 2
        r = client.call("rollback", timeout_s=t, steps=args.steps)
    elif c in ("drop", "save", "load"):
        r = client.call(c, timeout_s=t, name=args.name)
    elif c == "verify":
        r = client.call("verify", timeout_s=t, name=args.name, against_live=args.live)
    elif c == "list":
        r = client.call("list", timeout_s=t, session=args.session)
        print(format_capsule_table(r.capsules))
        print(f"tiers: device {r.device_bytes} B, host {r.host_bytes} B, disk {r.disk_bytes} B")
        return 0
    elif c in ("reset", "pause", "resume"):
        r = client.call(c, timeout_s=t)
    elif c == "generate":
        return _generate(args, client)
    else:  # pragma: no cover - argparse prevents it
        return 2
    latency = getattr(r, "engine_latency_ms", None)
    print(r.message + (f"  [{latency:.3f} ms in engine]" if latency is not None else ""))
    return 0


def _generate(args: argparse.Namespace, client: Any) -> int:
    printed: list[str] = []

    def stream(feedback: Any) -> None:
        printed.append(feedback.text_piece)
        print(feedback.text_piece, end="", flush=True)

    outcome = client.generate(args.prompt, feedback=stream, timeout_s=max(args.timeout, 600),
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                              use_chat_template=not args.raw, reset=args.reset)
    if not outcome.accepted:
        print()
        print("error: goal rejected (node not active, or a generation is already running)",
              file=sys.stderr)
        return 1
    r = outcome.result
    _print_missing_text("".join(printed), r.text)
    print()
    if not r.success:
        print(f"error: {r.message}", file=sys.stderr)
        return 1
    print(f"[{len(r.token_ids)} tokens, stop: {r.stop_reason}, ttft {r.ttft_ms:.1f} ms, "
          f"{r.tokens_per_second:.1f} tok/s, position {r.position}]", file=sys.stderr)
    return 0


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
