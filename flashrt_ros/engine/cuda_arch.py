"""Does the installed torch carry kernels for this GPU? Asked once, before anything runs on it.

Why: a torch wheel built for other GPUs imports fine, reports CUDA available, and
fails deep inside the first kernel ("no kernel image is available for execution on
the device"), in the middle of loading weights or capturing graphs. The case that
motivates it: a Jetson Thor (compute capability 11.0, ``sm_110`` since CUDA 13) with
a CUDA 12 build of torch, whose newest kernels are for ``sm_100`` / ``sm_120``. So the
node refuses at configure with a message naming the GPU, what the wheel carries and
what to install (docs/jetson.md).

The rules (CUDA's compatibility guarantees), applied to ``torch.cuda.get_arch_list()``:

* ``sm_XY`` (machine code) runs on a GPU of the same major version and a minor of at
  least ``Y`` (``sm_80`` runs on 8.6);
* ``sm_XYf`` (family-specific, CUDA 12.9+) the same;
* ``sm_XYa`` (architecture-specific) runs on exactly ``X.Y``;
* ``compute_XY`` (PTX) is compiled by the driver for any GPU of capability ``X.Y`` or
  newer, across majors; ``compute_XYa`` only for exactly ``X.Y``.
"""
from __future__ import annotations

import re
from typing import Sequence

_ENTRY = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def _capability(digits: str) -> tuple[int, int]:
    """``"110"`` -> (11, 0), ``"86"`` -> (8, 6): the last digit is the minor version."""
    return int(digits[:-1]), int(digits[-1])


def runs_on(entry: str, capability: tuple[int, int]) -> bool:
    """Whether one ``get_arch_list()`` entry gives code that runs on a GPU of ``capability``."""
    match = _ENTRY.match(entry.strip())
    if match is None:
        return False
    kind, digits, suffix = match.groups()
    built = _capability(digits)
    if suffix == "a":
        return built == capability
    if kind == "compute":
        return built <= capability
    return built[0] == capability[0] and built[1] <= capability[1]


def missing_kernels(capability: tuple[int, int], arch_list: Sequence[str], gpu_name: str = "",
                    torch_version: str = "") -> str | None:
    """Why this torch cannot run on a GPU of ``capability`` (a message naming what to install), or None.

    An empty ``arch_list`` says nothing (a build that does not report it): None."""
    if not arch_list or any(runs_on(entry, capability) for entry in arch_list):
        return None
    major, minor = capability
    gpu = f"{gpu_name}, " if gpu_name else ""
    build = f"torch {torch_version}" if torch_version else "the installed torch"
    hint = ("install a torch built for it (CUDA 13, e.g. PyTorch's cu130 wheels; docs/jetson.md)"
            if major >= 11 else "install a torch built for it (a CUDA build whose arch list includes it)")
    return (f"{build} has no kernels for this GPU ({gpu}compute capability {major}.{minor}, sm_{major}{minor}): "
            f"it carries {' '.join(arch_list)}, none of which runs on {major}.{minor} (machine code runs within "
            f"its major version, PTX only on newer GPUs); {hint}, or set device:=cpu")


def check_device(device: object) -> None:
    """Raise InvalidArgument when ``device`` is a CUDA device this torch has no kernels for."""
    import torch

    from flashrt_ros.runtime.errors import InvalidArgument

    if getattr(device, "type", None) != "cuda":
        return
    problem = missing_kernels(tuple(torch.cuda.get_device_capability(device)), torch.cuda.get_arch_list(),
                              torch.cuda.get_device_name(device), torch.__version__)
    if problem:
        raise InvalidArgument(problem)
