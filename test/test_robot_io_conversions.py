"""Sensor data -> policy tensors, the freshness rule and command shaping (no ROS)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_ros.models.reference_policies import ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig
from flashrt_ros.robot_io.commands import command_values, trajectory_points
from flashrt_ros.robot_io.freshness import LatestInputs
from flashrt_ros.robot_io.images import (compressed_format_problem, compressed_image_feature, decode,
                                         decode_compressed, encoding_problem, image_feature,
                                         to_policy_image)
from flashrt_ros.robot_io.joints import JointSelector
from flashrt_ros.runtime.arena import StateArena, core_meta_specs
from flashrt_ros.runtime.errors import InvalidArgument


def _rgb(h: int, w: int) -> np.ndarray:
    return (np.arange(h * w * 3, dtype=np.int64) % 251).astype(np.uint8).reshape(h, w, 3)


def test_rgb8_with_row_padding_decodes_to_the_pixels():
    pixels = _rgb(3, 5)
    padded = np.zeros((3, 5 * 3 + 4), np.uint8)
    padded[:, :15] = pixels.reshape(3, 15)
    out = decode(padded.tobytes(), 3, 5, 19, "rgb8")
    assert np.array_equal(out, pixels)


def test_bgr8_and_mono8_become_rgb():
    pixels = _rgb(2, 2)
    assert np.array_equal(decode(pixels[:, :, ::-1].copy().tobytes(), 2, 2, 6, "bgr8"), pixels)
    mono = np.array([[0, 128], [255, 7]], np.uint8)
    out = decode(mono.tobytes(), 2, 2, 2, "mono8")
    assert out.shape == (2, 2, 3) and np.array_equal(out[:, :, 1], mono) and np.array_equal(out[:, :, 2], mono)


def test_bad_images_are_refused_with_the_reason():
    with pytest.raises(InvalidArgument, match="encoding 'bayer_rggb8' is not supported; use one of"):
        decode(b"\0" * 16, 2, 2, 8, "bayer_rggb8")
    with pytest.raises(InvalidArgument, match="needs"):
        decode(b"\0" * 5, 2, 2, 6, "rgb8")


def test_rgba8_and_bgra8_drop_alpha_and_become_rgb():
    pixels = _rgb(3, 4)
    alpha = np.full((3, 4, 1), 77, np.uint8)
    rgba = np.concatenate([pixels, alpha], axis=2)
    bgra = np.concatenate([pixels[:, :, ::-1], alpha], axis=2)
    padded = np.zeros((3, 4 * 4 + 3), np.uint8)            # rows padded to a step of 19 bytes
    padded[:, :16] = rgba.reshape(3, 16)
    assert np.array_equal(decode(padded.tobytes(), 3, 4, 19, "rgba8"), pixels)
    assert np.array_equal(decode(bgra.tobytes(), 3, 4, 16, "bgra8"), pixels)


def _bt601(y: float, u: float, v: float) -> tuple[int, int, int]:
    """One pixel by the BT.601 limited-range formulas (the reference for the packed decoders)."""
    c, d, e = 1.164 * (y - 16), u - 128, v - 128
    return tuple(int(np.clip(round(x), 0, 255)) for x in (c + 1.596 * e, c - 0.392 * d - 0.813 * e,
                                                            c + 2.017 * d))


@pytest.mark.parametrize("encoding", ["yuv422_yuy2", "yuyv", "uyvy", "yuv422"])
def test_packed_yuv422_decodes_with_bt601(encoding):
    # two pixel pairs per row, two rows: (Y0, U, Y1, V) per pair
    pairs = [(16, 128, 235, 128), (81, 90, 145, 240), (41, 240, 170, 110), (210, 16, 60, 146)]
    packed = []
    for y0, u, y1, v in pairs:
        packed += [y0, u, y1, v] if encoding in ("yuv422_yuy2", "yuyv") else [u, y0, v, y1]
    out = decode(bytes(packed), 2, 4, 8, encoding)
    expected = [[_bt601(y0, u, v), _bt601(y1, u, v)] for y0, u, y1, v in pairs]
    expected = np.array(expected, np.uint8).reshape(2, 4, 3)
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1
    assert out[0, 0].tolist() == [0, 0, 0] and out[0, 1].tolist() == [255, 255, 255]   # black, white
    with pytest.raises(InvalidArgument, match="even width"):
        decode(bytes(6), 1, 3, 6, encoding)


@pytest.mark.parametrize("bigendian", [False, True])
def test_mono16_is_scaled_to_8_bits(bigendian):
    values = np.array([[0, 257, 65535], [128, 32896, 1000]], np.uint16)
    data = values.astype(">u2" if bigendian else "<u2").tobytes()
    out = decode(data, 2, 3, 6, "mono16", bigendian=bigendian)
    assert out.shape == (2, 3, 3)
    assert out[:, :, 0].tolist() == [[0, 1, 255], [0, 128, 4]]
    assert np.array_equal(out[:, :, 0], out[:, :, 2])


def _encoded(pixels: np.ndarray, fmt: str, mode: str = "RGB") -> bytes:
    import io
    from PIL import Image as PILImage
    buf = io.BytesIO()
    PILImage.fromarray(pixels, mode=None).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


def test_compressed_png_decodes_exactly_and_jpeg_closely():
    pixels = _rgb(6, 10)
    assert np.array_equal(decode_compressed(_encoded(pixels, "PNG"), "bgr8; png compressed bgr8"), pixels)
    smooth = np.zeros((16, 16, 3), np.uint8)
    smooth[:, :, 0], smooth[:, :, 2] = 200, 40                        # a flat colour survives JPEG
    out = decode_compressed(_encoded(smooth, "JPEG"), "jpeg")
    assert out.shape == (16, 16, 3) and np.abs(out.astype(int) - smooth.astype(int)).max() <= 3
    feature = compressed_image_feature(_encoded(smooth, "JPEG"), "rgb8; jpeg compressed bgr8", (3, 8, 8))
    assert feature.shape == (3, 8, 8) and abs(float(feature[0].mean()) - 200 / 255) < 0.02


def test_compressed_16_bit_png_is_scaled_like_mono16():
    import io
    from PIL import Image as PILImage
    depth = np.array([[0, 257, 65535, 32896]], np.uint16)
    buf = io.BytesIO()
    PILImage.fromarray(depth).save(buf, format="PNG")
    out = decode_compressed(buf.getvalue(), "16UC1; png compressed")
    assert out[:, :, 0].tolist() == [[0, 1, 255, 128]]


def test_unsupported_compressed_images_are_refused_with_the_reason():
    assert compressed_format_problem("jpeg") is None and compressed_format_problem("") is None
    assert "compressedDepth" in compressed_format_problem("16UC1; compressedDepth png")
    assert "use jpeg or png" in compressed_format_problem("theora")
    assert encoding_problem("rgba8") is None and "bayer" in encoding_problem("bayer_rggb8")
    with pytest.raises(InvalidArgument, match="could not be decoded"):
        decode_compressed(b"not an image", "jpeg")
    with pytest.raises(InvalidArgument, match="not JPEG or PNG"):
        decode_compressed(_encoded(_rgb(4, 4), "BMP"), "")


def test_same_size_image_is_exact_and_in_unit_range():
    pixels = _rgb(4, 6)
    out = to_policy_image(pixels, (3, 4, 6))
    assert out.dtype == torch.float32 and out.shape == (3, 4, 6)
    assert torch.equal(out, torch.from_numpy(pixels).permute(2, 0, 1).float() / 255.0)


def test_wider_image_is_centre_cropped_without_resampling():
    pixels = _rgb(4, 8)                       # covers (4, 4) at scale 1: crop columns 2..5
    out = to_policy_image(pixels, (3, 4, 4))
    assert torch.equal(out, torch.from_numpy(pixels[:, 2:6]).permute(2, 0, 1).float() / 255.0)


def test_resize_matches_an_antialiased_float_resize_within_one_grey_level():
    import torch.nn.functional as F
    pixels = (np.random.default_rng(0).integers(0, 256, (60, 80, 3))).astype(np.uint8)
    for shape in ((3, 24, 24), (3, 30, 40), (3, 90, 120)):             # shrink + crop, shrink, enlarge
        out = to_policy_image(pixels, shape)
        h, w = shape[1:]
        scale = max(h / 60, w / 80)
        new_h, new_w = max(h, round(60 * scale)), max(w, round(80 * scale))
        ref = F.interpolate(torch.from_numpy(pixels).permute(2, 0, 1).float()[None] / 255, size=(new_h, new_w),
                            mode="bilinear", align_corners=False, antialias=scale < 1)[0]
        top, left = (new_h - h) // 2, (new_w - w) // 2
        ref = ref[:, top:top + h, left:left + w]
        assert out.shape == shape and (out - ref).abs().max() <= 1.5 / 255, shape


def test_larger_image_is_resized_to_cover_then_cropped():
    pixels = np.full((48, 64, 3), (10, 200, 30), np.uint8)
    out = image_feature(pixels.tobytes(), 48, 64, 64 * 3, "rgb8", (3, 24, 24))
    assert out.shape == (3, 24, 24)
    assert torch.allclose(out[:, 5, 5], torch.tensor([10, 200, 30]) / 255.0, atol=1e-6)


def test_joint_selector_orders_by_name_and_names_missing_joints():
    sel = JointSelector(["elbow", "shoulder"], ["position", "velocity"])
    out = sel.select(["shoulder", "gripper", "elbow"], {"position": [1.0, 9.0, 2.0],
                                                        "velocity": [0.1, 9.0, 0.2]})
    assert out.tolist() == pytest.approx([2.0, 1.0, 0.2, 0.1])
    with pytest.raises(InvalidArgument, match=r"lacks joint\(s\) \['elbow'\]"):
        sel.select(["shoulder"], {"position": [1.0], "velocity": [0.0]})
    with pytest.raises(InvalidArgument, match="0 velocity values"):
        sel.select(["shoulder", "elbow"], {"position": [1.0, 2.0], "velocity": []})


def test_latest_inputs_step_only_on_fresh_samples_of_every_input():
    inputs = LatestInputs(["a", "b"], max_age_s=0.1)
    assert not inputs.take(0.0).ok                        # nothing yet
    inputs.put("a", 1, received_s=0.0)
    take = inputs.take(0.01)
    assert not take.ok and take.stale == ["b"]
    inputs.put("b", 2, received_s=0.02)
    assert inputs.take(0.05).values == {"a": 1, "b": 2}
    take = inputs.take(0.115)                             # a is 0.115 s old, b 0.095 s
    assert not take.ok and take.stale == ["a"] and "max_observation_age_s" in take.reason
    inputs.put("a", 3, received_s=0.116)
    assert inputs.take(0.125).stale == ["b"]              # b (0.105 s old) is stale now
    inputs.put("b", 4, received_s=0.13)
    assert inputs.take(0.135).values == {"a": 3, "b": 4}  # fresh data: steps again


def test_require_new_steps_once_per_sample_and_check_does_not_consume():
    inputs = LatestInputs(["a"], max_age_s=1.0)
    inputs.put("a", 1, received_s=0.0)
    assert inputs.take(0.1, consume=False).ok and inputs.has_new()
    assert inputs.take(0.1, require_new=True).ok
    assert not inputs.has_new()
    take = inputs.take(0.2, require_new=True)
    assert not take.ok and take.stale == [] and "waiting" in take.reason
    assert inputs.take(0.2).ok                            # timer mode reuses the latest sample


def test_inputs_out_of_sync_are_not_stepped():
    inputs = LatestInputs(["cam", "joints"], max_age_s=1.0, sync_tolerance_s=0.01)
    inputs.put("cam", "c", received_s=0.0, stamp_s=10.00)
    inputs.put("joints", "j", received_s=0.0, stamp_s=10.05)
    take = inputs.take(0.01)
    assert not take.ok and "out of sync" in take.reason
    inputs.put("cam", "c2", received_s=0.01, stamp_s=10.045)
    assert inputs.take(0.02).values == {"cam": "c2", "joints": "j"}


def test_commands_and_trajectory_points():
    assert command_values(torch.tensor([0.5, -1.0]), 2) == [0.5, -1.0]
    with pytest.raises(InvalidArgument, match="3 command joints"):
        command_values(torch.tensor([0.5, -1.0]), 3)
    points = trajectory_points(torch.tensor([1.0, 2.0]), torch.tensor([[3.0, 4.0], [5.0, 6.0]]), 0.02)
    assert points == [([1.0, 2.0], 0.02), ([3.0, 4.0], 0.04), ([5.0, 6.0], pytest.approx(0.06))]


def test_chunked_policy_exposes_the_rest_of_its_newest_chunk():
    cfg = ChunkedTransformerPolicyConfig()
    policy = ChunkedTransformerPolicy(cfg)
    arena = StateArena(policy.state_specs() + core_meta_specs(), torch.device("cpu"))
    policy.init_state(arena)
    assert policy.planned_actions(arena).shape == (0, cfg.act_dim)
    with torch.no_grad():
        for i in range(3):                                # chunks at t=0 and t=2; last step t=2
            policy.step(torch.full((cfg.obs_dim,), 0.1 * i), arena)
        plan = policy.planned_actions(arena)
    assert plan.shape == (cfg.chunk - 1, cfg.act_dim)
    slot = (int(arena[policy.QUEUE_INDEX]) - 1) % cfg.chunk_slots
    assert torch.equal(plan, arena[policy.QUEUE][slot, 1:])
