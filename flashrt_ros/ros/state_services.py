"""The capsule services of the node: one per verb of ``interface.services.VERBS``, one callback for all.

Why one callback: what every service does around its verb is the same: answer a copy
of a request (same ``request_id``) with the first one's answer (``request_ledger``), refuse
unless the node is active, apply the declaration's checks (engines, minimums),
run the handler (at a committed boundary for verbs that touch the live state;
store-only verbs never hold the engine: the store has its own lock, and a slow
disk must not stall generation), tell the policy loop when the live state was
replaced, and turn any exception into ``success=false`` + ``error_code``, with
the response proven serializable before it is returned.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from flashrt_ros.interface.node_params import NodeConfig
from flashrt_ros.interface.qos import SERVICE_QOS
from flashrt_ros.interface.services import TIERS, VERBS, ServiceVerb
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.parameters import read_config
from flashrt_ros.ros.verb_handlers import HANDLERS, VerbContext
from flashrt_ros.ros.request_ledger import RequestLedger, answer_once
from flashrt_ros.runtime.errors import InvalidArgument

#: How much longer than a boundary wait a copy waits for the first request's answer (s).
COPY_WAIT_MARGIN_S = 5.0


class StateServices:
    """Creates the services on ``node``; the engine (``active_engine`` raises NOT_ACTIVE unless
    the node is active), the policy loop and the configuration are read per request."""

    def __init__(self, node: Any, group: Any, active_engine: Callable[[], Any], policy_io: Callable[[], Any],
                 config: Callable[[], Any]) -> None:
        self._node, self._active_engine, self._policy_io, self._config = node, active_engine, policy_io, config
        qos = SERVICE_QOS.profile()
        self.ledger = RequestLedger()
        self.services = [node.create_service(verb.srv, f"~/{verb.name}", self.serve(verb), qos_profile=qos,
                                             callback_group=group) for verb in VERBS]

    def serve(self, verb: ServiceVerb) -> Callable:
        """``verb``'s service callback (see the module docstring)."""
        handler = HANDLERS[verb.name]

        def callback(request: Any, response: Any) -> Any:
            return answer_once(self.ledger, verb.name, request, response, run,
                               self._config().boundary_timeout_s + COPY_WAIT_MARGIN_S, self._node.get_logger())

        def run(request: Any, response: Any) -> Any:
            try:
                engine = self._active_engine()
                refused = verb.refusal(request, self._config().engine_kind)
                if refused:
                    raise InvalidArgument(refused)
                context = VerbContext(capsules=engine.capsules, engine=engine, policy_io=self._policy_io(),
                                      boundary_timeout_s=self._config().boundary_timeout_s, tier=self._tier)
                timing: dict[str, float] = {}

                def at_boundary() -> None:
                    t0 = time.perf_counter()
                    try:
                        handler(context, request, response)
                    finally:
                        timing["ms"] = (time.perf_counter() - t0) * 1e3
                    if verb.replaces_state and (policy_io := self._policy_io()) is not None:
                        policy_io.state_replaced()

                if verb.at_boundary:
                    engine.capsules.gate.run_at_boundary(at_boundary, timeout=self._config().boundary_timeout_s)
                else:
                    at_boundary()     # the capsule surface takes the boundary itself where it needs one
                conv.fill_ok(response, response.message or "ok")
                if hasattr(response, "engine_latency_ms"):
                    response.engine_latency_ms = timing.get("ms", 0.0)
            except Exception as exc:   # noqa: BLE001 - the boundary of the node
                conv.fill_error(response, exc, self._node.get_logger())
            response = conv.sendable(response, self._node.get_logger())
            if not response.success:
                self._node.get_logger().warning(f"{verb.name}: {response.message[:500]}")
            return response
        return callback

    def _tier(self, tier: str) -> str:
        tier = tier or read_config(self._node, NodeConfig, check=False).default_tier     # applied live
        if tier not in TIERS:
            raise InvalidArgument(f"tier must be device, host or disk (got {tier!r})")
        return tier
