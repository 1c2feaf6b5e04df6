"""Makes LeRobot 0.4.4's training path importable in the CPU training venv; run as a script it checks that.

Two known breaks (/work notes, test/lerobot_reference.py has the same two for the parity tests):
* PyPI's torchvision wheel is a CUDA build; with the CPU torch wheel its compiled ops do not load and
  ``import torchvision`` fails registering meta kernels for them. ACT and Diffusion Policy use only
  pure-torch parts of torchvision (resnet, FrozenBatchNorm2d, Resize, CenterCrop), so that one
  registration module is skipped.
* ``lerobot.policies`` imports ``groot``'s configuration through the ``groot`` package, whose
  ``__init__`` builds its model and fails against these pins; we never use GR00T, so the package
  is made importable without its ``__init__``.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def apply() -> None:
    try:
        import torchvision  # noqa: F401
    except (RuntimeError, ImportError, OSError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401,F811
    spec = importlib.util.find_spec("lerobot")
    if spec is not None and spec.submodule_search_locations and "lerobot.policies.groot" not in sys.modules:
        stub = types.ModuleType("lerobot.policies.groot")
        stub.__path__ = [str(Path(spec.submodule_search_locations[0], "policies", "groot"))]
        sys.modules["lerobot.policies.groot"] = stub


if __name__ == "__main__":
    apply()
    import lerobot.scripts.lerobot_train  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401
    from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: F401
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: F401
    print("lerobot training path imports")
