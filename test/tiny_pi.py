"""Our π0 / π0.5 at tiny sizes with seeded random weights (no checkpoint, no LeRobot needed).

Used by the capsule tests, the CUDA tests and the benchmark's graph checks: they
test our state handling; parity with LeRobot is ``test_lerobot_pi0.py``. π0.5
builds its prompt with the offline stand-in tokenizer (``pi_reference/tokenizer.py``).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from flashrt_ros.models.lerobot.pi0.gemma import GemmaSizes
from flashrt_ros.models.lerobot.pi0.configuration_pi0 import PALIGEMMA_TOKENIZER, PI0Config
from flashrt_ros.models.lerobot.pi0.modeling_pi0 import PI0Policy
from flashrt_ros.models.lerobot.siglip import SiglipSizes
from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
from pi_reference.tokenizer import write_tokenizer

CAMERAS = ("observation.images.top", "observation.images.wrist")
TINY = dict(vlm=GemmaSizes(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16, vocab_size=256),
            expert=GemmaSizes(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16, vocab_size=256),
            vision=SiglipSizes(hidden=32, intermediate=64, layers=2, heads=2, patch_size=8),
            image_resolution=(32, 32))
_TOKENIZER_DIR: list[Path] = []


def tokenizer_file() -> Path:
    """The stand-in tokenizer's ``tokenizer.json`` (written once per process)."""
    if not _TOKENIZER_DIR:
        _TOKENIZER_DIR.append(write_tokenizer(Path(tempfile.mkdtemp(prefix="pi_tokenizer_"))))
    return _TOKENIZER_DIR[0] / "tokenizer.json"


def tiny_config(pi05: bool, **overrides) -> PI0Config:
    args = dict(pi05=pi05, state_dim=4, env_state_dim=0, action_dim=3, cameras=CAMERAS, image_shape=(3, 24, 40),
                chunk_size=6, n_action_steps=5, max_state_dim=8, max_action_dim=8, tokenizer_max_length=48,
                prompt_state_dim=6, **TINY)
    args.update(overrides)
    return PI0Config(**args)


def tiny_pi(pi05: bool = False, seed: int = 0, scale: float = 0.2, **overrides) -> PI0Policy:
    """Our π0 (``pi05=False``) or π0.5 at tiny sizes: default init plus seeded noise on every weight."""
    cfg = tiny_config(pi05, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = PI0Policy(cfg, tokenizer=TokenizerSettings(PALIGEMMA_TOKENIZER), tokenizer_file=tokenizer_file())
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(scale * torch.randn_like(p))
    return policy.eval().requires_grad_(False)


def tiny_observation(i: int, cfg: PI0Config) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    obs = {"observation.state": torch.randn(cfg.state_dim, generator=g)}
    for cam in cfg.cameras:
        obs[cam] = torch.rand(cfg.image_shape, generator=g)
    return obs
