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

Services (always advertised; NOT_ACTIVE unless active), under ~/ (default
/flashrt/...): snapshot restore fork rollback drop list save load verify pin
unpin close_session switch_session, plus std_srvs/Trigger reset, pause, resume. Each calls the engine's
capsule surface (``engine.capsules``, runtime/capsule_verbs.py). Those that
touch the live state are executed at a committed boundary (between two steps),
then answered; a request that waits longer than ``boundary_timeout_s`` for a
boundary answers TIMEOUT and changes nothing. The store-only ones (fork, drop,
list, save, load, pin, unpin, close_session, stored verify) never hold the engine. No exception
ever crosses a service: the response carries success/error_code/message, every
response is proven serializable before it is returned, and the executor loop
(``spin_until_shutdown``) survives any exception, so the node keeps running.

Executors and threads: a MultiThreadedExecutor with separate callback groups
for the state services (reentrant: several clients at once), the generate
action, the control/status timers and (policy_io.py) the policy's input
subscriptions, so a long step never delays their receipt. The engine's
BoundaryGate serialises everything that touches state.

Sessions: a Generate goal naming a ``session`` other than the current one
parks the current state as a hidden capsule and restores that session's (a
new one starts empty) before it runs; ``~/status`` and ListCapsules report it.

Goals (RunPolicy, Generate) never outlive their clients: ``goals.GoalBook``
keeps each running goal's owner and lease, renewed on ``~/goal_heartbeat``; a
second goal is aborted with BUSY naming the first. SIGINT and SIGTERM end every
goal at its next boundary (clients get a result), then the node exits.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from std_srvs.srv import Trigger

from flashrt_ros.action import Generate
from flashrt_ros.engine.sampling import SamplingParams
from flashrt_ros.msg import EngineStatus, GoalHeartbeat
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.diagnostics import diagnostics_message, status_summary, tier_bytes
from flashrt_ros.ros.goals import GoalBook, RunningGoal, goal_id_hex
from flashrt_ros.ros.parameters import PARAMS, NodeConfig, check_value, descriptor
from flashrt_ros.ros.robot_io_params import declare_robot_io_parameters, read_robot_io_config
from flashrt_ros.ros.service_qos import FEEDBACK_QOS, SERVICE_QOS
from flashrt_ros.runtime.disk import capsule_path
from flashrt_ros.runtime.errors import Busy, ErrorCode, FlashRTError, InvalidArgument, LeaseExpired, NotActive
from flashrt_ros.srv import (CloseSession, Drop, Fork, ListCapsules, Load, Pin, Restore, Rollback, Save,
                             Snapshot, SwitchSession, Unpin, Verify)


#: Verbs that replace the live state (``PolicyIO.state_replaced`` then applies ``inputs_after_restore``).
_REPLACE_STATE = frozenset({"restore", "reset", "rollback", "switch_session"})


