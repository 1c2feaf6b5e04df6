"""Timers that mean the same thing on CPU and GPU, plus the copy-bandwidth probe.

Why two kinds: a *latency a client sees* (cold prefill -> first token) is wall
clock up to the host read of the token, so it is measured with perf_counter
after a device sync. A *device-side cost* (snapshot, restore, the copy floor)
is measured with CUDA events, which exclude Python jitter around the call.
On CPU both fall back to perf_counter.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """``(milliseconds, result)`` of one call, the device drained before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3, out


def event_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call: CUDA events on GPU, perf_counter on CPU."""
    if device.type != "cuda":
        return wall_ms(fn, device)[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync(device)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_event_ms(fn: Callable[[], object], reps: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(event_ms(fn, device) for _ in range(reps))


def copy_bandwidth(nbytes: int, device: torch.device, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (2 x nbytes per copy).

    This is the practical memory bandwidth every floor below is divided by.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = median_event_ms(lambda: dst.copy_(src), reps, device)
    del src, dst
    return 2 * nbytes / (ms / 1e3)


def copy_floor_ms(nbytes: int, device: torch.device, reps: int) -> float:
    """Median time of one flat copy of ``nbytes`` (the least a snapshot or restore can cost)."""
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = median_event_ms(lambda: dst.copy_(src), reps, device)
    del src, dst
    return ms


def graph_ms(fn: Callable[[], object], repeat: int = 20, reps: int = 30) -> float:
    """Median milliseconds of one ``fn()`` inside a CUDA graph of ``repeat`` back-to-back calls.

    Why: a kernel of a few microseconds timed eagerly measures the Python
    launch, not the kernel; in a graph (as the engine runs it) the launch gaps
    shrink to what the device adds between kernels.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeat)
    return statistics.median(times)
