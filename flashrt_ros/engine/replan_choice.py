"""``replan: auto``: plan beside the loop exactly when planning in the step would cost the control rate.

Why a default that decides: with ``sync`` the step that empties the queue runs the
whole network, so the command after it comes a replan's time late (a 2-camera ACT
on a 2-core CPU: 50-90 ms at a 67 ms period); beside the loop (``async``) the step
only pops. But ``async`` merges a chunk planned from an observation a few steps
old and drops its first actions, and a lock-step world (``control_trigger:
inputs``) waits for each command anyway, where ``sync`` replays exactly. So:
``sync`` in lock-step, for a policy that cannot plan beside the loop, and for one
whose replan takes at most a quarter of a control period; ``async`` otherwise. Why a
quarter: the replan timed here ran 30 ms on a quiet 2-core machine, and up to 62 ms
(p99 33 ms) inside the running node at 15 Hz, beside the image decoding and the
middleware; a sync replan adds its whole time to a command gap. A user
should not need to know the knob; ``replan_status()["chosen"]`` says what was
chosen and why.

The replan is timed once, before the engine is built: the policy's replanning
step, eager (not captured), on a scratch copy of its state, twice (the second
counts: the first pays one-time set-up). Eager overestimates a captured replan,
so the choice errs toward keeping the rate. But one quiet measurement is not the
running node (the same ACT timed 1.3 ms on one start and its replans ran 50-90 ms
beside image decoding on another), so ``auto`` keeps watching: ``ReplanWatch``
counts the replanning steps that take over a quarter period while the node runs,
and after ``SWITCH_AFTER`` of them the node switches to ``async`` at a boundary
(``PolicyEngine.switch_replan``), for good.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from flashrt_ros.engine.chunk_planner import ReplanConfig
from flashrt_ros.engine.replan_schedule import AsyncSchedule
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.runtime.arena import StateArena, core_meta_specs
from flashrt_ros.runtime.errors import InvalidArgument

#: plan beside the loop when a replan takes longer than this share of the control period
SHARE_OF_PERIOD = 0.25
#: ``auto`` that chose sync switches to async after this many replanning steps over that share, in the run
SWITCH_AFTER = 3


def time_replan(policy: PolicyModule, device: torch.device) -> float:
    """Seconds one eager replanning step takes (the second of two), on a scratch state."""
    policy = policy.to(device).eval()
    arena = StateArena(policy.state_specs() + core_meta_specs(), device)
    policy.init_state(arena)
    inputs = {name: torch.zeros(spec.shape, dtype=torch.float32, device=device)
              for name, spec in policy.input_features().items()}
    elapsed = 0.0
    with torch.no_grad():
        for _ in range(2):
            t0 = time.perf_counter()
            policy.step_observation(inputs, arena, replan=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
    return elapsed


def choose_replan(policy: PolicyModule, device: torch.device, cfg: ReplanConfig, *, lockstep: bool) -> ReplanConfig:
    """``cfg`` with ``mode: auto`` resolved to sync or async, ``chosen`` saying why (other modes: as given)."""
    if cfg.mode != "auto":
        return cfg
    sync = replace(cfg, mode="sync")
    if lockstep:
        return replace(sync, chosen="auto: sync (control_trigger inputs: a lock-step world waits for each command)")
    queue = policy.action_queue()
    try:
        AsyncSchedule.check(policy, queue, "async")
    except InvalidArgument:
        return replace(sync, chosen=f"auto: sync ({type(policy).__name__} cannot plan beside the loop)")
    took = time_replan(policy, device)
    verdict = (f"a replan took {1e3 * took:.1f} ms, {'over' if took > SHARE_OF_PERIOD * cfg.period_s else 'within'} "
               f"a quarter of the {1e3 * cfg.period_s:.1f} ms control period")
    if took > SHARE_OF_PERIOD * cfg.period_s:
        return replace(cfg, mode="async", chosen=f"auto: async ({verdict})")
    return replace(cfg, mode="sync", chosen=f"auto: sync ({verdict})", may_switch=True)


class ReplanWatch:
    """``auto`` resolved to ``sync``: the replanning steps of the running loop, and when to plan beside it."""

    def __init__(self, period_s: float, switch_after: int = SWITCH_AFTER) -> None:
        self.period_s, self.switch_after = period_s, switch_after
        self.slow: list[float] = []                  # ms of the replanning steps over the share, in order

    def observe(self, replanned: bool | None, took_s: float) -> str | None:
        """One step (``replanned``: it planned a chunk); the reason to switch to async once it is time, else None."""
        if not replanned or took_s <= SHARE_OF_PERIOD * self.period_s:
            return None
        self.slow.append(1e3 * took_s)
        if len(self.slow) < self.switch_after:
            return None
        return (f"auto: async (switched in the run: {len(self.slow)} replanning steps took "
                f"{', '.join(f'{ms:.1f}' for ms in self.slow[-self.switch_after:])} ms, over a quarter of the "
                f"{1e3 * self.period_s:.1f} ms control period)")
