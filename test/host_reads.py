"""A guard for the tests of step bodies that must be capturable as CUDA graphs: any host read raises.

Why: a host read (``.item()``, ``bool(t)``, ``.cpu()``, ...) synchronises with the
device and cannot be captured; on a CPU-only machine nothing would notice, so the
tests make every such read an error while a body runs.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def no_host_reads(monkeypatch):
    """Inside: every host read of a tensor raises ``AssertionError`` (and autograd is off)."""
    def host_read(*_args, **_kwargs):
        raise AssertionError("host read of a tensor inside a step body")
    with torch.no_grad():
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, host_read)
        try:
            yield
        finally:
            monkeypatch.undo()
