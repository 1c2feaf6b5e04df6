"""LeRobot 0.4.4's own Real-Time Chunking bookkeeping, the reference for the engine's ``replan: rtc``.

Why here (and not the guided chunks alone): the engine chooses when to plan, which leftover
to guide toward, the inference delay, the horizon and where a merged chunk starts; a test
that builds ``Guidance`` by hand never compares those choices with LeRobot's. This runs
LeRobot's RTC ``ActionQueue`` (a merged chunk replaces the queue minus the ``real_delay``
actions run meanwhile; ``get_left_over()`` is the guidance target) the way its real-robot
example drives it, with a fixed inference delay. Used in the test process (SmolVLA,
``test_rtc.py``) and in the π reference's own process (``pi_reference/reference.py``);
``engine_run`` is our side of the comparison.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def lerobot_rtc_run(predict: Callable[..., torch.Tensor], steps: int, delay: int,
                    rtc_config: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One control step per observation index ``0 .. steps - 1``.

    ``predict(k, plan, **rtc)``: the policy's ``predict_action_chunk`` on observation ``k`` with the
    noise of plan ``plan`` (normalised actions, ``(chunk_size, action_dim)``); ``rtc`` holds
    ``inference_delay``, ``prev_chunk_left_over`` and ``execution_horizon`` for a guided plan. Plan 0
    (step 0) has nothing to guide toward. A plan starts from step ``k``'s observation, before step
    ``k``'s action runs, once the queue holds ``delay`` actions or fewer after that action; it is merged
    ``delay`` steps later. Returns every guided chunk, and after each step the queue's actions still to
    run (normalised)."""
    from lerobot.policies.rtc.action_queue import ActionQueue
    queue = ActionQueue(rtc_config)
    first = predict(0, 0)
    queue.merge(first, first, real_delay=0)
    chunks: list[torch.Tensor] = []
    remaining: list[torch.Tensor] = []
    pending: tuple[int, int, torch.Tensor, int] | None = None       # (merge step, launch step, chunk, index)
    plans = 1
    for k in range(steps):
        if pending is not None and k == pending[0]:
            queue.merge(pending[2], pending[2], real_delay=k - pending[1], action_index_before_inference=pending[3])
            pending = None
        leftover, index = queue.get_left_over(), queue.get_action_index()
        if queue.get() is None:
            raise AssertionError(f"LeRobot's queue ran dry at step {k}: choose a delay the chunk covers")
        remaining.append(queue.queue[queue.last_index:].clone())
        if pending is None and queue.qsize() <= delay:
            chunk = predict(k, plans, inference_delay=delay, prev_chunk_left_over=leftover.clone(),
                            execution_horizon=rtc_config.execution_horizon)
            chunks.append(chunk)
            pending, plans = (k + delay, k, chunk, index), plans + 1
    return chunks, remaining


def padded(rows: list[torch.Tensor], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths as one zero-padded tensor ``(n, length, dim)`` and their lengths
    (to save them in one safetensors file)."""
    out = torch.zeros(len(rows), length, rows[0].shape[-1])
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
    return out, torch.tensor([r.shape[0] for r in rows])


def engine_run(engine: Any, observations: list[dict]) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Our side: ``engine`` (a ``PolicyEngine`` planning beside the loop) stepped once per observation.
    Returns each chunk planned beside the loop as the engine merges it (normalised, the queue's part),
    the queue's actions still to run after every step, and how many plans it launched (the last may
    not be merged by the last step); closes the engine."""
    from flashrt_ros.engine.chunk_planner import COPY
    policy, planner = engine.policy, engine.schedule.planner
    refill = engine.bodies.queue.refill
    chunks: list[torch.Tensor] = []
    collect = planner.collect

    def collect_and_record() -> None:
        collect()
        chunks.append(engine.arena[COPY + policy.QUEUE].clone())
    planner.collect = collect_and_record
    queues = []
    for o in observations:
        engine.step(o)
        left = int(engine.arena[policy.LEFT])
        queues.append(engine.arena[policy.QUEUE][refill - left:].clone())
    launched = engine.replan_status()["launched"]
    engine.close()
    return chunks, queues, launched
