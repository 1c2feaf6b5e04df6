"""The goal commands: ``generate`` and ``run-policy`` (a goal run to its result, Ctrl-C cancels it
first), ``goals`` (the node's running goal) and ``cancel``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flashrt_ros.client.core import OutputClosed
from flashrt_ros.cli.exit_status import (EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, code_name,
                                         interrupted_exit)
from flashrt_ros.interface.actions import GENERATE, RUN_POLICY, ActionDecl

# An interrupt that got no final result back: a goal sent was cancelled (through its handle, or by id
# when its acceptance never came), but nothing confirms it ended; say so rather than "cancelled".
NO_RESULT = ("a cancel was sent for any goal this command had started, but no final result came back; "
             "`flashrt goals` shows whether one still runs (its lease ends it otherwise)")
#: A goal this command did not cancel ended cancelled: someone else cancelled it.
CANCELLED_BY_ANOTHER = "cancelled by another client (flashrt cancel, or another program)"


def add_goal_command(sub: Any, decl: ActionDecl) -> argparse.ArgumentParser:
    """An action's sub-command with its goal fields' options, from their declarations (a positional
    field as an argument, a bool one as a switch); the caller adds the command's own options."""
    s = sub.add_parser(decl.command, help=decl.summary)
    for f in decl.cli_fields:
        doc = f.cli_help or f.doc
        if f.positional:
            s.add_argument(f.name, help=doc)
        elif f.kind is bool:
            s.add_argument(f.cli_option, action="store_true", help=doc)
        else:
            s.add_argument(f.cli_option, type=f.kind, default=f.default,
                           metavar=f.cli_metavar, help=doc)
    return s


def goal_fields(decl: ActionDecl, args: argparse.Namespace) -> dict[str, Any]:
    """The goal fields the command line gives (every option of ``add_goal_command``)."""
    return {f.name: f.cli_value(getattr(args, f.cli_dest)) for f in decl.cli_fields}


def generate_command(args: argparse.Namespace, client: Any) -> int:
    printed: list[str] = []

    def stream(feedback: Any) -> None:
        printed.append(feedback.text_piece)
        print(feedback.text_piece, end="", flush=True)

    try:
        fields = goal_fields(GENERATE, args)
        outcome = client.generate(fields.pop("prompt"), feedback=stream, wait_s=args.timeout,
                                  timeout_s=args.max_seconds, **fields)
    except KeyboardInterrupt as interrupt:
        print()
        result = getattr(interrupt, "result", None)
        if result is None:
            print(f"interrupted: {NO_RESULT}", file=sys.stderr)
            return interrupted_exit(interrupt)
        print(f"interrupted: generation cancelled at position {result.position}", file=sys.stderr)
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
    drafts = getattr(r, "drafted_tokens", 0)
    speculation = f", drafts accepted {r.accepted_tokens}/{drafts}" if drafts else ""
    print(f"[{len(r.token_ids)} tokens, stop: {r.stop_reason}, ttft {r.ttft_ms:.1f} ms, "
          f"{r.tokens_per_second:.1f} tok/s, position {r.position}{speculation}]", file=sys.stderr)
    if r.stop_reason == "cancelled":
        print(f"generation {CANCELLED_BY_ANOTHER} at position {r.position}", file=sys.stderr)
        return EXIT_CANCELLED
    return EXIT_OK


def _print_missing_text(streamed: str, full: str) -> None:
    """Feedback can arrive late or not at all: complete the streamed text from the result's."""
    if streamed == full:
        return
    if full.startswith(streamed):
        print(full[len(streamed):], end="")
    else:
        print(f"\n[streamed feedback was incomplete; the whole text:]\n{full}", end="")


def run_policy_command(args: argparse.Namespace, client: Any) -> int:
    if args.max_steps < 0 or args.max_duration < 0 or not (args.max_steps or args.max_duration):
        print("error: give --max-steps N and/or --max-duration S (a goal must end by itself)",
              file=sys.stderr)
        return EXIT_USAGE

    def step(feedback: Any) -> None:
        try:
            if feedback.state == "waiting":              # printed even with --quiet: it explains a stall
                print(f"waiting {feedback.waiting_s:.1f} s after {feedback.steps} steps: {feedback.waiting_for}",
                      flush=True)
            elif not args.quiet:
                action = ", ".join(f"{a:.4f}" for a in feedback.last_action)
                print(f"step {feedback.steps}: [{action}]", flush=True)
        except BrokenPipeError:                          # `run-policy | head`: stop (the goal is cancelled) quietly
            client.request_stop()

    try:
        outcome = client.run_policy(feedback=step, wait_s=args.timeout, **goal_fields(RUN_POLICY, args))
    except OutputClosed:
        raise                                            # the goal is cancelled; main exits quietly
    except KeyboardInterrupt as interrupt:
        result = getattr(interrupt, "result", None)
        if result is None:
            print(f"\ninterrupted: {NO_RESULT}", file=sys.stderr)
            return interrupted_exit(interrupt)
        back = ", rolled back to the goal's start" if result.rolled_back else ""
        print(f"\ninterrupted: goal cancelled after {result.steps} steps{back}", file=sys.stderr)
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
    if r.stop_reason == "cancelled":
        back = ", rolled back to the goal's start" if r.rolled_back else ""
        print(f"goal {CANCELLED_BY_ANOTHER} after {r.steps} steps{back}", file=sys.stderr)
        return EXIT_CANCELLED
    if r.stop_reason == "deactivated":
        print(f"error: the goal ended after {r.steps} steps: the node was deactivated", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cancel_command(args: argparse.Namespace, client: Any) -> int:
    from flashrt_ros.client.goal_admin import cancel_goals
    cancelled = cancel_goals(client, "" if args.all else args.goal_id, timeout_s=args.timeout)
    if not cancelled:
        print(f"no goal was running on {args.node}")
        return EXIT_OK
    for goal in cancelled:
        owner = f" from '{goal.owner}'" if goal.owner else ""
        print(f"cancelled {goal.action} goal {goal.goal_id}{owner}: {goal.state}")
    return EXIT_OK if all(g.state == "ended" for g in cancelled) else EXIT_FAILED


def goals_command(args: argparse.Namespace, client: Any) -> int:
    from flashrt_ros.client.goal_admin import running_goal
    goal = running_goal(client, timeout_s=args.timeout)
    if goal is None:
        print(f"no goal is running on {args.node}")
    else:
        print(f"{goal.goal_id}  {goal.action}  from '{goal.owner or '(no owner given)'}'  {goal.state}")
    return EXIT_OK
