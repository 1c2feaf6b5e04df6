"""ACT (Action Chunking Transformer): ``configuration_act`` (``ACTConfig``), ``modeling_act`` (``ACTPolicy``)."""
from flashrt_ros.models.lerobot.act.configuration_act import ACTConfig
from flashrt_ros.models.lerobot.act.modeling_act import ACTPolicy

__all__ = ["ACTConfig", "ACTPolicy"]
