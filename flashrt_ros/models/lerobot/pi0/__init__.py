"""π0 and π0.5: ``configuration_pi0`` (``PI0Config``), ``modeling_pi0`` (``PI0Policy``, ``build_pi0``),
``processor_pi05`` (π0.5's prompt with the state in it), ``pi0_net`` (PaliGemma and the action expert),
``gemma`` (their decoder layers), ``pi0_fast`` / ``gemma_fast`` (the ``fast`` numerics)."""
from flashrt_ros.models.lerobot.pi0.configuration_pi0 import PI0Config
from flashrt_ros.models.lerobot.pi0.modeling_pi0 import PI0Policy, build_pi0

__all__ = ["PI0Config", "PI0Policy", "build_pi0"]
