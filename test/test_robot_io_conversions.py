"""Sensor data -> policy tensors, the freshness rule and command shaping (no ROS)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_ros.models.policies import ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig
from flashrt_ros.robot_io.commands import command_values, trajectory_points
from flashrt_ros.robot_io.freshness import LatestInputs
from flashrt_ros.robot_io.images import decode, image_feature, to_policy_image
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
    with pytest.raises(InvalidArgument, match="encoding 'rgba8'"):
        decode(b"\0" * 16, 2, 2, 8, "rgba8")
    with pytest.raises(InvalidArgument, match="needs"):
        decode(b"\0" * 5, 2, 2, 6, "rgb8")


def test_same_size_image_is_exact_and_in_unit_range():
    pixels = _rgb(4, 6)
    out = to_policy_image(pixels, (3, 4, 6))
    assert out.dtype == torch.float32 and out.shape == (3, 4, 6)
    assert torch.equal(out, torch.from_numpy(pixels).permute(2, 0, 1).float() / 255.0)


def test_wider_image_is_centre_cropped_without_resampling():
    pixels = _rgb(4, 8)                       # covers (4, 4) at scale 1: crop columns 2..5
    out = to_policy_image(pixels, (3, 4, 4))
    assert torch.equal(out, torch.from_numpy(pixels[:, 2:6]).permute(2, 0, 1).float() / 255.0)


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
