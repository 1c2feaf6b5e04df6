"""Run triton kernels on CPU tensors (``TRITON_INTERPRET=1``) where no GPU exists.

conftest.py sets ``TRITON_INTERPRET=1`` before anything imports triton when
CUDA is absent, so the kernels in ``flashrt_ros.ops.triton`` execute in
triton's numpy interpreter. On a GPU machine the variable stays unset and the
same tests run the compiled kernels on CUDA tensors.

Why two patches of triton 3.6's interpreter (test-only, applied when it is on):
- it turns a loaded scalar into a Python int with ``int(array)``, which numpy 2
  refuses for a 1-element 1-d array; loop bounds read from device tensors
  (positions) need that conversion;
- it keeps bf16 tiles as raw uint16 and ``tl.dot`` multiplies the raw bits; the
  patch widens bf16 operands to float32 first (exact), as the hardware does.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: Relative-error bound for bfloat16 results. Compiled kernels round float32 -> bf16 to
#: nearest (1e-2 is METHOD.md's bf16 band); triton 3.6's interpreter truncates instead,
#: which is up to one more bf16 ulp per rounding point.
BF16_TOL = 3e-2 if INTERPRET else 1e-2


def _patch_numpy2_index() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_flashrt_patched", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._flashrt_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def _patch_bf16_dot() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot
    if getattr(original, "_flashrt_patched", False):
        return

    def widen(handle):  # type: ignore[no-untyped-def]
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._flashrt_patched = True  # type: ignore[attr-defined]
    interpreter.InterpreterBuilder.create_dot = create_dot


def kernel_device() -> torch.device:
    """Where the kernel tests put their tensors: the GPU if there is one, else the CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except Exception:
    HAVE_TRITON = False

if HAVE_TRITON and INTERPRET:
    _patch_numpy2_index()
    _patch_bf16_dot()

needs_triton = pytest.mark.skipif(
    not HAVE_TRITON or not (torch.cuda.is_available() or INTERPRET),
    reason="needs triton, and a CUDA GPU or TRITON_INTERPRET=1 (set by conftest on CPU machines)")
