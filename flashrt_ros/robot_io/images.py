"""Camera frames -> the policy's image tensors: decode, channel order, resize, crop.

Why here and not in the ROS layer: the conversion is tensor math and must be
testable (and reusable by a non-ROS caller) on its own. The result follows the
LeRobot convention: float32 ``(3, H, W)`` in [0, 1], RGB order; the policy
normalises. Resizing keeps the aspect ratio: the frame is scaled (bilinear) so
that it covers the target, then the centre is cropped (odd margins: the extra
pixel is cut at the bottom / right).

Raw encodings are the ``sensor_msgs/image_encodings`` names that camera drivers
publish: rgb8, bgr8, rgba8, bgra8 (alpha dropped), mono8, mono16 (scaled to 8
bits: value / 257), and packed YUV 4:2:2 (``yuv422_yuy2`` / ``yuyv``: Y0 U Y1 V;
``uyvy`` / ``yuv422``: U Y0 V Y1) converted with BT.601 limited-range
coefficients, as v4l2 webcams deliver. Compressed frames
(``sensor_msgs/CompressedImage``, JPEG or PNG) are decoded with Pillow.
"""
from __future__ import annotations

import io

import numpy as np
import torch

from flashrt_ros.runtime.errors import InvalidArgument

#: encoding -> bytes per pixel
BYTES_PER_PIXEL = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "mono16": 2,
                   "yuv422_yuy2": 2, "yuyv": 2, "uyvy": 2, "yuv422": 2}
ENCODINGS = tuple(BYTES_PER_PIXEL)
#: packed 4:2:2 encoding -> byte offsets of (Y0, U, Y1, V) in each 4-byte pixel pair
_YUV422_ORDER = {"yuv422_yuy2": (0, 1, 2, 3), "yuyv": (0, 1, 2, 3),
                 "uyvy": (1, 0, 3, 2), "yuv422": (1, 0, 3, 2)}
COMPRESSED_FORMATS = ("jpeg", "png")


def encoding_problem(encoding: str) -> str | None:
    """Why a raw ``sensor_msgs/Image`` encoding cannot be used, or None (cheap: checked per message)."""
    if encoding in BYTES_PER_PIXEL:
        return None
    return f"image encoding {encoding!r} is not supported; use one of {', '.join(ENCODINGS)}"


def image_problem(height: int, width: int, step: int, encoding: str, nbytes: int) -> str | None:
    """Why a raw ``sensor_msgs/Image`` cannot be decoded, or None: its encoding, size, step and data length,
    checked at receipt (cheap: no pixel is read), each with its own cause."""
    problem = encoding_problem(encoding)
    if problem:
        return problem
    if height <= 0 or width <= 0:
        return f"image has no pixels ({width}x{height})"
    if encoding in _YUV422_ORDER and width % 2:
        return f"{encoding} packs two pixels in 4 bytes and needs an even width (got {width})"
    row = width * BYTES_PER_PIXEL[encoding]
    step = step or row
    if step < row:
        return (f"{encoding} image {width}x{height}: step {step} is shorter than one row of pixels "
                f"({width} x {BYTES_PER_PIXEL[encoding]} = {row} bytes)")
    needed = step * (height - 1) + row
    if nbytes < needed:
        return f"{encoding} image {width}x{height} with step {step} needs {needed} bytes of data, got {nbytes}"
    return None


def compressed_format_problem(fmt: str) -> str | None:
    """Why a ``CompressedImage.format`` cannot be used, or None.

    image_transport writes e.g. ``"jpeg"``, ``"png"`` or ``"bgr8; jpeg compressed bgr8"``;
    ``compressedDepth`` carries a private header and is refused.
    """
    lowered = fmt.lower()
    if "compresseddepth" in lowered:
        return (f"compressed image format {fmt!r} (compressedDepth) is not supported; "
                "publish the depth image raw (mono16) or as plain png")
    if not lowered or any(name in lowered for name in COMPRESSED_FORMATS):
        return None                # an empty format: let the decoder tell from the bytes
    return f"compressed image format {fmt!r} is not supported; use jpeg or png"


