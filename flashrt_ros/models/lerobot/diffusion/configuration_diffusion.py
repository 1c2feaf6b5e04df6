"""Diffusion Policy's configuration: the fields of LeRobot's ``DiffusionConfig`` that shape inference.

Why apart from the network (``diffusion_net.py``) and the policy
(``modeling_diffusion.py``): both are built from it, and what a checkpoint's
``config.json`` asks for is read and checked here before anything is allocated.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, PolicyIO
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.runtime.errors import InvalidArgument


@dataclass(frozen=True)
class DiffusionConfig:
    """The fields of LeRobot's ``DiffusionConfig`` that shape inference (read from ``config.json``)."""

    state_dim: int
    env_state_dim: int
    action_dim: int
    cameras: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8
    vision_backbone: str = "resnet18"
    resize_shape: tuple[int, int] | None = None
    crop_shape: tuple[int, int] | None = None
    use_group_norm: bool = True
    spatial_softmax_num_keypoints: int = 32
    use_separate_rgb_encoder_per_camera: bool = False
    down_dims: tuple[int, ...] = (512, 1024, 2048)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    noise_scheduler_type: str = "DDPM"
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"
    clip_sample: bool = True
    clip_sample_range: float = 1.0
    num_inference_steps: int | None = None
    seed: int = 0                      # noise seed written at every episode start (reset)

    @property
    def inference_steps(self) -> int:
        return self.num_inference_steps or self.num_train_timesteps

    @classmethod
    def from_checkpoint(cls, ckpt: LeRobotCheckpoint) -> DiffusionConfig:
        c = ckpt.config
        if STATE not in ckpt.input_features:
            raise InvalidArgument(f"{ckpt.path}/config.json: Diffusion Policy needs an {STATE!r} input")
        names = [f for f in cls.__dataclass_fields__ if f not in
                 ("state_dim", "env_state_dim", "action_dim", "cameras", "image_shape", "seed")]
        fields = {k: c[k] for k in names if k in c}
        for k in ("resize_shape", "crop_shape", "down_dims"):
            if fields.get(k) is not None:
                fields[k] = tuple(int(v) for v in fields[k])
        if fields.get("resize_shape") is not None:         # LeRobot derives the crop from resize * crop_ratio
            ratio = float(c.get("crop_ratio", 1.0))
            rs = fields["resize_shape"]
            fields["crop_shape"] = (int(rs[0] * ratio), int(rs[1] * ratio)) if ratio < 1.0 else None
        return cls(**asdict(PolicyIO.from_checkpoint(ckpt, "Diffusion Policy")), **fields)
