"""GR00T N1.5's inputs as LeRobot 0.4.4's preprocessor makes them, without transformers, PIL or torchvision.

Why here: the network is bit-identical only on bit-identical inputs, and LeRobot's GR00T preprocessor has
quirks a port must keep (``NOTES.md`` in ``test/groot_reference`` lists them):

* images: cameras in sorted key order; a float frame becomes uint8 by ``(clamp(0, 1) * 255)`` truncated;
  each frame is resized to the Eagle tile (aspect ratio not kept; bicubic with antialias, on the uint8 pixels,
  as torchvision does on the CPU), then mapped to [-1, 1] as ``(p - 127.5) / 127.5``;
* the prompt: the Eagle assets' chat template over one user turn of the images and the text ``str([task])``
  (a Python list's repr: ``"['pick up the cube']"``), with a generation prompt; each ``<image-k>`` then becomes
  ``<image k><img>`` + ``<IMG_CONTEXT>`` x tokens-per-tile + ``</img>``; tokenised by the assets'
  ``tokenizer.json``. An empty task is ``"Perform the task."``;
* the state: min-max to [-1, 1] with the dataset's min and max (0 where they are equal), then zero-padded to
  ``max_state_dim``; the actions come back by the inverse map, ``min`` where ``max == min``;
* the embodiment tag as an id (``EMBODIMENT_IDS``); LeRobot maps an unknown tag to 0 silently, we refuse it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from flashrt_ros.runtime.errors import InvalidArgument

#: LeRobot's ``GrootPackInputsStep.embodiment_mapping`` (GR00T's EMBODIMENT_TAG_MAPPING)
EMBODIMENT_IDS = {"new_embodiment": 31, "oxe_droid": 17, "agibot_genie1": 26, "gr1": 24, "so100": 2, "unitree_g1": 3}
DEFAULT_TASK = "Perform the task."
_PLACEHOLDER = re.compile(r"<(image|video)-(\d+)>")


def embodiment_id(tag: str) -> int:
    if tag not in EMBODIMENT_IDS:
        raise InvalidArgument(f"GR00T embodiment_tag {tag!r} is not one LeRobot maps (it would silently use id 0); "
                              f"known: {', '.join(sorted(EMBODIMENT_IDS))}")
    return EMBODIMENT_IDS[tag]


def to_uint8(frame: Tensor) -> Tensor:
    """A (3, H, W) frame as uint8: float [0, 1] scaled and truncated, as LeRobot's ``_to_uint8_np_bhwc``."""
    return (frame.clamp(0, 1) * 255.0).to(torch.uint8) if frame.is_floating_point() else frame.to(torch.uint8)


def eagle_pixels(frames: list[Tensor], tile: int) -> Tensor:
    """(cameras, 3, tile, tile) float32 in [-1, 1] from (3, H, W) frames already in camera order.

    Device ops only (no host read, no host-to-device copy: a captured plan runs it): transformers' fused rescale
    ``0.5 * (1 / (1 / 255))`` is 127.5 in float32, made on the frames' device; a (3, 1, 1) tensor, not a Python
    scalar, because a division by a scalar may be a product by its reciprocal (other bits)."""
    device = frames[0].device
    mean = torch.full((3, 1, 1), 127.5, dtype=torch.float32, device=device)
    std = torch.full((3, 1, 1), 127.5, dtype=torch.float32, device=device)
    out = []
    for frame in frames:
        image = to_uint8(frame).unsqueeze(0)
        if image.shape[-2:] != (tile, tile):
            image = F.interpolate(image, size=[tile, tile], mode="bicubic", align_corners=False, antialias=True)
        out.append(image.to(torch.float32).sub(mean).div_(std))
    return torch.cat(out)


class EaglePrompt:
    """The Eagle assets' chat template and tokenizer: a task and a camera count to token ids."""

    def __init__(self, assets: Path, tokens_per_tile: int) -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer
        missing = [n for n in ("chat_template.json", "tokenizer.json", "processor_config.json")
                   if not (assets / n).is_file()]
        if missing:
            raise InvalidArgument(f"GR00T's Eagle processor assets at {assets} lack {', '.join(missing)} (LeRobot "
                                  f"fetches them from the hub repo lerobot/eagle2hg-processor-groot-n1p5)")
        processor = json.loads((assets / "processor_config.json").read_text())
        self.image_token = processor.get("image_token", "<IMG_CONTEXT>")
        self.start, self.end = processor.get("image_start_token", "<img>"), processor.get("image_end_token", "</img>")
        self.tokens_per_tile = tokens_per_tile

        def raise_exception(message: str) -> None:
            raise InvalidArgument(f"GR00T's chat template: {message}")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(json.loads((assets / "chat_template.json").read_text())["chat_template"])
        self.tokenizer = Tokenizer.from_file(str(assets / "tokenizer.json"))

    def text(self, task: str, cameras: int) -> str:
        content = [{"type": "image"} for _ in range(cameras)] + [{"type": "text", "text": str([task or DEFAULT_TASK])}]
        text = self.template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True)

        def expand(match: re.Match) -> str:
            k = int(match.group(2))
            return f"<image {k}>{self.start}{self.image_token * self.tokens_per_tile}{self.end}"
        return _PLACEHOLDER.sub(expand, text)

    def ids(self, task: str, cameras: int) -> Tensor:
        """(1, T) token ids of the prompt (one prompt: no padding)."""
        return torch.tensor([self.tokenizer.encode(self.text(task, cameras)).ids], dtype=torch.long)


def normalize_state(state: Tensor, low: Tensor, high: Tensor, max_state_dim: int) -> Tensor:
    """(1, 1, max_state_dim): ``2 (x - min) / (max - min) - 1``, 0 where max == min, zero-padded."""
    x = state.flatten().to(torch.float32)
    denom = high - low
    mask = denom != 0
    mapped = 2 * (x - low) / torch.where(mask, denom, torch.ones_like(denom)) - 1
    mapped = torch.where(mask, mapped, torch.zeros_like(mapped))
    return torch.cat([mapped, mapped.new_zeros(max_state_dim - mapped.numel())]).view(1, 1, -1)


def unnormalize_action(action: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """The robot's action from the model's first ``len(low)`` dims: ``(y + 1) * 0.5 * (max - min) + min``."""
    y = action[..., :low.numel()]
    denom = high - low
    mask = denom != 0
    out = (y + 1.0) * 0.5 * torch.where(mask, denom, torch.ones_like(denom)) + low
    return torch.where(mask, out, low.expand_as(out))
