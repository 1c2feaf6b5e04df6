"""Scratch that a kernel keeps between launches: made on the first (eager) call, never inside a graph capture.

Why one place: the split-K products (``rows_matmul``) and the merged split attention (``prefix_attention``, and
``attention``'s decode and short-chunk form) each keep float32 slices or arrival counts per weight matrix or key
buffer. The counts must start at 0, and a
``torch.zeros`` inside a capture would only be a recorded memset: the eager calls around the graph would see
whatever the memory held. So the first call must be eager (the graph runners warm up before they capture), and
the scratch is kept, keyed by the buffer it serves, so a graph replays on scratch of its own. Nothing kept here is
state: the counts are 0 again at the end of every launch, and no capsule needs them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")
_KEPT: dict[tuple, object] = {}


def kept(owner: torch.Tensor, key: tuple, make: Callable[[], T], what: str) -> T:
    """``make()`` for ``(owner's buffer, key)`` on its first call, the same object after; ``what`` names the kernel
    in the error a first call inside a CUDA graph capture raises."""
    full = (owner.data_ptr(), owner.device, *key)
    if full not in _KEPT:
        if owner.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{what} must run once before a CUDA graph captures it (its arrival counts are made "
                               f"zeroed outside the capture)")
        _KEPT[full] = make()
    return _KEPT[full]  # type: ignore[return-value]


def kept_for(owner: torch.Tensor, kind: str) -> list:
    """Everything kept for ``owner``'s buffer under keys that start with ``kind`` (tests check the counts are back
    at 0)."""
    return [v for k, v in _KEPT.items() if k[0] == owner.data_ptr() and k[2] == kind]
