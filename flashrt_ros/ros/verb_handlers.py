"""The node's handler of every capsule service verb: one engine call each.

Why apart from the declarations (``flashrt_ros/interface/services.py``): clients, the CLI and the
trees need a verb's name, fields and retry safety, never the code that serves it; this module is
the node's half. ``state_services.StateServices`` wraps each handler with what every service does
around its verb (lifecycle gate, the declaration's checks, the boundary, errors as responses).

No torch here: the handlers reach the engine only through ``VerbContext``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.diagnostics import tier_bytes
from flashrt_ros.runtime.errors import InvalidArgument, NotActive


@dataclass
class VerbContext:
    """What a handler may use on the node, built per request (``ros/state_services.py``)."""

    capsules: Any                   # engine.capsules (runtime.capsule_verbs.CapsuleVerbs)
    engine: Any
    policy_io: Any                  # ros.policy_io.PolicyTopics; None unless an active policy node
    boundary_timeout_s: float
    tier: Callable[[str], str]      # a request's tier, or the live default_tier; checked


Handler = Callable[[VerbContext, Any, Any], None]      # (context, request, response): fills the response


def _snapshot(ctx: VerbContext, req: Any, resp: Any) -> None:
    capsule = ctx.capsules.snapshot(req.name, session=req.session, tier=ctx.tier(req.tier),
                                    pinned=req.pin, overwrite=req.overwrite)
    resp.capsule = conv.capsule_info(capsule)
    resp.message = f"snapshot {capsule.name} at position {capsule.position} ({capsule.tier})"


def _restore(ctx: VerbContext, req: Any, resp: Any) -> None:
    capsule = ctx.capsules.restore(req.name, verify=req.verify)
    resp.capsule = conv.capsule_info(capsule)
    resp.message = f"restored {capsule.name}: position {capsule.position}"


def _fork(ctx: VerbContext, req: Any, resp: Any) -> None:
    capsule = ctx.capsules.fork(req.source, req.name, tier=ctx.tier(req.tier))
    resp.capsule = conv.capsule_info(capsule)
    resp.message = f"forked {req.source} -> {capsule.name}"


def _drop(ctx: VerbContext, req: Any, resp: Any) -> None:
    ctx.capsules.drop(req.name)
    resp.message = f"dropped {req.name}"


def _rollback(ctx: VerbContext, req: Any, resp: Any) -> None:
    resp.position = int(ctx.capsules.rollback(int(req.steps)))
    resp.boundary_id = int(ctx.engine.status()["boundary"])
    resp.message = f"rolled back {req.steps} boundaries to position {resp.position}"


def _reset(ctx: VerbContext, req: Any, resp: Any) -> None:
    ctx.capsules.reset()
    resp.message = "engine state reset to empty (capsules kept)"


def _switch_session(ctx: VerbContext, req: Any, resp: Any) -> None:
    if not req.session:
        raise InvalidArgument("session must name the session to make live")
    resp.previous_session = ctx.capsules.switch_session(req.session, timeout=ctx.boundary_timeout_s)
    resp.message = (f"session {req.session} is live (parked {resp.previous_session})"
                    if resp.previous_session != req.session else f"session {req.session} was already live")


def _policy_io(ctx: VerbContext) -> Any:
    if ctx.policy_io is None:            # deactivated between the lifecycle check and here
        raise NotActive("the policy loop is not running (node not active)")
    return ctx.policy_io


def _pause(ctx: VerbContext, req: Any, resp: Any) -> None:
    policy_io = _policy_io(ctx)
    policy_io.paused = True
    policy_io.drop_pending_plan()        # nothing planned before the pause reaches the robot after it
    resp.message = "policy paused at a boundary"


def _resume(ctx: VerbContext, req: Any, resp: Any) -> None:
    _policy_io(ctx).paused = False
    resp.message = "policy resumed"


def _list(ctx: VerbContext, req: Any, resp: Any) -> None:
    listed = ctx.capsules.list(session=req.session)
    resp.capsules = [conv.capsule_info(c) for c in listed]
    stats = tier_bytes(ctx.capsules.stats())
    resp.device_bytes, resp.host_bytes = stats["device_bytes"], stats["host_bytes"]
    resp.disk_bytes = stats["disk_bytes"]
    resp.message = f"{len(listed)} capsules"


def _save(ctx: VerbContext, req: Any, resp: Any) -> None:
    from flashrt_ros.runtime.disk import capsule_path    # imported here: the disk format pulls in torch
    capsule = ctx.capsules.save(req.name)
    path = capsule_path(ctx.capsules.store.directory, capsule.name)
    resp.capsule, resp.path = conv.capsule_info(capsule), str(path)
    resp.message = f"saved {capsule.name} to {path}"


def _load(ctx: VerbContext, req: Any, resp: Any) -> None:
    capsule = ctx.capsules.load(req.name)
    resp.capsule = conv.capsule_info(capsule)
    resp.message = f"loaded {capsule.name} ({capsule.nbytes} bytes, hashes verified)"


def _verify(ctx: VerbContext, req: Any, resp: Any) -> None:
    stored = ctx.capsules.verify(req.name)
    live = ctx.capsules.verify(req.name, against_live=True) if req.against_live else None
    resp.intact = bool(stored.ok)
    resp.matches_live = bool(live.ok) if live is not None else False
    resp.differing_buffers = list((live or stored).mismatched)
    state = "intact" if resp.intact else ("unverified" if not stored.verified else "CORRUPT")
    resp.message = (f"{req.name}: {state}"
                    + (f", {'matches' if resp.matches_live else 'differs from'} live state"
                       if req.against_live else ""))


def _pin(ctx: VerbContext, req: Any, resp: Any) -> None:
    resp.capsule = conv.capsule_info(ctx.capsules.pin(req.name))
    resp.message = f"pinned {req.name}: budgets will not demote it, drop refuses it"


def _unpin(ctx: VerbContext, req: Any, resp: Any) -> None:
    resp.capsule = conv.capsule_info(ctx.capsules.unpin(req.name))
    resp.message = f"unpinned {req.name}"


def _close_session(ctx: VerbContext, req: Any, resp: Any) -> None:
    ctx.capsules.close_session(req.session)
    resp.message = f"closed session {req.session} (its parked state is freed)"


#: verb name -> its handler; every verb of ``interface.services.VERBS`` has one (a test checks).
HANDLERS: dict[str, Handler] = {
    "snapshot": _snapshot, "restore": _restore, "fork": _fork, "drop": _drop, "rollback": _rollback,
    "reset": _reset, "switch_session": _switch_session, "pause": _pause, "resume": _resume, "list": _list,
    "save": _save, "load": _load, "verify": _verify, "pin": _pin, "unpin": _unpin,
    "close_session": _close_session,
}
