"""flashrt_node: a lifecycle node hosting one engine and its capsule services.

Transitions (ros2/demos lifecycle_py style):
- configure: build the engine (load weights, allocate the arena and capsule
  tiers, warm up / capture graphs). FAILURE, with the reason logged, on a bad
  model source, bad parameters or out of memory; the node stays unconfigured.
- activate: start serving: services and the generate action answer, the policy
  loop (engine_kind=policy) runs. State is kept across deactivate/activate;
  weights are never reloaded on activate.
- deactivate: stop the action and the control loop at the next boundary; the
  engine state and capsules stay.
- cleanup / shutdown: free the engine (weights, arena, capsules in memory).

The node is its lifecycle and its process; what it serves lives beside it:
- services (always advertised; NOT_ACTIVE unless active), under ~/ (default
  /flashrt/...): one per verb of ``interface/services.py``, each declared there once,
  its handler in ``verb_handlers.py`` calling the engine's capsule surface (``engine.capsules``,
  runtime/capsule_verbs.py), all served by ``state_services.StateServices``.
  Those that touch the live state run at a committed boundary; one that waits
  longer than ``boundary_timeout_s`` for a boundary answers TIMEOUT and changes
  nothing; store-only ones never hold the engine. No exception ever crosses a
  service, and the executor loop (``spinning.spin_until_shutdown``) survives
  any exception, so the node keeps running;
- the actions: ``~/generate`` (``generate_action.GenerateActionServer``, llm
  engine) and ``~/run_policy`` (``policy_action.PolicyActionServer``, policy
  engine); the policy's topics (``policy_io.PolicyTopics``, built on activate);
- ``~/status`` and ``/diagnostics`` (``diagnostics.py``), published here; how
  replanning goes (late plans, held steps) also in the log (``replan_log.py``).

Executors and threads: a MultiThreadedExecutor with separate callback groups
for the state services (reentrant: several clients at once), the generate
action, the control/status timers and (policy_io.py) the policy's input
subscriptions, so a long step never delays their receipt. The engine's
BoundaryGate serialises everything that touches state.

Sessions: a Generate goal naming a ``session`` other than the current one
parks the current state as a hidden capsule and restores that session's (a
new one starts empty) before it runs; ``~/status`` and ListCapsules report it.

Goals (RunPolicy, Generate) never outlive their clients: ``goals.GoalBook``
keeps each running goal's owner and lease, renewed on ``~/goal_heartbeat`` (read by
``heartbeats.HeartbeatListener`` on a thread of its own); the node's own beat,
``~/node_heartbeat`` (``node_beacon.NodeBeacon``, a thread too), tells clients it lives; a
second goal is aborted with BUSY naming the first. SIGINT and SIGTERM end every
goal at its next boundary (clients get a result), then the node exits.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.signals import SignalHandlerOptions

from flashrt_ros.interface.node_params import PARAMS, NodeConfig
from flashrt_ros.interface.parameters import first_problem
from flashrt_ros.interface.qos import STATUS_QOS, STATUS_TOPIC
from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS, RobotIOConfig
from flashrt_ros.msg import EngineStatus
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.diagnostics import diagnostics_message, status_summary
from flashrt_ros.ros.generate_action import GenerateActionServer
from flashrt_ros.ros.goals import GoalBook
from flashrt_ros.ros.heartbeats import HeartbeatListener
from flashrt_ros.ros.node_beacon import NodeBeacon
from flashrt_ros.ros.parameters import declare_parameters, read_config, refuse_invalid_sets
from flashrt_ros.ros.replan_log import ReplanLog
from flashrt_ros.ros.spinning import finish_dispatched, spin_until_shutdown
from flashrt_ros.ros.state_services import StateServices
from flashrt_ros.runtime.errors import NotActive


class FlashRTNode(LifecycleNode):
    """Hosts an LLM or policy engine; see the module docstring for the contract."""

    def __init__(self, node_name: str = "flashrt", **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        declare_parameters(self, (*PARAMS, *ROBOT_IO_PARAMS))
        self.add_on_set_parameters_callback(refuse_invalid_sets((*PARAMS, *ROBOT_IO_PARAMS)))
        self._engine: Any = None
        self._active = False
        self._lifecycle_name = "unconfigured"
        self._config = self._read_config()
        self._policy_io: Any = None
        self._shutting_down = False                  # set by shut_down_goals(): goals end, none starts
        self._goals = GoalBook(on_change=self._publish_status)
        self._replan_log = ReplanLog(self.get_logger())

        self._state_group = ReentrantCallbackGroup()
        self._action_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()

        self._state_services = StateServices(self, self._state_group, self._require_active,
                                             lambda: self._policy_io, lambda: self._config)
        self._generate_server = GenerateActionServer(self, self._action_group, lambda: self._engine,
                                                     lambda: self._active, lambda: self._config, self._goals,
                                                     lambda: self._shutting_down)
        from flashrt_ros.ros.policy_action import PolicyActionServer
        self._run_policy_server = PolicyActionServer(self, self._action_group,
                                                     lambda: self._policy_io, lambda: self._engine,
                                                     self._goals, lambda: self._shutting_down)
        # Heartbeats read on a thread of their own: never queued behind a step, a service or a goal.
        self._heartbeats = HeartbeatListener(self, self._goals)
        # ... and our own beat, from a thread of its own too: clients tell a dead or restarted node by it.
        self._beacon = NodeBeacon(self, lambda: self._lifecycle_name, self._goals.goal_ids)
        self._status_pub = self.create_publisher(EngineStatus, f"~/{STATUS_TOPIC}", STATUS_QOS.profile())
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._status_timer = self.create_timer(self._config.status_period_s, self._publish_status,
                                               callback_group=self._timer_group)
        self.get_logger().info(f"flashrt node created (engine_kind={self._config.engine_kind}, "
                               f"{self._hosted()}); waiting for configure")

    # --- parameters -----------------------------------------------------
    def _read_config(self) -> NodeConfig:
        """The parameters' values as they are (``on_configure`` checks them and fails with the reason)."""
        return read_config(self, NodeConfig, check=False)

    # --- lifecycle ------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Build the engine. SUCCESS: weights loaded, arena allocated, warmed up."""
        self._config = self._read_config()
        reason = first_problem(PARAMS, vars(self._config))
        if reason:
            self.get_logger().error(f"configure failed: {reason}")
            return TransitionCallbackReturn.FAILURE
        from flashrt_ros.engine.factory import build_engine
        t0 = time.perf_counter()
        try:
            lockstep = read_config(self, RobotIOConfig, check=False).control_trigger == "inputs"
            self._engine = build_engine(self._config, log=self.get_logger().info, lockstep=lockstep)
        except MemoryError as exc:
            self.get_logger().error(f"configure failed: out of memory: {exc}")
            return TransitionCallbackReturn.FAILURE
        except Exception as exc:   # noqa: BLE001 - any failure is reported, never raised
            self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
            self._engine = None
            return TransitionCallbackReturn.FAILURE
        self._lifecycle_name = "inactive"
        self.get_logger().info(f"configured in {time.perf_counter() - t0:.1f} s: {self._describe()}")
        self._publish_status()
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start serving. SUCCESS: services answer and the policy loop runs."""
        if self._config.engine_kind == "policy":
            from flashrt_ros.ros.policy_io import PolicyTopics
            try:
                self._policy_io = PolicyTopics(self, self._engine, self._config, read_config(self, RobotIOConfig),
                                               self._timer_group, on_inputs_change=self._publish_status)
            except Exception as exc:  # noqa: BLE001 - bad I/O parameters: stay inactive, say why
                self.get_logger().error(f"activate failed: robot I/O: {exc}")
                return TransitionCallbackReturn.FAILURE
        self._active = True
        self._lifecycle_name = "active"
        self.get_logger().info("active: serving capsule services")
        if self._config.engine_kind == "policy":
            self._replan_log.started(self._engine.replan_status())
        self._publish_status()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop the action and the control loop; engine state and capsules stay."""
        self._stop_serving()
        self._lifecycle_name = "inactive"
        self._publish_status()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free the engine (weights, arena, in-memory capsules; disk files stay)."""
        self._release_engine()
        self._lifecycle_name = "unconfigured"
        self._publish_status()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release_engine()
        self._lifecycle_name = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error("lifecycle error: releasing the engine")
        self._release_engine()
        return TransitionCallbackReturn.SUCCESS

    def _hosted(self) -> str:
        """What the node hosts, by the parameter that names it (model for llm, policy for policy)."""
        c = self._config
        return f"model={c.model}" if c.engine_kind == "llm" else f"policy={c.policy}"

    def _describe(self) -> str:
        c, e = self._config, self._engine
        model = c.model if c.engine_kind == "llm" else c.policy
        return (f"{c.engine_kind} engine, model {model}, device {e.device}, "
                f"arena {e.arena.nbytes / (1 << 20):.1f} MiB, capsules in {e.store.directory}")

    def _stop_serving(self) -> None:
        """Refuse new work; a running generation sees it and stops at its next boundary."""
        self._active = False
        if self._policy_io is not None:
            self._policy_io.destroy()
            self._policy_io = None

    def shut_down_goals(self) -> None:
        """SIGINT / SIGTERM: refuse new work; every running goal ends at its next boundary."""
        self._shutting_down = True
        self._active = False           # Generate stops at its next token; services answer NOT_ACTIVE

    def destroy_node(self) -> None:
        """Stop reading heartbeats (its thread and hidden node) and beating, then destroy the node."""
        self._heartbeats.destroy()
        self._beacon.destroy()
        super().destroy_node()

    def goals_running(self) -> bool:
        return self._goals.current() is not None

    def _release_engine(self) -> None:
        self._stop_serving()
        if self._engine is not None:
            close = getattr(self._engine, "close", None)     # the policy engine owns a temp dir
            if close is not None:
                close()
            self._engine = None

    # --- services -------------------------------------------------------
    def _require_active(self) -> Any:
        if not self._active or self._engine is None:
            raise NotActive(f"node is {self._lifecycle_name}, not active: configure and activate "
                            "it first (ros2 lifecycle set /flashrt configure; ... activate)")
        return self._engine

    # --- status ---------------------------------------------------------
    def _status(self) -> dict[str, Any]:
        """The EngineStatus fields; {} without an engine."""
        engine, c = self._engine, self._config
        if engine is None:
            return {}
        if c.engine_kind == "llm":
            busy = engine.busy
        else:
            busy = self._goals.running("run_policy") is not None or (
                self._policy_io is not None and self._policy_io.steps_continuously)
        return status_summary(c.engine_kind, c.model if c.engine_kind == "llm" else c.policy,
                              engine.status(), busy)

    def _publish_status(self) -> None:
        try:
            status = self._status()
        except Exception as exc:  # noqa: BLE001 - status must never kill the timer
            status = {}
            self.get_logger().warning(f"status unavailable: {exc}")
        policy_io = self._policy_io
        if policy_io is not None:
            status.update(policy_io.status())
        goal = self._goals.current()
        if goal is not None:
            status.update(goal_id=goal.goal_id, goal_owner=goal.owner, goal_state=goal.state)
        status.setdefault("engine_kind", self._config.engine_kind)
        if self._active:
            self._replan_log.update(status.get("replan", {}))
        stamp = self.get_clock().now().to_msg()
        self._status_pub.publish(conv.engine_status(status, self._lifecycle_name, stamp))
        self._diag_pub.publish(diagnostics_message(self.get_fully_qualified_name(), status,
                                                   self._lifecycle_name, stamp))


#: After SIGINT / SIGTERM: how long running goals get to end at a boundary and report their
#: result, and how long the executor's threads then get to finish; the node exits within both.
GOAL_END_WAIT_S = 1.0
RESULT_SEND_S = 0.2
THREADS_END_WAIT_S = 0.5


def main(argv: list[str] | None = None) -> int:
    """Console entry point: spin the node with a MultiThreadedExecutor until SIGINT or SIGTERM.

    rclpy's own signal handlers are off: they would invalidate the context at once, so a
    running goal could no longer report its result, and the executor's shutdown waited for
    a goal stuck on stale inputs for good (``flashrt serve`` ignored SIGINT for minutes).
    Here a signal ends every goal at its next boundary, lets the results go out, and exits
    within ``GOAL_END_WAIT_S + RESULT_SEND_S + THREADS_END_WAIT_S`` whatever a callback is doing.
    """
    rclpy.init(args=argv if argv is not None else sys.argv, signal_handler_options=SignalHandlerOptions.NO)
    node = FlashRTNode()
    executor = MultiThreadedExecutor(num_threads=6)
    executor.add_node(node)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    autostart_failed = threading.Event()
    if node._config.autostart:
        def autostart() -> None:
            if not _autostart(node):
                autostart_failed.set()
                stop.set()                    # a node that cannot start is no service
        threading.Thread(target=autostart, daemon=True).start()
    try:
        spin_until_shutdown(executor, node.get_logger(), stop)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if received:
            node.get_logger().info(f"{signal.Signals(received[0]).name}: ending running goals, then exiting")
        threads_done = _shut_down(node, executor)
        if not threads_done:
            print("flashrt: a callback was still running after shutdown; exiting without waiting for it",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1 if autostart_failed.is_set() else 0)
    if autostart_failed.is_set():
        print("flashrt: the node could not be configured and activated (the reason is logged "
              "above); exiting with status 1", file=sys.stderr)
        return 1
    return 0


def _shut_down(node: FlashRTNode, executor: MultiThreadedExecutor) -> bool:
    """End the goals (results delivered while spinning), then tear down; False if a callback still runs."""
    node.shut_down_goals()
    deadline = time.monotonic() + GOAL_END_WAIT_S
    while node.goals_running() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    if node.goals_running():
        node.get_logger().error(f"a goal did not end within {GOAL_END_WAIT_S:g} s of the shutdown")
    results_sent = time.monotonic() + RESULT_SEND_S      # rclpy sends a result from an executor task
    while time.monotonic() < results_sent:
        executor.spin_once(timeout_sec=0.02)
    deadline = time.monotonic() + THREADS_END_WAIT_S
    # no more spinning: the handlers already in the pool finish before the executor goes (else
    # "exception was never retrieved" lines on every shutdown: spinning.finish_dispatched)
    finish_dispatched(executor, THREADS_END_WAIT_S, node.get_logger().error)
    pool = getattr(executor, "_executor", None)          # the MultiThreadedExecutor's thread pool
    executor.shutdown(timeout_sec=0.0, wait_for_threads=False)
    threads = list(getattr(pool, "_threads", ()))
    for thread in threads:                  # idle pool threads exit at once after shutdown
        thread.join(max(0.0, deadline - time.monotonic()))
    done = not any(thread.is_alive() for thread in threads)
    if done:
        node._release_engine()
        node.destroy_node()
    rclpy.try_shutdown()
    return done


def _autostart(node: FlashRTNode) -> bool:
    """configure + activate, as a launch file's lifecycle events would; True when active."""
    if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
        node.get_logger().error("autostart: configure failed")
        return False
    node.trigger_activate()
    if not node._active:
        node.get_logger().error("autostart: activate failed")
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
