"""SmolVLA's configuration: the fields of LeRobot's ``SmolVLAConfig`` that shape inference, and its VLM's sizes.

Why the VLM's sizes are read here too: LeRobot's SmolVLA ``config.json`` names
its VLM (``vlm_model_name``, a hub id or a local directory) instead of holding
its sizes. The runtime has no hub and no transformers: it reads a ``config.json``
from the checkpoint or from the local directory named, or falls back to the
published SmolVLM2-500M sizes. (Its tokenizer: ``tokenizer_files.py``.)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, PolicyIO
from flashrt_ros.models.lerobot.siglip import SiglipSizes
from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.runtime.errors import InvalidArgument

PUBLISHED_VLM = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"


@dataclass(frozen=True)
class VLMSizes:
    """The SmolVLM config fields that shape SmolVLA (read from the VLM's ``config.json``)."""

    text_hidden: int = 960
    text_heads: int = 15
    text_kv_heads: int = 5
    head_dim: int = 64
    text_intermediate: int = 2560
    rms_norm_eps: float = 1e-5
    vocab_size: int = 49280
    vision_hidden: int = 768
    vision_heads: int = 12
    vision_intermediate: int = 3072
    vision_layers: int = 12
    patch_size: int = 16
    image_size: int = 512
    vision_eps: float = 1e-6
    vision_act: str = "gelu_pytorch_tanh"
    scale_factor: int = 4

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor ** 2

    @property
    def siglip(self) -> SiglipSizes:
        """The vision tower's sizes (the ``vision_*`` fields mirror SmolVLM's ``vision_config``)."""
        return SiglipSizes(hidden=self.vision_hidden, intermediate=self.vision_intermediate, layers=self.vision_layers,
                           heads=self.vision_heads, patch_size=self.patch_size, eps=self.vision_eps)


@dataclass(frozen=True)
class SmolVLAConfig:
    """The fields of LeRobot's ``SmolVLAConfig`` that shape inference, plus the VLM's sizes."""

    state_dim: int
    env_state_dim: int
    action_dim: int
    cameras: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    vlm: VLMSizes = field(default_factory=VLMSizes)
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    resize_imgs_with_padding: tuple[int, int] | None = (512, 512)
    tokenizer_max_length: int = 48
    num_steps: int = 10
    attention_mode: str = "cross_attn"
    num_expert_layers: int = -1
    num_vlm_layers: int = 16
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    min_period: float = 4e-3
    max_period: float = 4.0
    seed: int = 0                        # noise seed written at every episode start (reset)

    @property
    def expert_hidden(self) -> int:
        return int(self.vlm.text_hidden * self.expert_width_multiplier)

    @property
    def n_expert_layers(self) -> int:
        return self.num_expert_layers if self.num_expert_layers > 0 else self.num_vlm_layers

    def is_self_attn(self, layer: int) -> bool:
        """Whether (VLM / expert) layer ``layer`` attends to itself rather than only to the prefix."""
        return "cross" not in self.attention_mode or (
            self.self_attn_every_n_layers > 0 and layer % self.self_attn_every_n_layers == 0)

    @property
    def prefix_capacity(self) -> int:
        """Prefix rows: every camera's image tokens, the instruction at its maximum length, the state."""
        return len(self.cameras) * self.vlm.image_tokens + self.tokenizer_max_length + 1

    @classmethod
    def from_checkpoint(cls, ckpt: LeRobotCheckpoint, vlm: VLMSizes, tokenizer: TokenizerSettings) -> SmolVLAConfig:
        c = ckpt.config
        for flag, why in (("adapt_to_pi_aloha", "the Aloha joint/gripper conversions"),
                          ("use_delta_joint_actions_aloha", "delta joint actions"),
                          ("add_image_special_tokens", "image special tokens around image features")):
            if c.get(flag):
                raise InvalidArgument(f"SmolVLA with {flag}=true ({why}) is not supported")
        if int(c.get("n_obs_steps", 1)) != 1:
            raise InvalidArgument("SmolVLA supports n_obs_steps == 1 only")
        if STATE not in ckpt.input_features:
            raise InvalidArgument(f"{ckpt.path}/config.json: SmolVLA needs an {STATE!r} input")
        io = PolicyIO.from_vla_checkpoint(ckpt, "SmolVLA")
        names = ("chunk_size", "n_action_steps", "max_state_dim", "max_action_dim", "num_steps", "attention_mode",
                 "num_expert_layers", "num_vlm_layers", "self_attn_every_n_layers", "expert_width_multiplier",
                 "min_period", "max_period")
        fields = {k: c[k] for k in names if k in c}
        resize = c.get("resize_imgs_with_padding", (512, 512))
        cfg = cls(**asdict(io), vlm=vlm, resize_imgs_with_padding=tuple(int(x) for x in resize) if resize else None,
                  tokenizer_max_length=tokenizer.max_length, **fields)
        if cfg.action_dim > cfg.max_action_dim or cfg.state_dim > cfg.max_state_dim:
            raise InvalidArgument("SmolVLA: state/action longer than max_state_dim/max_action_dim")
        if cfg.n_action_steps > cfg.chunk_size:
            raise InvalidArgument("SmolVLA: n_action_steps must be <= chunk_size")
        if cfg.num_vlm_layers % cfg.n_expert_layers:
            raise InvalidArgument("SmolVLA: num_vlm_layers must be a multiple of num_expert_layers")
        side = cfg.resize_imgs_with_padding or cfg.image_shape[1:][::-1]
        if tuple(side) != (vlm.image_size, vlm.image_size):
            raise InvalidArgument(f"SmolVLA: images reach the vision encoder at {tuple(side)} (width, height); "
                                  f"the VLM expects {vlm.image_size}x{vlm.image_size}")
        return cfg


def vlm_sizes_from_config(cfg: dict) -> VLMSizes:
    """``VLMSizes`` from a SmolVLM ``config.json`` (transformers' layout: ``text_config``, ``vision_config``)."""
    t, v = cfg.get("text_config", {}), cfg.get("vision_config", {})
    d = VLMSizes()
    heads = int(t.get("num_attention_heads", d.text_heads))
    hidden = int(t.get("hidden_size", d.text_hidden))
    return VLMSizes(
        text_hidden=hidden, text_heads=heads, text_kv_heads=int(t.get("num_key_value_heads", heads)),
        head_dim=int(t.get("head_dim") or hidden // heads),
        text_intermediate=int(t.get("intermediate_size", d.text_intermediate)),
        rms_norm_eps=float(t.get("rms_norm_eps", d.rms_norm_eps)),
        vocab_size=int(t.get("vocab_size", cfg.get("vocab_size", d.vocab_size))),
        vision_hidden=int(v.get("hidden_size", d.vision_hidden)),
        vision_heads=int(v.get("num_attention_heads", d.vision_heads)),
        vision_intermediate=int(v.get("intermediate_size", d.vision_intermediate)),
        vision_layers=int(v.get("num_hidden_layers", d.vision_layers)),
        patch_size=int(v.get("patch_size", d.patch_size)), image_size=int(v.get("image_size", d.image_size)),
        vision_eps=float(v.get("layer_norm_eps", d.vision_eps)), vision_act=str(v.get("hidden_act", d.vision_act)),
        scale_factor=int(cfg.get("scale_factor", d.scale_factor)))


def vlm_sizes(ckpt: LeRobotCheckpoint) -> VLMSizes:
    """The VLM's sizes: ``<checkpoint>/vlm_config.json``, else the ``config.json`` in the local directory
    ``vlm_model_name`` names, else the published SmolVLM2-500M sizes when it names that model."""
    name = str(ckpt.config.get("vlm_model_name", PUBLISHED_VLM))
    for candidate in (ckpt.path / "vlm_config.json", Path(name).expanduser() / "config.json"):
        if candidate.is_file():
            return vlm_sizes_from_config(json.loads(candidate.read_text()))
    if name == PUBLISHED_VLM:
        return VLMSizes()
    raise InvalidArgument(f"SmolVLA: the VLM {name!r} is neither a local directory with a config.json nor "
                          f"{PUBLISHED_VLM}; put its config.json in the checkpoint as vlm_config.json")
