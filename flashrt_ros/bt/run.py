"""``flashrt bt run TREE.xml``: load a BehaviorTree.CPP tree, tick it at a rate, print what changes.

One thread does everything: tick the tree, then spin the client's node until the
next tick is due, so the flashrt nodes' futures complete between ticks and no
tick waits on the network. Ctrl-C halts the tree: running goals are cancelled at
their next committed boundary, and bt run exits once each has reported its result
(BT.CPP's halt is synchronous; a node takes its next goal only after that). A
second Ctrl-C stops waiting. Ctrl-C is taken only between spin slices and ticks
(the client's ``sigint_at_safe_points``): landing inside rclpy it once broke a
feedback message's conversion, and the process exited 1 instead of halting the tree.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

TREES_DIR = Path(__file__).with_name("trees")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def resolve_tree(path: str) -> Path:
    """A path as given, else a file of the installed tree library (``interrupt_pause_resume.xml``)."""
    given = Path(path)
    if given.exists():
        return given
    library = TREES_DIR / given.name
    if library.exists():
        return library
    raise FileNotFoundError(f"no tree file {path!r} (nor {library})")


def blackboard_value(text: str) -> Any:
    """``-b key:=value``'s value: bool (true/false), int, float, else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def fill_blackboard(blackboard: Any, entries: list[str]) -> None:
    setters = {bool: blackboard.set_bool, int: blackboard.set_int, float: blackboard.set_double,
               str: blackboard.set_string}
    for entry in entries:
        key, sep, text = entry.partition(":=")
        if not sep or not key:
            raise ValueError(f"blackboard entry {entry!r}: write KEY:=VALUE")
        value = blackboard_value(text)
        setters[type(value)](key.strip(), value)


