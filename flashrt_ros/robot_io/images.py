"""Camera frames -> the policy's image tensors: decode, channel order, resize, crop.

Why here and not in the ROS layer: the conversion is tensor math and must be
testable (and reusable by a non-ROS caller) on its own. The result follows the
LeRobot convention: float32 ``(3, H, W)`` in [0, 1], RGB order; the policy
normalises. Resizing keeps the aspect ratio: the frame is scaled (bilinear) so
that it covers the target, then the centre is cropped (odd margins: the extra
pixel is cut at the bottom / right).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from flashrt_ros.runtime.errors import InvalidArgument

CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1}


def decode(data: bytes | bytearray | memoryview | np.ndarray, height: int, width: int, step: int,
           encoding: str) -> np.ndarray:
    """A ``sensor_msgs/Image`` payload as a ``(height, width, 3)`` uint8 RGB array."""
    if encoding not in CHANNELS:
        raise InvalidArgument(f"image encoding {encoding!r} is not supported; use one of "
                              f"{', '.join(CHANNELS)}")
    channels = CHANNELS[encoding]
    if height <= 0 or width <= 0:
        raise InvalidArgument(f"image has no pixels ({width}x{height})")
    row = width * channels
    step = step or row
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    if step < row or buf.size < step * (height - 1) + row:
        raise InvalidArgument(f"image of {width}x{height} {encoding} needs {step * height} bytes "
                              f"with step {step}, got {buf.size}")
    if buf.size < step * height:          # a last row without padding is legal
        buf = np.concatenate([buf, np.zeros(step * height - buf.size, np.uint8)])
    pixels = buf[: step * height].reshape(height, step)[:, :row].reshape(height, width, channels)
    if encoding == "bgr8":
        pixels = pixels[:, :, ::-1]
    elif encoding == "mono8":
        pixels = np.repeat(pixels, 3, axis=2)
    return pixels


def to_policy_image(pixels: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """``(h, w, 3)`` uint8 RGB -> float32 ``shape == (3, H, W)`` in [0, 1] (resize to cover, centre crop)."""
    if len(shape) != 3 or shape[0] != 3:
        raise InvalidArgument(f"image features must be shaped (3, H, W), got {tuple(shape)}")
    _, out_h, out_w = shape
    img = torch.from_numpy(np.array(pixels, dtype=np.uint8))            # a writable copy
    img = img.permute(2, 0, 1).to(torch.float32) / 255.0
    h, w = img.shape[1:]
    if (h, w) != (out_h, out_w):
        scale = max(out_h / h, out_w / w)
        new_h, new_w = max(out_h, round(h * scale)), max(out_w, round(w * scale))
        if (new_h, new_w) != (h, w):
            img = F.interpolate(img.unsqueeze(0), size=(new_h, new_w), mode="bilinear",
                                align_corners=False, antialias=scale < 1.0).squeeze(0)
        top, left = (new_h - out_h) // 2, (new_w - out_w) // 2
        img = img[:, top:top + out_h, left:left + out_w]
    return img.clamp_(0.0, 1.0).contiguous()


def image_feature(data: bytes | bytearray | memoryview | np.ndarray, height: int, width: int,
                  step: int, encoding: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One ``sensor_msgs/Image``'s fields -> the policy's image tensor of ``shape``."""
    return to_policy_image(decode(data, height, width, step, encoding), shape)
