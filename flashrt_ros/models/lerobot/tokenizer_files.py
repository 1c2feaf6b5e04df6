"""Where a LeRobot checkpoint's instruction tokenizer lives, found without the model hub or transformers.

Why a reader of its own: a VLA's preprocessor names its tokenizer
(``tokenizer_processor`` step: ``tokenizer_name``, a hub id or a local
directory) instead of holding it. The runtime has no hub: it reads a
``tokenizer.json`` (the ``tokenizers`` library's format) from the checkpoint
directory, else from the local directory named, else from a copy the hub client
left in the local cache (``HF_HUB_CACHE`` / ``HF_HOME/hub`` /
``~/.cache/huggingface/hub``); nothing is downloaded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from flashrt_ros.models.lerobot.checkpoint import PREPROCESSOR, LeRobotCheckpoint
from flashrt_ros.runtime.errors import InvalidArgument

TOKENIZER_JSON = "tokenizer.json"


@dataclass(frozen=True)
class TokenizerSettings:
    """The checkpoint preprocessor's ``tokenizer_processor`` step."""

    name: str
    max_length: int = 48
    padding: str = "longest"


def tokenizer_settings(ckpt: LeRobotCheckpoint, default_name: str) -> TokenizerSettings:
    """The ``tokenizer_processor`` step of ``policy_preprocessor.json`` (name, max length, padding);
    ``default_name`` when the step names none (it was built from a tokenizer object)."""
    pipeline = json.loads((ckpt.path / PREPROCESSOR).read_text())
    for step in pipeline.get("steps", []):
        if step.get("registry_name") == "tokenizer_processor":
            cfg = step.get("config", {})
            return TokenizerSettings(name=str(cfg.get("tokenizer_name") or default_name),
                                     max_length=int(cfg.get("max_length", 48)),
                                     padding=str(cfg.get("padding", "longest")))
    raise InvalidArgument(f"{ckpt.path}/{PREPROCESSOR} has no 'tokenizer_processor' step")


def hub_cache_file(repo_id: str, filename: str) -> Path | None:
    """``filename`` of model ``repo_id`` in the local hub cache (the ``main`` snapshot, else the only one)."""
    if "/" not in repo_id or repo_id.startswith(("/", ".", "~")):
        return None
    roots = [os.environ.get("HF_HUB_CACHE"), os.environ.get("HF_HOME") and str(Path(os.environ["HF_HOME"]) / "hub"),
             str(Path.home() / ".cache" / "huggingface" / "hub")]
    for root in filter(None, roots):
        repo = Path(root) / ("models--" + repo_id.replace("/", "--"))
        ref = repo / "refs" / "main"
        snapshots = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
        if ref.is_file():
            snapshots = [repo / "snapshots" / ref.read_text().strip()]
        if len(snapshots) == 1 and (snapshots[0] / filename).is_file():
            return snapshots[0] / filename
    return None


def tokenizer_file(ckpt: LeRobotCheckpoint, settings: TokenizerSettings) -> Path | None:
    """``tokenizer.json`` in the checkpoint, else in the local tokenizer directory, else in the hub cache."""
    for candidate in (ckpt.path / TOKENIZER_JSON, Path(settings.name).expanduser() / TOKENIZER_JSON):
        if candidate.is_file():
            return candidate
    return hub_cache_file(settings.name, TOKENIZER_JSON)
