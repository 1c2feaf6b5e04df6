"""The Generate action: append a prompt to the live context and generate, token by token.

Why its own module, beside ``policy_action.py``: the node's lifecycle owns the
engine; this server owns one goal's life. One goal at a time (a second one is
accepted and aborted at once with ``BUSY`` naming the first; a plain rejection
could carry no reason). Every check that can refuse the goal runs before anything
is written: the sampling fields and ``reset`` first, then, at the session
switch's boundary, the checks that need the goal's session and its start capsule
(``rollback_on_cancel``); a refusal undoes the switch. Feedback per token; a
cancel stops at the next token boundary keeping the committed tokens (or, with
``rollback_on_cancel``, restores the goal's start). A goal whose client stops
renewing its lease ends with ``LEASE_EXPIRED``; one stopped by deactivate or the
node's shutdown is aborted with ``CANCELLED``.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from flashrt_ros.action import Generate
from flashrt_ros.engine.sampling import SamplingParams
from flashrt_ros.interface.goals import GOAL_RETENTION_S, goal_id_hex
from flashrt_ros.interface.node_params import NodeConfig
from flashrt_ros.interface.qos import FEEDBACK_QOS
from flashrt_ros.interface.robot_io_params import RobotIOConfig
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.goals import GoalBook, RunningGoal
from flashrt_ros.ros.parameters import read_config
from flashrt_ros.runtime.errors import Busy, ErrorCode, FlashRTError, InvalidArgument, LeaseExpired, NotActive


class GenerateActionServer:
    """``~/generate`` on ``node``; the engine, the node's active flag and its configuration are
    read through callables, since the node's lifecycle replaces them."""

    def __init__(self, node: Any, group: Any, engine: Callable[[], Any], active: Callable[[], bool],
                 config: Callable[[], Any], goals: GoalBook, shutting_down: Callable[[], bool]) -> None:
        self._node, self._engine, self._active, self._config = node, engine, active, config
        self._goals, self._shutting_down = goals, shutting_down
        self._generation_lock = threading.Lock()     # one Generate goal at a time
        self._server = ActionServer(
            node, Generate, "~/generate", execute_callback=self._execute, goal_callback=self._on_goal,
            cancel_callback=lambda _g: CancelResponse.ACCEPT, feedback_pub_qos_profile=FEEDBACK_QOS.profile(),
            callback_group=group, result_timeout=GOAL_RETENTION_S)

    def _on_goal(self, goal: Any) -> GoalResponse:
        """Accept goals only while active with an LLM engine (a second one is aborted with BUSY)."""
        if not self._active() or self._engine() is None or self._config().engine_kind != "llm":
            self._node.get_logger().warning("generate goal rejected: node not active with an llm engine")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _execute(self, goal_handle: Any) -> Any:
        result = Generate.Result()
        if not self._generation_lock.acquire(blocking=False):
            running = self._goals.running("generate")
            goal_handle.abort()
            conv.fill_error(result, Busy(
                "a generation is already running: " + (running.describe() if running is not None else "")
                + f"; end it with `flashrt cancel {running.goal_id if running is not None else '--all'}`"))
            self._node.get_logger().warning(f"generate: {result.message}")
            result.stop_reason = "error"
            return result
        lease = self._goals.begin("generate", goal_id_hex(goal_handle.goal_id.uuid), goal_handle.request.owner,
                                  goal_handle.request.lease_s)
        lease.state = "generating"
        try:
            return conv.sendable(self._run(goal_handle, result, lease), self._node.get_logger())
        finally:
            self._goals.end(lease)
            self._generation_lock.release()

    def _run(self, goal_handle: Any, result: Any, lease: RunningGoal) -> Any:
        goal = goal_handle.request
        engine = self._engine()
        index = 0

        def on_token(token_id: int, piece: str, transcript_length: int) -> None:
            nonlocal index
            goal_handle.publish_feedback(Generate.Feedback(
                token_id=int(token_id), text_piece=piece, index=index, position=int(transcript_length)))
            index += 1
            lease.steps = index

        capsule, rolled_back = None, False
        try:
            if engine is None or not self._active():
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
            rollback_on_cancel = bool(goal.rollback_on_cancel or read_config(self._node, RobotIOConfig).rollback_on_cancel)

            def prepare() -> Any:
                """On the goal's session: its checks, then its start capsule (rollback_on_cancel)."""
                if not goal.reset:
                    engine.check_request(goal.prompt, chat=chat)
                if rollback_on_cancel:
                    from flashrt_ros.ros.goal_capsule import GoalCapsule
                    return GoalCapsule(engine, self._config().default_tier)
                return None

            capsule = engine.capsules.enter_session(goal.session, prepare,
                                                    timeout=self._config().boundary_timeout_s)
            if goal.reset:
                engine.capsules.reset(timeout=self._config().boundary_timeout_s)
            default_tokens = read_config(self._node, NodeConfig, check=False).max_new_tokens     # applied live
            outcome = engine.generate(
                goal.prompt, max_new_tokens=int(goal.max_new_tokens or default_tokens), sampling=sampling,
                chat=chat, on_token=on_token,
                should_stop=lambda: (goal_handle.is_cancel_requested or not self._active()
                                     or lease.lease_expired()))
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
            conv.fill_error(result, exc, self._node.get_logger())
            result.stop_reason = "error"
            goal_handle.abort()
            return result
        stopped_by_node = outcome.stop_reason == "cancelled" and not goal_handle.is_cancel_requested
        if stopped_by_node and lease.lease_expired():
            conv.fill_error(result, LeaseExpired(
                f"generation ended after {len(outcome.token_ids)} tokens: its client did not renew the goal's "
                f"{lease.lease_s:g} s lease (the client died, hangs, or does not send heartbeats)"))
            self._node.get_logger().warning(f"generate: {result.message}")
        elif stopped_by_node:
            conv.fill_error(result, FlashRTError("generation stopped: the node was "
                                                 + ("shut down" if self._shutting_down() else "deactivated"),
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
        result.drafted_tokens = int(outcome.drafted_tokens)
        result.accepted_tokens = int(outcome.accepted_tokens)
        if outcome.stop_reason == "cancelled" and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif stopped_by_node:
            goal_handle.abort()
        else:
            goal_handle.succeed()
        return result


def _transcript_length(engine: Any) -> int:
    """Tokens in the live transcript (consumed plus a pending one), e.g. after a rollback."""
    status = engine.status()
    return int(status["position"]) + int(status["has_pending"])
