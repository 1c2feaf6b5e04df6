"""One π0 / π0.5 replan taken apart: kernels launched (by name) and device time per stage.

Why: a replan that misses its goal must be explained against the roofline, stage
by stage. Two measurements, both on a policy already on the GPU:

* ``kernel_table``: one replanning step through an engine with graphs off under
  ``torch.profiler``: every device activity (kernels, copies, memsets) counted
  and summed by name (what a CUDA graph of the step replays);
* ``stage_times`` (``fast`` numerics): each stage of the plan captured as a CUDA
  graph of its own and replayed (vision tower + projector, language model
  prefix, the denoising loop, one expert step), median of the replays: the
  device time each stage costs inside the captured plan.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from benchmarks.timing import graph_ms
from flashrt_ros.engine.policy_engine import PolicyEngine


def kernel_table(policy, observation: dict, top: int = 15) -> dict:
    """Kernels of one replan (eager, same kernels as the captured step): count, summed device ms, the top ones."""
    from torch.profiler import DeviceType, ProfilerActivity, profile
    engine = PolicyEngine(policy, device="cuda", cuda_graph=False)
    try:
        engine.step(observation)                                    # warm-up: allocator, cuBLAS handles
        engine.capsules.reset(seed=0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step(observation)
            torch.cuda.synchronize()
    finally:
        engine.close()
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            by_name[e.name].append(e.device_time_total / 1e3)
    total = sum(sum(v) for v in by_name.values())
    rows = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)
    return {"kernels": sum(len(v) for v in by_name.values()), "device_ms": total,
            "top": [{"name": k[:120], "count": n, "ms": round(ms, 4)} for ms, n, k in rows[:top]]}


def stage_times(policy, observation: dict) -> dict:
    """Device ms of each stage of a ``fast`` plan, each captured and replayed on its own."""
    if getattr(policy, "numerics", "exact") == "exact":
        return {}
    engine = PolicyEngine(policy, device="cuda", cuda_graph=False)
    try:
        arena, fast = engine.arena, policy.fast
        obs = {k: v.cuda() for k, v in observation.items()}
        engine.step(obs)
        counter = arena[policy.PLANS]
        return {"vision_ms": graph_ms(lambda: fast.encode(policy, obs, arena), repeat=1, reps=20),
                "prefix_ms": graph_ms(lambda: fast.prefill(policy, arena), repeat=1, reps=20),
                "denoise_ms": graph_ms(lambda: fast.denoise(policy, arena, counter), repeat=1, reps=20),
                "expert_step_ms": graph_ms(lambda: fast.denoise(policy, arena, counter, steps=1), repeat=1, reps=20),
                "steps": policy.cfg.num_inference_steps}
    finally:
        engine.close()
