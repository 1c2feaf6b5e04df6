"""``nn.Linear`` whose batch-1 products on CUDA run as our triton GEMV.

Why a subclass: state dicts, loaders and ``.to()`` keep working unchanged
(same parameter names), while a decode step's matrix-vector products (one
row of input) skip cuBLAS, whose GEMM tiles waste most of their work and, for
short reductions, add a split-K reduction kernel (benchmarks/kernel_gemv.py).
Everything else (prefill, CPU, bias) is ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_ros.ops.triton import use_triton


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.bias is None and x.dim() == 2 and x.shape[0] == 1 and use_triton(x)
                and self.weight.dtype == x.dtype):
            from flashrt_ros.ops.triton.gemv import gemv
            return gemv(x, self.weight)
        return F.linear(x, self.weight, self.bias)
