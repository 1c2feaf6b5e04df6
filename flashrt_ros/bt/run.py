"""``flashrt bt run TREE.xml``: load a BehaviorTree.CPP tree, tick it at a rate, print what changes.

One thread does everything: tick the tree, then spin the client's node until the
next tick is due, so the flashrt nodes' futures complete, topic messages arrive
(``--bb-topic`` entries are written to the blackboard before each tick); no tick
waits on the network. The goals' leases are renewed by the client's own thread
(``client/lease.py``), so a long tick does not lose them.

Stopping. Ctrl-C, SIGTERM and ``--max-seconds`` halt the tree: running goals are
cancelled at their next committed boundary, and bt run exits once each has
reported its result (a node takes its next goal only after that). A second
signal stops waiting. Signals are taken only between spin slices and ticks (the
client's ``sigint_at_safe_points``): landing inside rclpy one once broke a
feedback message's conversion. A watchdog outside Python (``faulthandler``, a C
thread that needs no interpreter lock) ends the process if a tick or a halt
ever takes longer than ``TICK_STALL_S``, printing where it was stuck; the goals
it leaves end when their leases are not renewed (``--lease``, default 2 s).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from flashrt_ros.cli.exit_status import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED,  # noqa: F401
                                         EXIT_UNREACHABLE, EXIT_USAGE)

TREES_DIR = Path(__file__).with_name("trees")
#: A tick (or halt) that takes longer than this is stuck: the watchdog ends the process.
TICK_STALL_S = 10.0


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
    """``-b key:=value``'s value: bool (true/false), int, float, else the string; quotes force a string."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        return stripped[1:-1]
    low = stripped.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(stripped)
        except ValueError:
            pass
    return text


