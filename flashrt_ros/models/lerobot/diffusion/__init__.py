"""Diffusion Policy: ``configuration_diffusion`` (``DiffusionConfig``), ``modeling_diffusion``
(``DiffusionPolicy``: arena state and the denoising loop), ``diffusion_net`` (image encoder and 1-D UNet),
``conv1d`` (the UNet's convolutions), ``schedulers`` (DDPM / DDIM reverse steps)."""
from flashrt_ros.models.lerobot.diffusion.configuration_diffusion import DiffusionConfig
from flashrt_ros.models.lerobot.diffusion.modeling_diffusion import DiffusionPolicy

__all__ = ["DiffusionConfig", "DiffusionPolicy"]
