"""What a SmolVLA checkpoint leaves to another file: the VLM's sizes.

Why a reader of its own: LeRobot's SmolVLA ``config.json`` names its VLM
(``vlm_model_name``, a hub id or a local directory) instead of holding its
sizes. The runtime has no hub and no transformers: it reads a ``config.json``
from the checkpoint or from the local directory named, or falls back to the
published SmolVLM2-500M sizes. (Its tokenizer: ``tokenizer_files.py``.)
"""
from __future__ import annotations

import json
from pathlib import Path

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint
from flashrt_ros.models.lerobot.smolvla.smolvla_net import VLMSizes
from flashrt_ros.runtime.errors import InvalidArgument

PUBLISHED_VLM = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"


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