def run_tree(path: str, *, node: str = "/flashrt", rate_hz: float = 20.0, groot_port: int | None = None,
             blackboard: list[str] | None = None, max_seconds: float = 0.0, wait_s: float = 30.0,
             out: TextIO = sys.stdout, stop: Callable[[], bool] | None = None) -> int:
    """Tick the tree until it ends (0: SUCCESS, 1: FAILURE), ``max_seconds`` pass (1) or Ctrl-C (130).

    Before the first tick it waits up to ``wait_s`` for the node's services and actions to be
    discovered (a fresh process needs a moment); ticks themselves never wait.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    import behaviortreepy as bt

    from flashrt_ros.bt.btcpp import FlashRTTrees, TreeXMLError
    from flashrt_ros.client import FlashRTClient

    if rate_hz <= 0:
        print("--rate must be > 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        tree_file = resolve_tree(path)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    # args: only the program name; rcl would read -b KEY:=VALUE in sys.argv as remap rules.
    rclpy.init(args=["flashrt"], signal_handler_options=SignalHandlerOptions.NO)
    ros_node = rclpy.create_node(f"flashrt_bt_{os.getpid()}")
    executor = SingleThreadedExecutor()
    executor.add_node(ros_node)
    say = lambda line: print(line, file=out, flush=True)  # noqa: E731
    start = time.monotonic()
    try:
        trees = FlashRTTrees(FlashRTClient(ros_node, node),
                             on_event=lambda name, event, detail: say(
                                 f"{time.monotonic() - start:8.3f}  {name}: {event}"
                                 + (f" ({detail})" if detail else "")))
        bb = bt.Blackboard.create()
        try:
            fill_blackboard(bb, blackboard or [])
            tree = trees.load_file(tree_file, bb)
        except (TreeXMLError, ValueError, RuntimeError) as exc:
            print(f"cannot load {tree_file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        publisher = None
        if groot_port is not None:
            if not bt.GROOT2_AVAILABLE:
                print("this behaviortreepy build has no Groot2 support", file=sys.stderr)
                return EXIT_USAGE
            publisher = bt.Groot2Publisher(tree, groot_port)   # noqa: F841 - alive while the tree runs
            say(f"publishing to Groot2 on port {groot_port} (and {groot_port + 1})")
        client = trees.client
        found = _spin_until(executor, time.monotonic() + wait_s, lambda: client.wait_for("list", 0.0)
                            and client.run_policy_ready() and client.generate_ready())
        if not found:
            say(f"warning: {node} not found within {wait_s:g} s (is it running, on this ROS_DOMAIN_ID?); "
                "ticking anyway")
        say(f"ticking {tree_file.name} at {rate_hz:g} Hz against {node}")
        period, last, next_tick = 1.0 / rate_hz, None, time.monotonic()
        interrupted = client.raise_if_interrupted      # where a deferred Ctrl-C is raised
        try:
            with client.sigint_at_safe_points():
                while True:
                    interrupted()
                    status = tree.tick_once()
                    if status != last:
                        say(f"{time.monotonic() - start:8.3f}  tree: {status.name}")
                        last = status
                    if status in (bt.NodeStatus.SUCCESS, bt.NodeStatus.FAILURE):
                        return EXIT_OK if status == bt.NodeStatus.SUCCESS else EXIT_FAILED
                    if (max_seconds and time.monotonic() - start > max_seconds) or (stop is not None and stop()):
                        outcome = _halt(tree, executor, client, say)
                        say(f"stopped after {time.monotonic() - start:.1f} s, tree halted{outcome}")
                        return EXIT_FAILED
                    next_tick += period
                    _spin_until(executor, next_tick, between_slices=interrupted)
        except KeyboardInterrupt:
            say(f"interrupted: tree halted{_halt(tree, executor, client, say)}")
            return EXIT_INTERRUPTED
    finally:
        executor.shutdown()
        ros_node.destroy_node()
        rclpy.try_shutdown()


def _halt(tree: Any, executor: Any, client: Any, say: Callable[[str], None]) -> str:
    """Halt the tree and wait until each goal it cancelled has reported its result.

    A node ends a cancelled goal at its next committed boundary (after any rollback) and
    refuses another goal until then: exiting at once made the next tree's RunPolicy meet
    BUSY. The wait is bounded (``SETTLE_TIMEOUT_S``: a silent goal is given up on) and a
    second Ctrl-C ends it. Returns how the halt ended, for the last line printed."""
    from flashrt_ros.bt.requests import SETTLE_TIMEOUT_S, halted_goals_settled, unsettled_goals

    tree.halt_tree()
    if halted_goals_settled(client):
        return ""
    count = lambda n: f"{n} cancelled goal{'s' if n != 1 else ''}"  # noqa: E731
    say(f"waiting for {count(unsettled_goals(client))} to end (Ctrl-C again: stop waiting)")
    waited_from = time.monotonic()
    try:
        with client.sigint_at_safe_points():
            _spin_until(executor, time.monotonic() + SETTLE_TIMEOUT_S + 1.0,
                        lambda: halted_goals_settled(client), between_slices=client.raise_if_interrupted)
    except KeyboardInterrupt:
        pass
    left = unsettled_goals(client)
    if left:
        return f"; stopped waiting: {count(left)} had not ended (the node may still be running it)"
    if time.monotonic() - waited_from >= SETTLE_TIMEOUT_S:     # settled() gave a silent goal up
        return f"; gave up after {SETTLE_TIMEOUT_S:g} s: a cancelled goal did not report its result"
    return ", every cancelled goal ended"


def _spin_until(executor: Any, deadline: float, done: Callable[[], bool] | None = None,
                between_slices: Callable[[], None] | None = None) -> bool:
    """Spin in slices of at most 50 ms until ``deadline`` or ``done()``; returns whether done.

    ``between_slices`` runs before each slice: where a deferred Ctrl-C is raised, never
    inside rclpy (a KeyboardInterrupt there can break a message conversion half-way)."""
    while (left := deadline - time.monotonic()) > 0:
        if between_slices is not None:
            between_slices()
        if done is not None and done():
            return True
        executor.spin_once(timeout_sec=min(left, 0.05))
    return done is not None and done()