class FlashRTNode(LifecycleNode):
    """Hosts an LLM or policy engine; see the module docstring for the contract."""

    def __init__(self, node_name: str = "flashrt", **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        for p in PARAMS:
            self.declare_parameter(p.name, p.default, descriptor(p))
        declare_robot_io_parameters(self)
        self.add_on_set_parameters_callback(self._validate_parameters)
        self._engine: Any = None
        self._active = False
        self._lifecycle_name = "unconfigured"
        self._config = self._read_config()
        self._generation_lock = threading.Lock()     # one Generate goal at a time
        self._policy_io: Any = None
        self._shutting_down = False                  # set by shut_down_goals(): goals end, none starts
        self._goals = GoalBook(on_change=self._publish_status)

        self._state_group = ReentrantCallbackGroup()
        self._action_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()

        self._create_state_services()
        self._generate_server = ActionServer(
            self, Generate, "~/generate", execute_callback=self._execute_generate,
            goal_callback=self._accept_goal, cancel_callback=lambda _g: CancelResponse.ACCEPT,
            feedback_pub_qos_profile=FEEDBACK_QOS, callback_group=self._action_group)
        from flashrt_ros.ros.policy_action import PolicyActionServer
        self._run_policy_server = PolicyActionServer(self, self._action_group,
                                                     lambda: self._policy_io, lambda: self._engine,
                                                     self._goals, lambda: self._shutting_down)
        # Heartbeats in a group of their own: never queued behind a step, a service or a goal.
        self.create_subscription(GoalHeartbeat, "~/goal_heartbeat", lambda m: self._goals.renew(m.goal_ids),
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
                                 callback_group=MutuallyExclusiveCallbackGroup())
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        self._status_pub = self.create_publisher(EngineStatus, "~/status", latched)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._status_timer = self.create_timer(self._config.status_period_s, self._publish_status,
                                               callback_group=self._timer_group)
        self.get_logger().info(f"flashrt node created (engine_kind={self._config.engine_kind}, "
                               f"{self._hosted()}); waiting for configure")

    # --- parameters -----------------------------------------------------
    def _read_config(self) -> NodeConfig:
        values = {p.name: self.get_parameter(p.name).value for p in PARAMS}
        return NodeConfig(**values)

    def _validate_parameters(self, params: list) -> Any:
        from rcl_interfaces.msg import SetParametersResult
        by_name = {p.name: p for p in PARAMS}
        for param in params:
            definition = by_name.get(param.name)
            if definition is None:
                continue
            reason = check_value(definition, param.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    # --- lifecycle ------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Build the engine. SUCCESS: weights loaded, arena allocated, warmed up."""
        self._config = self._read_config()
        reason = next(filter(None, (check_value(p, getattr(self._config, p.name))
                                    for p in PARAMS)), None)
        if reason:
            self.get_logger().error(f"configure failed: {reason}")
            return TransitionCallbackReturn.FAILURE
        from flashrt_ros.engine.factory import build_engine
        t0 = time.perf_counter()
        try:
            self._engine = build_engine(self._config, log=self.get_logger().info)
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
            from flashrt_ros.ros.policy_io import PolicyIO
            try:
                self._policy_io = PolicyIO(self, self._engine, self._config, read_robot_io_config(self),
                                           self._timer_group, on_inputs_change=self._publish_status)
            except Exception as exc:  # noqa: BLE001 - bad I/O parameters: stay inactive, say why
                self.get_logger().error(f"activate failed: robot I/O: {exc}")
                return TransitionCallbackReturn.FAILURE
        self._active = True
        self._lifecycle_name = "active"
        self.get_logger().info("active: serving capsule services")
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
    def _create_state_services(self) -> None:
        table: list[tuple[type, str, Callable[[Any, Any, Any], None]]] = [
            (Snapshot, "snapshot", self._do_snapshot), (Restore, "restore", self._do_restore),
            (Fork, "fork", self._do_fork), (Rollback, "rollback", self._do_rollback),
            (Drop, "drop", self._do_drop), (ListCapsules, "list", self._do_list),
            (Save, "save", self._do_save), (Load, "load", self._do_load),
            (Verify, "verify", self._do_verify), (Pin, "pin", self._do_pin),
            (Unpin, "unpin", self._do_unpin), (CloseSession, "close_session", self._do_close_session),
            (SwitchSession, "switch_session", self._do_switch_session),
            (Trigger, "reset", self._do_reset), (Trigger, "pause", self._do_pause),
            (Trigger, "resume", self._do_resume),
        ]
        # Verbs that only touch the capsule store (and the disk) do not hold the engine: the
        # store has its own lock, and a slow disk must not stall generation.
        store_only = {"fork", "drop", "list", "save", "load", "verify", "pin", "unpin", "close_session"}
        self._state_services = [
            self.create_service(srv, f"~/{name}", self._serve(name, handler, name not in store_only),
                                qos_profile=SERVICE_QOS, callback_group=self._state_group)
            for srv, name, handler in table]

    def _serve(self, verb: str, handler: Callable[[Any, Any, Any], None], at_boundary_only: bool) -> Callable:
        """Wrap a handler: lifecycle gate, boundary execution (engine verbs), errors as values."""
        def callback(request: Any, response: Any) -> Any:
            try:
                capsules = self._require_active().capsules
                timing: dict[str, float] = {}

                def at_boundary() -> None:
                    t0 = time.perf_counter()
                    try:
                        handler(capsules, request, response)
                    finally:
                        timing["ms"] = (time.perf_counter() - t0) * 1e3
                    if verb in _REPLACE_STATE and self._policy_io is not None:
                        self._policy_io.state_replaced()

                if at_boundary_only:
                    capsules.gate.run_at_boundary(at_boundary, timeout=self._config.boundary_timeout_s)
                else:
                    at_boundary()     # the capsule surface takes the boundary itself where it needs one
                conv.fill_ok(response, response.message or "ok")
                if hasattr(response, "engine_latency_ms"):
                    response.engine_latency_ms = timing.get("ms", 0.0)
            except Exception as exc:   # noqa: BLE001 - the boundary of the node
                conv.fill_error(response, exc, self.get_logger())
            response = conv.sendable(response, self.get_logger())
            if not response.success:
                self.get_logger().warning(f"{verb}: {response.message[:500]}")
            return response
        return callback

    def _require_active(self) -> Any:
        if not self._active or self._engine is None:
            raise NotActive(f"node is {self._lifecycle_name}, not active: configure and activate "
                            "it first (ros2 lifecycle set /flashrt configure; ... activate)")
        return self._engine

    def _tier(self, tier: str) -> str:
        tier = tier or str(self.get_parameter("default_tier").value)     # applied live
        if tier not in ("device", "host", "disk"):
            raise InvalidArgument(f"tier must be device, host or disk (got {tier!r})")
        return tier

    def _do_snapshot(self, capsules: Any, req: Any, resp: Any) -> None:
        capsule = capsules.snapshot(req.name, session=req.session, tier=self._tier(req.tier),
                                    pinned=req.pin, overwrite=req.overwrite)
        resp.capsule = conv.capsule_info(capsule)
        resp.message = f"snapshot {capsule.name} at position {capsule.position} ({capsule.tier})"

    def _do_restore(self, capsules: Any, req: Any, resp: Any) -> None:
        capsule = capsules.restore(req.name, verify=req.verify)
        resp.capsule = conv.capsule_info(capsule)
        resp.message = f"restored {capsule.name}: position {capsule.position}"

    def _do_fork(self, capsules: Any, req: Any, resp: Any) -> None:
        capsule = capsules.fork(req.source, req.name, tier=self._tier(req.tier))
        resp.capsule = conv.capsule_info(capsule)
        resp.message = f"forked {req.source} -> {capsule.name}"

    def _do_rollback(self, capsules: Any, req: Any, resp: Any) -> None:
        if req.steps < 1:
            raise InvalidArgument("steps must be >= 1")
        resp.position = int(capsules.rollback(int(req.steps)))
        resp.boundary_id = int(self._engine.status()["boundary"])
        resp.message = f"rolled back {req.steps} boundaries to position {resp.position}"

    def _do_drop(self, capsules: Any, req: Any, resp: Any) -> None:
        capsules.drop(req.name)
        resp.message = f"dropped {req.name}"

    def _do_list(self, capsules: Any, req: Any, resp: Any) -> None:
        listed = capsules.list(session=req.session)
        resp.capsules = [conv.capsule_info(c) for c in listed]
        stats = tier_bytes(capsules.stats())
        resp.device_bytes, resp.host_bytes = stats["device_bytes"], stats["host_bytes"]
        resp.disk_bytes = stats["disk_bytes"]
        resp.message = f"{len(listed)} capsules"

    def _do_save(self, capsules: Any, req: Any, resp: Any) -> None:
        capsule = capsules.save(req.name)
        path = capsule_path(capsules.store.directory, capsule.name)
        resp.capsule, resp.path = conv.capsule_info(capsule), str(path)
        resp.message = f"saved {capsule.name} to {path}"

    def _do_load(self, capsules: Any, req: Any, resp: Any) -> None:
        capsule = capsules.load(req.name)
        resp.capsule = conv.capsule_info(capsule)
        resp.message = f"loaded {capsule.name} ({capsule.nbytes} bytes, hashes verified)"

    def _do_verify(self, capsules: Any, req: Any, resp: Any) -> None:
        stored = capsules.verify(req.name)
        live = capsules.verify(req.name, against_live=True) if req.against_live else None
        resp.intact = bool(stored.ok)
        resp.matches_live = bool(live.ok) if live is not None else False
        resp.differing_buffers = list((live or stored).mismatched)
        state = "intact" if resp.intact else ("unverified" if not stored.verified else "CORRUPT")
        resp.message = (f"{req.name}: {state}"
                        + (f", {'matches' if resp.matches_live else 'differs from'} live state"
                           if req.against_live else ""))

    def _do_pin(self, capsules: Any, req: Any, resp: Any) -> None:
        resp.capsule = conv.capsule_info(capsules.pin(req.name))
        resp.message = f"pinned {req.name}: budgets will not demote it, drop refuses it"

    def _do_unpin(self, capsules: Any, req: Any, resp: Any) -> None:
        resp.capsule = conv.capsule_info(capsules.unpin(req.name))
        resp.message = f"unpinned {req.name}"

    def _do_close_session(self, capsules: Any, req: Any, resp: Any) -> None:
        capsules.close_session(req.session)
        resp.message = f"closed session {req.session} (its parked state is freed)"

    def _do_switch_session(self, capsules: Any, req: Any, resp: Any) -> None:
        if not req.session:
            raise InvalidArgument("session must name the session to make live")
        resp.previous_session = capsules.switch_session(req.session, timeout=self._config.boundary_timeout_s)
        resp.message = (f"session {req.session} is live (parked {resp.previous_session})"
                        if resp.previous_session != req.session else f"session {req.session} was already live")

    def _do_reset(self, capsules: Any, req: Any, resp: Any) -> None:
        capsules.reset()
        resp.message = "engine state reset to empty (capsules kept)"

    def _do_pause(self, capsules: Any, req: Any, resp: Any) -> None:
        if self._policy_io is None:
            raise InvalidArgument("pause applies to engine_kind=policy")
        self._policy_io.paused = True
        self._policy_io.drop_pending_plan()
        resp.message = "policy paused at a boundary"

    def _do_resume(self, capsules: Any, req: Any, resp: Any) -> None:
        if self._policy_io is None:
            raise InvalidArgument("resume applies to engine_kind=policy")
        self._policy_io.paused = False
        resp.message = "policy resumed"

    # --- generate action -------------------------------------------------
    def _accept_goal(self, goal: Any) -> GoalResponse:
        """Accept goals only while active with an LLM engine (a second one is aborted with BUSY)."""
        if not self._active or self._engine is None or self._config.engine_kind != "llm":
            self.get_logger().warning("generate goal rejected: node not active with an llm engine")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _execute_generate(self, goal_handle: Any) -> Any:
        result = Generate.Result()
        if not self._generation_lock.acquire(blocking=False):
            running = self._goals.running("generate")
            goal_handle.abort()
            conv.fill_error(result, Busy(
                "a generation is already running: " + (running.describe() if running is not None else "")
                + f"; end it with `flashrt cancel {running.goal_id if running is not None else '--all'}`"))
            self.get_logger().warning(f"generate: {result.message}")
            result.stop_reason = "error"
            return result
        lease = self._goals.begin("generate", goal_id_hex(goal_handle.goal_id.uuid), goal_handle.request.owner,
                                  goal_handle.request.lease_s)
        lease.state = "generating"
        try:
            return conv.sendable(self._run_generation(goal_handle, result, lease), self.get_logger())
        finally:
            self._goals.end(lease)
            self._generation_lock.release()

    def _run_generation(self, goal_handle: Any, result: Any, lease: RunningGoal) -> Any:
        goal = goal_handle.request
        engine = self._engine
        index = 0

        def on_token(token_id: int, piece: str, transcript_length: int) -> None:
            nonlocal index
            goal_handle.publish_feedback(Generate.Feedback(
                token_id=int(token_id), text_piece=piece, index=index, position=int(transcript_length)))
            index += 1
            lease.steps = index

        capsule, rolled_back = None, False
        try:
            if engine is None or not self._active:
                raise NotActive("node is not active")
            if goal.lease_s < 0:
                raise InvalidArgument(f"lease_s must be >= 0 (0: no lease), got {goal.lease_s:g}")
            # Every check that can refuse the goal runs before the reset writes; those that need the
            # goal's session run there, at the switch's boundary, and a refusal undoes the switch.
            sampling = SamplingParams(temperature=float(goal.temperature), top_k=int(goal.top_k),
                                      top_p=1.0 if goal.top_p == 0.0 else float(goal.top_p),
                                      seed=int(goal.seed) if goal.seed else None)
            chat = bool(goal.use_chat_template) and bool(goal.prompt)
            if goal.reset and not goal.prompt:
                raise InvalidArgument("reset with an empty prompt: there would be nothing to continue from")
            if goal.reset:
                engine.check_fresh_request(goal.prompt, chat=bool(goal.use_chat_template))
            rollback_on_cancel = bool(goal.rollback_on_cancel or self.get_parameter("rollback_on_cancel").value)

            def prepare() -> Any:
                """On the goal's session: its checks, then its start capsule (rollback_on_cancel)."""
                if not goal.reset:
                    engine.check_request(goal.prompt, chat=chat)
                if rollback_on_cancel:
                    from flashrt_ros.ros.goal_capsule import GoalCapsule
                    return GoalCapsule(engine, self._config.default_tier)
                return None

            capsule = engine.capsules.enter_session(goal.session, prepare,
                                                    timeout=self._config.boundary_timeout_s)
            if goal.reset:
                engine.capsules.reset(timeout=self._config.boundary_timeout_s)
            default_tokens = int(self.get_parameter("max_new_tokens").value)     # applied live
            outcome = engine.generate(
                goal.prompt, max_new_tokens=int(goal.max_new_tokens or default_tokens), sampling=sampling,
                chat=chat, on_token=on_token,
                should_stop=lambda: goal_handle.is_cancel_requested or not self._active or lease.lease_expired())
            if capsule is not None:
                cancelled = outcome.stop_reason == "cancelled" and goal_handle.is_cancel_requested
                if cancelled:
                    capsule.restore()
                    rolled_back = True
                else:
                    capsule.discard()
                capsule = None
        except Exception as exc:  # noqa: BLE001
            if capsule is not None:
                capsule.discard()
            conv.fill_error(result, exc, self.get_logger())
            result.stop_reason = "error"
            goal_handle.abort()
            return result
        stopped_by_node = outcome.stop_reason == "cancelled" and not goal_handle.is_cancel_requested
        if stopped_by_node and lease.lease_expired():
            conv.fill_error(result, LeaseExpired(
                f"generation ended after {len(outcome.token_ids)} tokens: its client did not renew the goal's "
                f"{lease.lease_s:g} s lease (the client died, hangs, or does not send heartbeats)"))
            self.get_logger().warning(f"generate: {result.message}")
        elif stopped_by_node:
            conv.fill_error(result, FlashRTError("generation stopped: the node was "
                                                 + ("shut down" if self._shutting_down else "deactivated"),
                                                 ErrorCode.CANCELLED))
        else:
            conv.fill_ok(result, f"{len(outcome.token_ids)} tokens, stop: {outcome.stop_reason}"
                         + (", rolled back to the goal's start (rollback_on_cancel)" if rolled_back else ""))
        result.text = outcome.text
        result.token_ids = [int(t) for t in outcome.token_ids]
        result.stop_reason = outcome.stop_reason
        result.position = _transcript_length(engine) if rolled_back else int(outcome.transcript_length)
        result.ttft_ms = 1e3 * float(outcome.timings.get("ttft_s", 0.0))
        result.tokens_per_second = float(outcome.timings.get("decode_tokens_per_s", 0.0))
        if outcome.stop_reason == "cancelled" and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif stopped_by_node:
            goal_handle.abort()
        else:
            goal_handle.succeed()
        return result

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
    if node.get_parameter("autostart").value:
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
    pool = getattr(executor, "_executor", None)          # the MultiThreadedExecutor's thread pool
    executor.shutdown(timeout_sec=0.0, wait_for_threads=False)
    threads = list(getattr(pool, "_threads", ()))
    deadline = time.monotonic() + THREADS_END_WAIT_S
    for thread in threads:                  # idle pool threads exit at once after shutdown
        thread.join(max(0.0, deadline - time.monotonic()))
    done = not any(thread.is_alive() for thread in threads)
    if done:
        node._release_engine()
        node.destroy_node()
    rclpy.try_shutdown()
    return done


def _transcript_length(engine: Any) -> int:
    """Tokens in the live transcript (consumed plus a pending one), e.g. after a rollback."""
    status = engine.status()
    return int(status["position"]) + int(status["has_pending"])


def spin_until_shutdown(executor: MultiThreadedExecutor, logger: Any,
                        stop: threading.Event | None = None) -> None:
    """``executor.spin()`` that outlives any exception a callback lets escape, until ``stop`` is set.

    rclpy re-raises a callback's exception from ``spin_once`` and ``spin()``
    would end with it, taking the node down; here it is logged and spinning
    goes on. Service callbacks never let one escape (errors become responses,
    and ``conversions.sendable`` replaces an unserializable response with an
    INTERNAL one), so this is the last line of defence, e.g. for timers.
    """
    while rclpy.ok() and not (stop is not None and stop.is_set()):
        try:
            executor.spin_once(timeout_sec=0.1)
        except ExternalShutdownException:
            return
        except Exception as exc:  # noqa: BLE001 - the node must keep serving
            logger.error(f"a callback raised {type(exc).__name__}: {str(exc)[:500]}; the node keeps serving")


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
