"""50 Hz control loop with a capsule interrupt every second; prints a latency table.

Each interrupt: snapshot the policy, let the engine serve M steps of another
behaviour (a PD expert drives the simulated arm and the policy is fed its
observations), then restore the capsule and the world state, and resume.
After each restore the live arena is compared byte-for-byte with the capsule.

    python -m benchmarks.control_loop [--seconds 10] [--device cpu|cuda] [--cuda-graph] [--threads 1]

No ROS needed. Timings are wall-clock on whatever machine runs it (printed).
"""
from __future__ import annotations

import argparse
import platform
import time

import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.stats import percentile
from flashrt_ros.models.policy_interface import PolicyModule
from flashrt_ros.models.reference_policies import ChunkedTransformerPolicy, GRUPolicy
from flashrt_ros.sim import ReachingTask

POLICIES = {"gru": GRUPolicy, "transformer": ChunkedTransformerPolicy}


def _sleep_until(deadline: float) -> None:
    """Coarse sleep, then spin the last millisecond (sleep alone overshoots by ~0.1-1 ms)."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > 1e-3:
            time.sleep(left - 1e-3)


def run_loop(policy: PolicyModule, *, seconds: float, hz: float, interrupt_every_s: float, other_steps: int,
             device: str, cuda_graph: bool) -> dict:
    engine = PolicyEngine(policy, device=device, cuda_graph=cuda_graph)
    task = ReachingTask(seed=0)
    period = 1.0 / hz
    n_ticks = int(round(seconds * hz))
    interrupt_ticks = max(1, int(round(interrupt_every_s * hz)))
    for _ in range(20):                      # warm-up outside the measured window
        engine.step(task.observation().to(device))
    engine.capsules.reset()
    task.reset(0)

    steps, periods, snaps, restores = [], [], [], []
    misses = verified = interrupts = 0
    other_left, sim_saved = 0, None
    start = time.perf_counter()
    prev = None
    for tick in range(n_ticks):
        scheduled = start + tick * period
        _sleep_until(scheduled)
        t0 = time.perf_counter()
        if prev is not None:
            periods.append(t0 - prev)
        prev = t0

        if other_left == 0 and tick > 0 and tick % interrupt_ticks == 0:
            s0 = time.perf_counter()
            engine.capsules.snapshot("interrupt", overwrite=True)
            snaps.append(time.perf_counter() - s0)
            sim_saved, other_left = task.get_state(), other_steps
            interrupts += 1

        obs = task.observation().to(device)
        s0 = time.perf_counter()
        action = engine.step(obs)
        steps.append(time.perf_counter() - s0)
        if other_left > 0:                   # the other behaviour drives the world
            task.step(task.expert_action())
            other_left -= 1
            if other_left == 0:
                s0 = time.perf_counter()
                engine.capsules.restore("interrupt")
                restores.append(time.perf_counter() - s0)
                task.set_state(sim_saved)
                verified += int(engine.capsules.verify("interrupt", against_live=True).ok)
        else:
            _, _, done = task.step(action.cpu())
            if done:
                task.reset(tick)
        if time.perf_counter() > scheduled + period:
            misses += 1

    ms = 1e3
    jitter = [abs(p - period) for p in periods]
    result = {
        "policy": type(policy).__name__,
        "ticks": n_ticks,
        "step_p50": percentile(steps, 50) * ms, "step_p99": percentile(steps, 99) * ms,
        "jit_p50": percentile(jitter, 50) * ms, "jit_p99": percentile(jitter, 99) * ms,
        "misses": misses,
        "snap_p50": percentile(snaps, 50) * ms, "snap_max": max(snaps, default=float("nan")) * ms,
        "rest_p50": percentile(restores, 50) * ms, "rest_max": max(restores, default=float("nan")) * ms,
        "interrupts": interrupts, "verified": verified,
        "state_bytes": engine.arena.nbytes,
    }
    engine.close()
    return result


def machine_name(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    accel = torch.cuda.get_device_name(0) if device.startswith("cuda") else "no accelerator"
    return f"{platform.node()} | {cpu} | {torch.get_num_threads()} torch threads | {accel} | torch {torch.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=[*POLICIES, "all"], default="all")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hz", type=float, default=50.0)
    ap.add_argument("--interrupt-every", type=float, default=1.0, help="seconds between interrupts")
    ap.add_argument("--other-steps", type=int, default=10, help="steps of the other behaviour per interrupt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (tiny control-rate ops run best on one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    names = list(POLICIES) if args.policy == "all" else [args.policy]
    print(f"machine: {machine_name(args.device)}")
    print(f"loop: {args.hz:g} Hz for {args.seconds:g} s, interrupt every {args.interrupt_every:g} s "
          f"(snapshot, {args.other_steps} steps of a PD expert, restore), device {args.device}"
          f"{' + CUDA graph' if args.cuda_graph else ''}")
    header = (f"{'policy':<26}{'step p50':>9}{'step p99':>9}{'jit p50':>9}{'jit p99':>9}{'miss':>7}"
              f"{'snap p50':>9}{'snap max':>9}{'rest p50':>9}{'rest max':>9}{'verified':>10}{'bytes':>8}")
    rows = []
    for name in names:
        torch.manual_seed(0)
        r = run_loop(POLICIES[name](), seconds=args.seconds, hz=args.hz, interrupt_every_s=args.interrupt_every,
                     other_steps=args.other_steps, device=args.device, cuda_graph=args.cuda_graph)
        rows.append(f"{r['policy']:<26}{r['step_p50']:>9.3f}{r['step_p99']:>9.3f}{r['jit_p50']:>9.3f}"
                    f"{r['jit_p99']:>9.3f}{r['misses']:>4}/{r['ticks']:<3}{r['snap_p50']:>8.3f}{r['snap_max']:>9.3f}"
                    f"{r['rest_p50']:>9.3f}{r['rest_max']:>9.3f}{r['verified']:>6}/{r['interrupts']:<3}"
                    f"{r['state_bytes']:>8}")
    print("all times in ms; jit = |loop period - nominal period|; miss = ticks finished after their deadline")
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
