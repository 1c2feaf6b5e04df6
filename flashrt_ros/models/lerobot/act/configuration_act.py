"""ACT's configuration: the fields of LeRobot's ``ACTConfig`` that shape inference, read from ``config.json``.

Why apart from the model (``modeling_act.py``): what a checkpoint asks for is
checked here, before a single weight is allocated (a refused option names itself).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, PolicyIO
from flashrt_ros.runtime.errors import InvalidArgument


@dataclass(frozen=True)
class ACTConfig:
    """The fields of LeRobot's ``ACTConfig`` that shape inference (read from ``config.json``)."""

    state_dim: int
    env_state_dim: int
    action_dim: int
    cameras: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    chunk_size: int = 100
    n_action_steps: int = 100
    vision_backbone: str = "resnet18"
    pre_norm: bool = False
    dim_model: int = 512
    n_heads: int = 8
    dim_feedforward: int = 3200
    feedforward_activation: str = "relu"
    n_encoder_layers: int = 4
    n_decoder_layers: int = 1
    use_vae: bool = True
    latent_dim: int = 32
    n_vae_encoder_layers: int = 4
    temporal_ensemble_coeff: float | None = None

    @classmethod
    def from_checkpoint(cls, ckpt: LeRobotCheckpoint) -> ACTConfig:
        c = ckpt.config
        if c.get("replace_final_stride_with_dilation"):
            raise InvalidArgument("replace_final_stride_with_dilation is not supported (torchvision's "
                                  "BasicBlock ResNets refuse dilation too)")
        if int(c.get("n_obs_steps", 1)) != 1:
            raise InvalidArgument("ACT supports n_obs_steps == 1 only")
        fields = {k: c[k] for k in ("chunk_size", "n_action_steps", "vision_backbone", "pre_norm", "dim_model",
                                    "n_heads", "dim_feedforward", "feedforward_activation", "n_encoder_layers",
                                    "n_decoder_layers", "use_vae", "latent_dim", "n_vae_encoder_layers",
                                    "temporal_ensemble_coeff") if k in c}
        return cls(**asdict(PolicyIO.from_checkpoint(ckpt, "ACT")), **fields)
