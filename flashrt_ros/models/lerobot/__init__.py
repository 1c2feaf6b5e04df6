"""LeRobot checkpoints (ACT, Diffusion Policy, SmolVLA, π0, π0.5, GR00T N1.5) as arena-backed ``PolicyModule``s, without importing LeRobot.

Laid out as LeRobot lays out ``lerobot/policies``: one folder per policy
(``act/``, ``diffusion/``, ``smolvla/``, ``pi0/`` for π0 and π0.5, ``groot/``), each with
its ``configuration_<name>.py`` (the config dataclass read from ``config.json``)
and ``modeling_<name>.py`` (the ``PolicyModule``), its network (``<name>_net.py``)
and its ``fast`` numerics (``<name>_fast.py``) where it has them; ``factory.py``
builds the policy a checkpoint's ``"type"`` names. What several policies share
sits here: reading a checkpoint (``checkpoint.py``), normalisation
(``normalize.py``), the VLAs' instruction and episode buffers (``instruction.py``),
tokenizer files, the ResNet trunk, convolution layouts and SigLIP.
"""
from flashrt_ros.models.lerobot.factory import (NUMERICS, SUPPORTED_TYPES, build_policy, cast_networks, default_dtype,
                                                default_numerics, load_lerobot_policy, load_weights)

__all__ = ["NUMERICS", "SUPPORTED_TYPES", "build_policy", "cast_networks", "default_dtype", "default_numerics",
           "load_lerobot_policy", "load_weights"]