def fill_blackboard(blackboard: Any, entries: list[str], text_keys: set[str] | frozenset[str] = frozenset()) -> None:
    """Set ``KEY:=VALUE`` entries; a number read by an unsigned built-in port (``text_keys``) is set as
    text, which BT.CPP converts to the port's type (an ``int`` entry would be refused there)."""
    setters = {bool: blackboard.set_bool, int: blackboard.set_int, float: blackboard.set_double,
               str: blackboard.set_string}
    for entry in entries:
        key, sep, text = entry.partition(":=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"blackboard entry {entry!r}: write KEY:=VALUE")
        value = blackboard_value(text)
        if key in text_keys and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        setters[type(value)](key, value)


def parse_topic_entries(entries: list[str]) -> list[tuple[str, str, str]]:
    """``KEY:=TOPIC[:TYPE]`` -> (key, topic, type or "")."""
    parsed = []
    for entry in entries:
        key, sep, rest = entry.partition(":=")
        topic, _, type_name = rest.partition(":")
        if not sep or not key.strip() or not topic.strip().startswith("/"):
            raise ValueError(f"--bb-topic {entry!r}: write KEY:=/TOPIC or KEY:=/TOPIC:std_msgs/msg/Bool")
        parsed.append((key.strip(), topic.strip(), type_name.strip()))
    return parsed


class TopicFeed:
    """``--bb-topic``: the newest ``data`` of each mapped topic, written to the blackboard between ticks."""

    def __init__(self, topics: Any, blackboard: Any, mapping: list[tuple[str, str, str]]) -> None:
        from flashrt_ros.bt.topics import SCALARS
        self._blackboard, self._keys = blackboard, {}
        self._pending: dict[str, Any] = {}
        self._scalars = SCALARS
        self._topics, self._mapping = topics, mapping
        topics.on_message = self._on_message

    def subscribe(self) -> list[str]:
        """Subscribe what can be; returns the topics whose type is not known yet."""
        missing = []
        for key, topic, type_name in self._mapping:
            if not self._topics.subscribe(topic, type_name):
                missing.append(topic)
                continue
            resolved = self._topics.resolve_type(topic, type_name)
            if resolved not in self._scalars:
                from flashrt_ros.bt.topics import TopicError
                raise TopicError(f"--bb-topic {key}:={topic}: {resolved} has no single value; use a std_msgs "
                                 f"scalar ({', '.join(sorted(self._scalars))}), or TopicCondition in the tree")
            self._keys.setdefault(topic, []).append(key)
        return missing

    def _on_message(self, topic: str, msg: Any) -> None:
        if topic in self._keys:
            self._pending[topic] = msg.data

    def apply(self) -> None:
        """Write what arrived since the last tick (the executor has no callback running now)."""
        pending, self._pending = self._pending, {}
        for topic, value in pending.items():
            for key in self._keys[topic]:
                setter = {bool: "set_bool", int: "set_int", float: "set_double"}.get(type(value), "set_string")
                getattr(self._blackboard, setter)(key, value)


@contextlib.contextmanager
def watchdog() -> Iterator[None]:
    """End the process (exit 1, every thread's stack printed) if the block takes over ``TICK_STALL_S``.

    ``faulthandler``'s timer is a C thread: it fires even while a stuck C++ call holds the
    interpreter lock, when no Python signal handler or thread can run."""
    faulthandler.dump_traceback_later(TICK_STALL_S, exit=True, file=_stderr_with_fd())
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _stderr_with_fd() -> TextIO:
    """``sys.stderr`` if it is a real file (faulthandler writes to its descriptor), else the process's."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):      # e.g. replaced by an in-memory capture
        return sys.__stderr__


def run_tree(path: str, *, node: str = "/flashrt", rate_hz: float = 20.0, groot_port: int | None = None,
             blackboard: list[str] | None = None, max_seconds: float = 0.0, wait_s: float = 30.0,
             out: TextIO = sys.stdout, stop: Callable[[], bool] | None = None, lease_s: float | None = None,
             owner: str = "", bb_topics: list[str] | None = None, btlog: str | None = None,
             trace: bool = False) -> int:
    """Tick the tree until it ends (0: SUCCESS, 1: FAILURE), ``max_seconds`` pass (1), Ctrl-C (130)
    or SIGTERM (143). 2: the tree does not load; 3: a node it calls is not found within ``wait_s``.

    Before the first tick it waits up to ``wait_s`` for the services and actions the tree calls
    (on every node it names) and for the types of ``bb_topics``; ticks themselves never wait.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    import behaviortreepy as bt

    from flashrt_ros.bt.btcpp import FlashRTTrees, TreeXMLError
    from flashrt_ros.bt.topics import TopicError
    from flashrt_ros.client import FlashRTClient, Terminated
    from flashrt_ros.client.lease import DEFAULT_LEASE_S

    if rate_hz <= 0:
        print("--rate must be > 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        tree_file = resolve_tree(path)
        topic_map = parse_topic_entries(bb_topics or [])
    except (FileNotFoundError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    # args: only the program name; rcl would read -b KEY:=VALUE in sys.argv as remap rules.
    rclpy.init(args=["flashrt"], signal_handler_options=SignalHandlerOptions.NO)
    ros_node = rclpy.create_node(f"flashrt_bt_{os.getpid()}")
    executor = SingleThreadedExecutor()
    executor.add_node(ros_node)
    say = lambda line: print(line, file=out, flush=True)  # noqa: E731
    start = time.monotonic()
    trees = None
    try:
        client = FlashRTClient(ros_node, node, lease_s=DEFAULT_LEASE_S if lease_s is None else lease_s,
                               owner=owner)
        trees = FlashRTTrees(client, on_event=lambda name, event, detail: say(
            f"{time.monotonic() - start:8.3f}  {name}: {event}" + (f" ({detail})" if detail else "")))
        bb = bt.Blackboard.create()
        try:
            xml = trees.prepare(tree_file.read_text())
            fill_blackboard(bb, blackboard or [], trees.unsigned_keys)
            tree = trees.factory.create_tree_from_text(xml, bb)
            feed = TopicFeed(trees.topics, bb, topic_map)
        except (TreeXMLError, ValueError, RuntimeError) as exc:
            print(f"cannot load {tree_file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        loggers = []                                     # alive while the tree runs
        if groot_port is not None:
            if not bt.GROOT2_AVAILABLE:
                print("this behaviortreepy build has no Groot2 support", file=sys.stderr)
                return EXIT_USAGE
            loggers.append(bt.Groot2Publisher(tree, groot_port))
            say(f"publishing to Groot2 on port {groot_port} (and {groot_port + 1})")
        if btlog:
            loggers.append(bt.FileLogger(tree, btlog))
            say(f"logging every transition to {btlog} (open it in Groot2's log replay)")
        if trace:
            loggers.append(bt.StdCoutLogger(tree))
        with client.sigint_at_safe_points():
            try:
                problem = _wait_for_world(trees, feed, executor, wait_s, client.raise_if_interrupted)
            except TopicError as exc:
                print(f"cannot run {tree_file.name}: {exc}", file=sys.stderr)
                return EXIT_USAGE
            except KeyboardInterrupt as interrupt:
                return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
            if problem:
                print(f"{problem} within {wait_s:g} s (is it running, on this ROS_DOMAIN_ID? --timeout "
                      "sets the wait)", file=sys.stderr)
                return EXIT_UNREACHABLE
            say(f"ticking {tree_file.name} at {rate_hz:g} Hz against {node}")
            period, last, next_tick = 1.0 / rate_hz, None, time.monotonic()
            interrupted = client.raise_if_interrupted      # where a deferred signal is raised
            try:
                while True:
                    interrupted()
                    feed.apply()
                    with watchdog():
                        status = tree.tick_once()
                    if status != last:
                        say(f"{time.monotonic() - start:8.3f}  tree: {status.name}")
                        last = status
                    if status in (bt.NodeStatus.SUCCESS, bt.NodeStatus.FAILURE):
                        settled = _settle(executor, client, say)      # e.g. a goal its last Timeout halted
                        if settled:
                            say(f"{time.monotonic() - start:8.3f}  after the tree ended{settled}")
                        return EXIT_OK if status == bt.NodeStatus.SUCCESS else EXIT_FAILED
                    if (max_seconds and time.monotonic() - start > max_seconds) or (stop is not None and stop()):
                        outcome = _halt(tree, executor, client, say)
                        say(f"stopped after {time.monotonic() - start:.1f} s, tree halted{outcome}")
                        return EXIT_FAILED
                    next_tick += period
                    _spin_until(executor, next_tick, between_slices=interrupted)
            except KeyboardInterrupt as interrupt:
                what = "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"
                say(f"{what}: tree halted{_halt(tree, executor, client, say)}")
                return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
    finally:
        if trees is not None:
            trees.close()
            trees.client.close()
        executor.shutdown()
        ros_node.destroy_node()
        rclpy.try_shutdown()


def _wait_for_world(trees: Any, feed: TopicFeed, executor: Any, wait_s: float,
                    interrupted: Callable[[], None]) -> str:
    """Spin until every service and action the tree calls is discovered, every ``--bb-topic`` is
    subscribed and every topic its nodes name has a publisher; returns what is still missing
    after ``wait_s`` ("" when nothing is)."""
    def missing() -> list[str]:
        gone = [f"{ns}: {', '.join(sorted(verbs))}" for ns, verbs in trees.nodes_used.items()
                if not all(_ready(trees.client_for(ns), verb) for verb in verbs)]
        topics = feed.subscribe()
        unread = trees.subscribe_topics()
        return gone + ([f"no type for {', '.join(topics)} (nobody advertises it yet: give it, "
                        "KEY:=/TOPIC:std_msgs/msg/Bool)"] if topics else []) + \
            ([f"no publisher of {', '.join(unread)}, which the tree reads"] if unread else [])

    if _spin_until(executor, time.monotonic() + wait_s, lambda: not missing(), between_slices=interrupted):
        return ""
    left = missing()
    return "" if not left else "not found: " + "; ".join(left)


def _ready(client: Any, verb: str) -> bool:
    if verb == "run_policy":
        return client.run_policy_ready()
    if verb == "generate":
        return client.generate_ready()
    return client.wait_for(verb, 0.0)


def _halt(tree: Any, executor: Any, client: Any, say: Callable[[str], None]) -> str:
    """Halt the tree and wait until each goal it cancelled has reported its result.

    A node ends a cancelled goal at its next committed boundary (after any rollback) and
    refuses another goal until then: exiting at once made the next tree's RunPolicy meet
    BUSY. The wait is bounded (``SETTLE_TIMEOUT_S``: a silent goal is given up on) and a
    second signal ends it. Returns how the halt ended, for the last line printed."""
    with watchdog():
        tree.halt_tree()
    return _settle(executor, client, say)


def _settle(executor: Any, client: Any, say: Callable[[str], None]) -> str:
    """Wait until every goal the tree halted has reported its result (bounded; a second Ctrl-C
    stops waiting); "" when none was left, else how the wait ended."""
    from flashrt_ros.bt.requests import SETTLE_TIMEOUT_S, halted_goals_settled, unsettled_goals

    if halted_goals_settled(client):
        return ""
    count = lambda n: f"{n} cancelled goal{'s' if n != 1 else ''}"  # noqa: E731
    say(f"waiting for {count(unsettled_goals(client))} to end (Ctrl-C: stop waiting)")
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
