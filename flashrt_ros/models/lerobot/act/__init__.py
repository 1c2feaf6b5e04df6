"""ACT (Action Chunking Transformer): ``modeling_act`` (``ACTConfig``, ``ACTPolicy``)."""
from flashrt_ros.models.lerobot.act.modeling_act import ACTConfig, ACTPolicy

__all__ = ["ACTConfig", "ACTPolicy"]
