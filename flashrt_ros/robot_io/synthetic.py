"""Synthetic sensor data: camera frames and joint values a policy node accepts, without a robot.

Why: before a robot is wired up, a user wants to see the node step on inputs of
exactly the shapes the checkpoint expects (``flashrt fake-sensors``). Frames are
a moving colour pattern (so consecutive frames differ, as a camera's do), made
once as a short cycle and then only looked up, so a publisher at 30 Hz costs
next to nothing; joint values are slow sine waves. No ROS here: the CLI puts
these bytes into messages.
"""
from __future__ import annotations

import io
import math

import numpy as np

from flashrt_ros.robot_io.images import BYTES_PER_PIXEL

#: frames in one cycle of the pattern (it repeats after this many)
CYCLE = 16


def frame_cycle(height: int, width: int, encoding: str = "rgb8", frames: int = CYCLE) -> list[bytes]:
    """``frames`` raw ``sensor_msgs/Image`` payloads (``step = width * bytes per pixel``).

    Any supported encoding; an unsupported one (e.g. ``32FC1``, to see how the node
    refuses it) gets 4 bytes a pixel of zeros, the size a float image would have."""
    out = []
    for i in range(frames):
        rgb = _pattern(height, width, i / frames)
        out.append(_encode(rgb, encoding))
    return out


def compressed_cycle(height: int, width: int, fmt: str = "jpeg", frames: int = CYCLE) -> list[bytes]:
    """``frames`` JPEG (or PNG) payloads of the same pattern, for ``sensor_msgs/CompressedImage``."""
    from PIL import Image as PILImage
    out = []
    for i in range(frames):
        buf = io.BytesIO()
        PILImage.fromarray(_pattern(height, width, i / frames)).save(buf, format="PNG" if fmt == "png" else "JPEG")
        out.append(buf.getvalue())
    return out


def joint_values(count: int, t: float) -> list[float]:
    """``count`` joint positions at time ``t`` (s): sine waves of 0.3 rad, each joint its own phase."""
    return [0.3 * math.sin(0.5 * t + 0.7 * j) for j in range(count)]


def joint_velocities(count: int, t: float) -> list[float]:
    """The derivative of ``joint_values``."""
    return [0.15 * math.cos(0.5 * t + 0.7 * j) for j in range(count)]


def _pattern(height: int, width: int, phase: float) -> np.ndarray:
    """``(height, width, 3)`` uint8: a diagonal colour gradient shifted by ``phase`` of a period."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = (x / max(width, 1) + y / max(height, 1)) / 2 + phase
    channels = [(np.sin(2 * math.pi * (base + k / 3)) + 1) * 127.5 for k in range(3)]
    return np.stack(channels, axis=2).astype(np.uint8)


def _encode(rgb: np.ndarray, encoding: str) -> bytes:
    if encoding == "rgb8":
        return rgb.tobytes()
    if encoding == "bgr8":
        return rgb[:, :, ::-1].tobytes()
    if encoding in ("rgba8", "bgra8"):
        body = rgb if encoding == "rgba8" else rgb[:, :, ::-1]
        return np.concatenate([body, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2).tobytes()
    grey = rgb.mean(axis=2).astype(np.uint8)
    if encoding == "mono8":
        return grey.tobytes()
    if encoding == "mono16":
        return (grey.astype("<u2") * 257).tobytes()
    if encoding in BYTES_PER_PIXEL:                   # packed YUV 4:2:2: the pattern in grey (U = V = 128)
        neutral = np.full(grey.shape, 128, np.uint8)
        luma_first = encoding in ("yuv422_yuy2", "yuyv")      # Y0 U Y1 V; else U Y0 V Y1
        return np.stack([grey, neutral] if luma_first else [neutral, grey], axis=2).tobytes()
    return bytes(rgb.shape[0] * rgb.shape[1] * 4)     # e.g. 32FC1: refused by the node, by design


def bytes_per_pixel(encoding: str) -> int:
    """The ``step / width`` of ``encoding`` (4 for an encoding the node does not support)."""
    return BYTES_PER_PIXEL.get(encoding, 4)
