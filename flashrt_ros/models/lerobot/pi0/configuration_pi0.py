"""π0 / π0.5's configuration: the fields of LeRobot's ``PI0Config`` / ``PI05Config`` that shape inference, and
the network sizes (the published Gemma variants, or ``pi_sizes.json`` beside a checkpoint of other sizes).

Why apart from the policy (``modeling_pi0.py``): what a checkpoint asks for is
read and checked here (sizes, cameras, π0.5's prompt width) before a single
weight of the 3 B model is allocated.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from flashrt_ros.models.lerobot.checkpoint import PREPROCESSOR, LeRobotCheckpoint, PolicyIO
from flashrt_ros.models.lerobot.pi0.gemma import GEMMA_VARIANTS, GemmaSizes
from flashrt_ros.models.lerobot.siglip import SiglipSizes
from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
from flashrt_ros.models.policy_features import STATE
from flashrt_ros.runtime.errors import InvalidArgument

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
#: optional file beside a checkpoint of other than the published sizes (the tests' reduced ones)
SIZES_FILE = "pi_sizes.json"


@dataclass(frozen=True)
class PI0Config:
    """The fields of LeRobot's ``PI0Config`` / ``PI05Config`` that shape inference, plus the network sizes."""

    pi05: bool
    state_dim: int
    env_state_dim: int
    action_dim: int
    cameras: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    vlm: GemmaSizes = GEMMA_VARIANTS["gemma_2b"]
    expert: GemmaSizes = GEMMA_VARIANTS["gemma_300m"]
    vision: SiglipSizes = field(default_factory=SiglipSizes)
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    image_resolution: tuple[int, int] = (224, 224)
    tokenizer_max_length: int = 48
    prompt_state_dim: int = 32             # π0.5: numbers in the prompt (its preprocessor step's max_state_dim)
    min_period: float = 4e-3
    max_period: float = 4.0
    seed: int = 0                          # noise seed written at every episode start (reset)

    @property
    def image_tokens(self) -> int:
        return (self.image_resolution[0] // self.vision.patch_size) ** 2

    @property
    def image_rows(self) -> int:
        return len(self.cameras) * self.image_tokens

    @property
    def prefix_capacity(self) -> int:
        """Prefix rows: every camera's image tokens, then the instruction (prompt) at its maximum length."""
        return self.image_rows + self.tokenizer_max_length

    @property
    def state_width(self) -> int:
        """The stored (padded) state: π0's ``state_proj`` input, or the numbers of π0.5's prompt."""
        return self.prompt_state_dim if self.pi05 else self.max_state_dim

    @property
    def suffix_len(self) -> int:
        """The expert's tokens: π0 a state token and the chunk, π0.5 the chunk."""
        return self.chunk_size + (0 if self.pi05 else 1)

    @classmethod
    def from_checkpoint(cls, ckpt: LeRobotCheckpoint, tokenizer: TokenizerSettings) -> PI0Config:
        c, kind = ckpt.config, ckpt.policy_type
        name = "π0.5" if kind == "pi05" else "π0"
        if int(c.get("n_obs_steps", 1)) != 1:
            raise InvalidArgument(f"{name} supports n_obs_steps == 1 only")
        rtc = c.get("rtc_config")
        if isinstance(rtc, dict) and rtc.get("enabled"):
            raise InvalidArgument(f"{name} with rtc_config.enabled=true is not supported: Real-Time Chunking is the "
                                  "engine's replan rtc (rtc_* parameters), not a checkpoint setting")
        if STATE not in ckpt.input_features:
            raise InvalidArgument(f"{ckpt.path}/config.json: {name} needs an {STATE!r} input")
        # state and cameras only: π reads no environment state (LeRobot ignores it too)
        io = PolicyIO.from_vla_checkpoint(ckpt, name, kinds=("STATE", "VISUAL"))
        resolution = tuple(int(x) for x in c.get("image_resolution", (224, 224)))
        if resolution[0] != resolution[1]:
            raise InvalidArgument(f"{name}: image_resolution must be square (PaliGemma), got {resolution}")
        vlm, expert, vision = _sizes(ckpt)
        names = ("chunk_size", "n_action_steps", "max_state_dim", "max_action_dim", "num_inference_steps",
                 "min_period", "max_period")
        cfg = cls(pi05=kind == "pi05", **asdict(io), vlm=vlm, expert=expert, vision=vision,
                  image_resolution=resolution, tokenizer_max_length=tokenizer.max_length,
                  prompt_state_dim=_prompt_state_dim(ckpt), **{k: c[k] for k in names if k in c})
        if cfg.action_dim > cfg.max_action_dim or cfg.state_dim > cfg.state_width:
            raise InvalidArgument(f"{name}: state/action longer than the padded width ({cfg.state_width} / "
                                  f"{cfg.max_action_dim})")
        if cfg.n_action_steps > cfg.chunk_size:
            raise InvalidArgument(f"{name}: n_action_steps must be <= chunk_size")
        if (expert.head_dim, expert.num_kv_heads, expert.num_heads) != (vlm.head_dim, vlm.num_kv_heads, vlm.num_heads):
            raise InvalidArgument(f"{name}: the expert must have the language model's attention heads")
        if expert.depth > vlm.depth:
            raise InvalidArgument(f"{name}: the expert has more layers than the language model")
        return cfg


def _prompt_state_dim(ckpt: LeRobotCheckpoint) -> int:
    """How many state numbers π0.5's preprocessor writes into the prompt: its state step's ``max_state_dim``.

    LeRobot 0.4.4 saves that step without its fields, so a reloaded preprocessor pads to the default 32
    whatever the policy's ``max_state_dim``; read it from the file when present, else 32, as LeRobot does."""
    pipeline = json.loads((ckpt.path / PREPROCESSOR).read_text())
    for step in pipeline.get("steps", []):
        if step.get("registry_name") == "pi05_prepare_state_tokenizer_processor_step":
            return int(step.get("config", {}).get("max_state_dim", 32))
    return 32


def _sizes(ckpt: LeRobotCheckpoint) -> tuple[GemmaSizes, GemmaSizes, SiglipSizes]:
    """The published variants named in config.json, or ``pi_sizes.json`` beside the checkpoint."""
    path = ckpt.path / SIZES_FILE
    if path.is_file():
        raw = json.loads(path.read_text())
        try:
            return (GemmaSizes(**raw["paligemma"]), GemmaSizes(**raw["action_expert"]), SiglipSizes(**raw["vision"]))
        except (KeyError, TypeError) as exc:
            raise InvalidArgument(f"{path}: needs 'paligemma', 'action_expert' and 'vision' sizes ({exc})") from None
    out = []
    for key, default in (("paligemma_variant", "gemma_2b"), ("action_expert_variant", "gemma_300m")):
        variant = str(ckpt.config.get(key, default))
        if variant not in GEMMA_VARIANTS:
            raise InvalidArgument(f"{ckpt.path}/config.json: {key} {variant!r} is not one of {sorted(GEMMA_VARIANTS)}")
        out.append(GEMMA_VARIANTS[variant])
    return out[0], out[1], SiglipSizes()
