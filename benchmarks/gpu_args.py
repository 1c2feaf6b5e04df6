"""Command line of the GPU-only micro-benchmarks (``kernel_*``): ``--help``, and a clear refusal without CUDA.

Why: they used to start timing at once, so ``--help`` ran the benchmark and, on a
machine without CUDA, ended in a traceback from deep inside torch.
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch


def gpu_benchmark_args(doc: str, prog: str,
                       add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
                       ) -> argparse.Namespace:
    """Parse ``sys.argv`` (``doc`` is the help text); exit 2 with one line when no CUDA device exists."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, f"{prog}: needs a CUDA GPU (torch {torch.__version__} sees none)\n")
    return args
