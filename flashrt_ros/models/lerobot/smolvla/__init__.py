"""SmolVLA: ``configuration_smolvla`` (``SmolVLAConfig``, the VLM's sizes), ``modeling_smolvla``
(``SmolVLAPolicy``, ``build_smolvla``), ``smolvla_net`` (SmolVLM text model, connector and action expert),
``smolvla_fast`` / ``llama_fast`` (the ``fast`` numerics)."""
from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import SmolVLAConfig
from flashrt_ros.models.lerobot.smolvla.modeling_smolvla import SmolVLAPolicy, build_smolvla

__all__ = ["SmolVLAConfig", "SmolVLAPolicy", "build_smolvla"]
