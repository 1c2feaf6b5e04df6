"""How to copy a capsule's segments: one ``_foreach_copy_`` launch vs one ``copy_`` per segment.

A capsule of an attention model is one segment per KV buffer (each live only up
to the position), so a snapshot or restore is N copies of total size B. This
prints, for a few (N, B), the median time of: one flat copy of B bytes (the
floor), ``torch._foreach_copy_`` over the N segments, and a loop of ``copy_``
(CUDA events, median of 50). Run on a GPU: ``python -m benchmarks.kernel_segment_copies``.
"""
from __future__ import annotations

import torch

from benchmarks.gpu_args import gpu_benchmark_args
from benchmarks.timing import median_event_ms


def _ms(fn) -> float:
    return median_event_ms(fn, 50, torch.device("cuda"))


def main() -> None:
    gpu_benchmark_args(__doc__, "python -m benchmarks.kernel_segment_copies")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| segments | MiB | flat copy ms | foreach ms | copy_ loop ms | foreach/flat | loop/flat |")
    print("|---|---|---|---|---|---|---|")
    for n, mib in ((1, 43), (13, 43), (13, 211), (61, 45), (61, 360)):
        total = mib << 20
        size = total // n
        src = torch.randint(0, 255, (n * size,), dtype=torch.uint8, device="cuda")
        dst = torch.empty(n * size * 2, dtype=torch.uint8, device="cuda")      # gaps between segments
        srcs = [src[i * size:(i + 1) * size] for i in range(n)]
        dsts = [dst[2 * i * size:(2 * i + 1) * size] for i in range(n)]
        flat_dst = dst[: n * size]
        flat = _ms(lambda: flat_dst.copy_(src))
        fused = _ms(lambda: torch._foreach_copy_(dsts, srcs))
        loop = _ms(lambda: [d.copy_(s) for d, s in zip(dsts, srcs)])
        print(f"| {n} | {mib} | {flat:.3f} | {fused:.3f} | {loop:.3f} | {fused / flat:.2f} | {loop / flat:.2f} |")


if __name__ == "__main__":
    main()
