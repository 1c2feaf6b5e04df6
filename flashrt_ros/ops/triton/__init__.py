"""Triton kernels: the CUDA fast path of ``flashrt_ros.ops`` (one concept per module).

Why they exist: at batch 1 a decode step is a chain of tiny operations, and a
CUDA graph still pays a few microseconds for every kernel in it. Each kernel
here replaces a chain of small torch ops (a residual add and its RMSNorm, a
conv-window update, a whole Gated DeltaNet recurrent step, RoPE plus the KV
write, attention over the live part of a static KV cache) with one launch that
reads and writes the same arena buffers. They hold no state between steps,
never sync with the host and read positions from device tensors, so they are
safe inside captured graphs. (Split-K products and merged split attention keep
scratch made on their first eager call, ``scratch.kept``: arrival counts that
are 0 again at the end of every launch, so no capsule needs them.)

Each wrapper computes what its torch reference in ``flashrt_ros.ops`` computes
(rounding to the model dtype at the same points). The dispatchers there pick
the kernel for CUDA tensors when triton imports; the reference runs otherwise.
Tests run the kernels on CPU tensors under ``TRITON_INTERPRET=1`` and on a GPU
against the references (``test/test_triton_*.py``).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator

import torch



class Switch:
    """A process-wide on/off for one family of kernels; ``with switch(False):`` turns it off for a block (a
    benchmark compares both paths in one process). Graphs captured inside keep the path they were captured with."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    @contextmanager
    def __call__(self, enabled: bool) -> Iterator[None]:
        previous, self.enabled = self.enabled, enabled
        try:
            yield
        finally:
            self.enabled = previous


#: every triton kernel of ``flashrt_ros.ops`` (``use_triton``)
fast_kernels = Switch()


@functools.cache
def triton_available() -> bool:
    """Whether triton imports (it does not on the CPU-only CI machine unless installed)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(x: torch.Tensor) -> bool:
    """Whether the fast path applies to tensors like ``x``: CUDA, triton importable, not switched off."""
    return fast_kernels.enabled and x.is_cuda and triton_available()


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