def decode(data: bytes | bytearray | memoryview | np.ndarray, height: int, width: int, step: int,
           encoding: str, bigendian: bool = False) -> np.ndarray:
    """A ``sensor_msgs/Image`` payload as a ``(height, width, 3)`` uint8 RGB array."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    problem = image_problem(height, width, step, encoding, buf.size)
    if problem:
        raise InvalidArgument(problem)
    row = width * BYTES_PER_PIXEL[encoding]
    step = step or row
    if buf.size < step * height:          # a last row without padding is legal
        buf = np.concatenate([buf, np.zeros(step * height - buf.size, np.uint8)])
    rows = buf[: step * height].reshape(height, step)[:, :row]
    if encoding in _YUV422_ORDER:
        return _yuv422_to_rgb(rows.reshape(height, width // 2, 4), _YUV422_ORDER[encoding])
    if encoding == "mono16":
        values = rows.copy().view(">u2" if bigendian else "<u2").astype(np.uint32)
        return np.repeat(((values + 128) // 257).astype(np.uint8)[:, :, None], 3, axis=2)
    pixels = rows.reshape(height, width, BYTES_PER_PIXEL[encoding])
    if encoding in ("bgr8", "bgra8"):
        pixels = pixels[:, :, 2::-1]
    elif encoding == "rgba8":
        pixels = pixels[:, :, :3]
    elif encoding == "mono8":
        pixels = np.repeat(pixels, 3, axis=2)
    return pixels


def _yuv422_to_rgb(pairs: np.ndarray, order: tuple[int, int, int, int]) -> np.ndarray:
    """``(h, w/2, 4)`` packed pixel pairs -> ``(h, w, 3)`` uint8 RGB (BT.601, limited range)."""
    y0, u, y1, v = (pairs[:, :, i].astype(np.float32) for i in order)
    y = (np.stack([y0, y1], axis=2).reshape(pairs.shape[0], -1) - 16.0) * 1.164
    u = np.repeat(u - 128.0, 2, axis=1)
    v = np.repeat(v - 128.0, 2, axis=1)
    rgb = np.stack([y + 1.596 * v, y - 0.392 * u - 0.813 * v, y + 2.017 * u], axis=2)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def decode_compressed(data: bytes | bytearray | memoryview, fmt: str = "") -> np.ndarray:
    """A ``sensor_msgs/CompressedImage`` payload (JPEG or PNG) as ``(h, w, 3)`` uint8 RGB."""
    problem = compressed_format_problem(fmt)
    if problem:
        raise InvalidArgument(problem)
    from PIL import Image as PILImage, UnidentifiedImageError
    try:
        with PILImage.open(io.BytesIO(bytes(data))) as img:
            if img.format not in ("JPEG", "PNG"):
                raise InvalidArgument(f"compressed image is {img.format}, not JPEG or PNG")
            img.load()
            if img.mode.startswith("I;16") or img.mode == "I":      # 16-bit PNG: scale like mono16
                values = np.asarray(img, dtype=np.uint32)
                return np.repeat(((values + 128) // 257).clip(0, 255).astype(np.uint8)[:, :, None],
                                 3, axis=2)
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidArgument(f"compressed image ({fmt or 'no format'}) could not be decoded: "
                              f"{exc}") from None


def to_policy_image(pixels: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """``(h, w, 3)`` uint8 RGB -> float32 ``shape == (3, H, W)`` in [0, 1] (resize to cover, centre crop).

    The resize runs on the uint8 frame in Pillow (bilinear with a support scaled to the
    reduction, i.e. antialiased when shrinking: the filter torch's ``antialias=True`` follows),
    single-threaded, like the conversion to float (numpy). Why not torch: its interpolation
    and element-wise ops use the intra-op thread pool, and on a
    loaded 2-core machine one 320x240 frame then took 30-70 ms instead of ~1 ms, more than a
    control period for two cameras. The result differs from a float resize by at most one
    grey level (the uint8 rounding).
    """
    if len(shape) != 3 or shape[0] != 3:
        raise InvalidArgument(f"image features must be shaped (3, H, W), got {tuple(shape)}")
    _, out_h, out_w = shape
    h, w = pixels.shape[:2]
    if (h, w) != (out_h, out_w):
        scale = max(out_h / h, out_w / w)
        new_h, new_w = max(out_h, round(h * scale)), max(out_w, round(w * scale))
        if (new_h, new_w) != (h, w):
            from PIL import Image as PILImage
            resized = PILImage.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).resize(
                (new_w, new_h), PILImage.Resampling.BILINEAR)
            pixels = np.asarray(resized)
        top, left = (new_h - out_h) // 2, (new_w - out_w) // 2
        pixels = pixels[top:top + out_h, left:left + out_w]
    # numpy, not torch: a (3, 96, 128) tensor op is already large enough for torch's thread pool
    chw = np.ascontiguousarray(np.asarray(pixels, dtype=np.uint8).transpose(2, 0, 1))
    return torch.from_numpy(np.divide(chw, np.float32(255.0), dtype=np.float32))


def image_feature(data: bytes | bytearray | memoryview | np.ndarray, height: int, width: int,
                  step: int, encoding: str, shape: tuple[int, ...], bigendian: bool = False) -> torch.Tensor:
    """One ``sensor_msgs/Image``'s fields -> the policy's image tensor of ``shape``."""
    return to_policy_image(decode(data, height, width, step, encoding, bigendian), shape)


def compressed_image_feature(data: bytes | bytearray | memoryview, fmt: str,
                             shape: tuple[int, ...]) -> torch.Tensor:
    """One ``sensor_msgs/CompressedImage``'s fields -> the policy's image tensor of ``shape``."""
    return to_policy_image(decode_compressed(data, fmt), shape)
