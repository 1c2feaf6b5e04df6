"""GR00T N1.5 (network, pre- and postprocessing), ours against LeRobot 0.4.4's whole policy (``groot_reference``), bit for bit on the CPU.

The reference builds a tiny seeded GR00T with LeRobot's classes (SDPA where the Eagle config asks for
flash-attn, as transformers runs it without flash-attn), saves its checkpoint and records, at every replan of
an episode, the processor's outputs (token ids, pixel values, padded state, embodiment id), the backbone's
features, the noise it drew and the chunk it predicted. Our Eagle backbone and action head, at the sizes
``read_groot_config`` reads from the checkpoint (checked against sizes built by hand from ``TINY``), load the
checkpoint's ``model.safetensors`` strictly (LeRobot's names, less the two heads GR00T never reads) and must
give those features and chunks exactly. The processor and the policy around them come next (issue #58).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flashrt_ros.models.lerobot.groot.action_head import DiTSizes, FlowmatchingActionHead, HeadSizes
from flashrt_ros.models.lerobot.groot.eagle import (UNUSED_KEY_PARTS, EagleBackbone, EagleSizes, Qwen3Sizes,
                                                   backbone_weights)
from flashrt_ros.models.lerobot.groot.configuration_groot import read_groot_config
from flashrt_ros.models.lerobot.siglip import SiglipSizes

PREFIX = "_groot_model."


def _sizes(t: dict, vocab: int, image_token: int) -> tuple[EagleSizes, HeadSizes]:
    v, x, dit, vl = t["vision"], t["text"], t["dit"], t["vl_self_attention"]
    eagle = EagleSizes(
        vision=SiglipSizes(hidden=v["hidden_size"], intermediate=v["intermediate_size"], layers=v["num_hidden_layers"],
                           heads=v["num_attention_heads"], patch_size=t["patch_size"], eps=1e-6),
        image_size=t["image_size"], vision_select_layer=v["num_hidden_layers"],
        text=Qwen3Sizes(width=x["hidden_size"], layers=t["select_layer"], heads=x["num_attention_heads"],
                        kv_heads=x["num_key_value_heads"], head_dim=x["head_dim"], intermediate=x["intermediate_size"],
                        vocab=vocab, rope_theta=1e6, eps=1e-6),
        image_token_id=image_token)
    width = dit["num_attention_heads"] * dit["attention_head_dim"]
    head = HeadSizes(
        action_dim=t["max_action_dim"], action_horizon=t["action_horizon"], max_state_dim=t["max_state_dim"],
        hidden_size=dit["output_dim"], input_embedding_dim=width, backbone_embedding_dim=x["hidden_size"],
        num_target_vision_tokens=t["num_target_vision_tokens"], max_seq_len=t["max_seq_len"],
        num_inference_timesteps=t["num_inference_timesteps"],
        dit=DiTSizes(heads=dit["num_attention_heads"], head_dim=dit["attention_head_dim"], layers=dit["num_layers"],
                     cross_attention_dim=x["hidden_size"], output_dim=dit["output_dim"]),
        vl_self_attention=DiTSizes(heads=vl["num_attention_heads"], head_dim=vl["attention_head_dim"],
                                   layers=vl["num_layers"], cross_attention_dim=None,
                                   interleave_self_attention=False, output_dim=0))
    return eagle, head


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
    from groot_reference import Case, reference_record, run_reference
    root = tmp_path_factory.mktemp("groot_net")
    case = Case(directory=str(root / "a"), attn="sdpa", n_action_steps=8, steps=17)
    run_reference([case], root / "spec")
    config = read_groot_config(case.directory)
    weights = load_file(str(Path(case.directory) / "model.safetensors"))
    backbone = EagleBackbone(config.eagle_sizes(), project_to_dim=config.project_to_dim).eval()
    backbone.load_state_dict(backbone_weights(weights, PREFIX + "backbone."), strict=True)
    head = FlowmatchingActionHead(config.head_sizes()).eval()
    head.load_state_dict({k[len(PREFIX + "action_head."):]: v for k, v in weights.items()
                          if k.startswith(PREFIX + "action_head.")}, strict=True)
    unread = sorted({k.split(".")[1] for k in weights if not k.startswith((PREFIX + "backbone.", PREFIX + "action_head."))})
    return case, reference_record(case), backbone, head, weights, unread


def test_the_sizes_read_from_the_checkpoint_are_the_hand_built_ones(episode):
    """``read_groot_config`` (weights' shapes, the Eagle assets' and the base model's configs) gives the sizes
    built by hand from the reference's ``TINY`` dict."""
    import json

    from groot_reference import TINY
    case, _rec, backbone, head, _w, _u = episode
    sizes = json.loads((Path(case.directory) / "groot_sizes.json").read_text())
    eagle_sizes, head_sizes = _sizes(TINY, sizes["vocab_size"], sizes["image_token_index"])
    assert backbone.eagle_model.sizes == eagle_sizes
    assert head.sizes == head_sizes


def test_every_weight_is_read_but_the_two_heads_gr00t_never_uses(episode):
    _case, _rec, _backbone, _head, weights, unread = episode
    assert unread == []
    skipped = sorted({k for k in weights if any(part in "." + k for part in UNUSED_KEY_PARTS)})
    assert skipped and all(".head." in k or ".lm_head." in k for k in skipped), skipped


def test_the_backbone_features_are_lerobots_at_every_replan(episode):
    _case, rec, backbone, _head, _w, _u = episode
    assert len(rec["plan_steps"]) >= 3                      # replans at 0, 8, 16 with n_action_steps 8
    for p in range(len(rec["plan_steps"])):
        with torch.no_grad():
            got = backbone(rec["eagle_input_ids"][p], rec["eagle_pixel_values"][p])
        assert torch.equal(got, rec["backbone_features"][p]), (p, (got - rec["backbone_features"][p]).abs().max())


def test_the_chunk_is_lerobots_from_its_features_state_and_noise(episode):
    _case, rec, _backbone, head, _w, _u = episode
    for p in range(len(rec["plan_steps"])):
        with torch.no_grad():
            got = head.sample(rec["backbone_features"][p], rec["state"][p], rec["embodiment_id"][p], rec["noise"][p])
        assert torch.equal(got, rec["action_pred"][p]), (p, (got - rec["action_pred"][p]).abs().max())


def test_the_whole_network_from_tokens_and_pixels_to_the_chunk(episode):
    """The two halves chained; and the check has teeth: one patch of one camera blacked out changes the chunk."""
    _case, rec, backbone, head, _w, _u = episode
    ids, pixels = rec["eagle_input_ids"][1], rec["eagle_pixel_values"][1]
    with torch.no_grad():
        chunk = head.sample(backbone(ids, pixels), rec["state"][1], rec["embodiment_id"][1], rec["noise"][1])
        assert torch.equal(chunk, rec["action_pred"][1])
        pixels_damaged = pixels.clone()
        pixels_damaged[0, :, :14, :14] = 0                  # one patch of one camera
        other = head.sample(backbone(ids, pixels_damaged), rec["state"][1], rec["embodiment_id"][1], rec["noise"][1])
    assert (other - chunk).abs().max() > 1e-6


# --- the preprocessor and postprocessor ------------------------------------------------------------------------------
def _step_inputs(case, inputs, step: int):
    frames = [inputs[f"observation.images.cam{i}"][step] for i in range(case.cameras)]
    return frames, inputs["observation.state"][step]


@pytest.fixture(scope="module")
def prompt(episode):
    from flashrt_ros.models.lerobot.groot.processor_groot import EaglePrompt
    case, _rec, backbone, _head, _w, _u = episode
    return EaglePrompt(Path(case.directory) / "eagle2hg-processor-groot-n1p5", backbone.eagle_model.sizes.tokens_per_image)


def test_pixels_prompt_ids_and_state_are_the_preprocessors(episode, prompt):
    from groot_reference import reference_inputs

    from flashrt_ros.models.lerobot.groot.processor_groot import eagle_pixels, embodiment_id, normalize_state
    case, rec, backbone, head, _w, _u = episode
    inputs = reference_inputs(case)
    for p, step in enumerate(rec["plan_steps"].tolist()):
        frames, state = _step_inputs(case, inputs, step)
        pixels = eagle_pixels(frames, backbone.eagle_model.sizes.image_size)
        assert torch.equal(pixels, rec["eagle_pixel_values"][p]), (p, (pixels - rec["eagle_pixel_values"][p]).abs().max())
        assert torch.equal(prompt.ids(case.task, case.cameras), rec["eagle_input_ids"][p])
        padded = normalize_state(state, inputs["stats.observation.state.min"], inputs["stats.observation.state.max"],
                                 head.sizes.max_state_dim)
        assert torch.equal(padded, rec["state"][p])
    assert embodiment_id(case.embodiment) == int(rec["embodiment_id"][0, 0])


def test_the_prompt_is_the_chat_template_with_the_task_as_a_list_repr(prompt):
    text = prompt.text("pick up the red cube", 2)
    assert "['pick up the red cube']" in text and text.count("<img>") == 2
    assert text.count(prompt.image_token) == 2 * prompt.tokens_per_tile
    assert "['Perform the task.']" in prompt.text("", 1)


def test_an_unknown_embodiment_is_refused_by_name():
    from flashrt_ros.models.lerobot.groot.processor_groot import embodiment_id
    from flashrt_ros.runtime.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="'so101'.*new_embodiment"):
        embodiment_id("so101")


def _our_episode(case, rec, backbone, head, prompt, noise: torch.Tensor) -> list[torch.Tensor]:
    """Our processor, backbone, head and queue over the reference's episode inputs, replan p with ``noise[p]``."""
    from groot_reference import reference_inputs

    from flashrt_ros.models.lerobot.groot.processor_groot import (eagle_pixels, embodiment_id, normalize_state,
                                                                  unnormalize_action)
    inputs = reference_inputs(case)
    low, high = inputs["stats.action.min"], inputs["stats.action.max"]
    horizon, n = head.sizes.action_horizon, case.n_action_steps
    actions, plans, chunk, start = [], 0, None, 0
    for step in range(case.steps):
        frames, state = _step_inputs(case, inputs, step)
        if chunk is None or step - start == n:             # the queue is empty: replan
            with torch.no_grad():
                features = backbone(prompt.ids(case.task, case.cameras),
                                    eagle_pixels(frames, backbone.eagle_model.sizes.image_size))
                chunk = head.sample(features, normalize_state(state, inputs["stats.observation.state.min"],
                                                              inputs["stats.observation.state.max"],
                                                              head.sizes.max_state_dim),
                                    torch.tensor([embodiment_id(case.embodiment)]), noise[plans])
            start, plans = step, plans + 1
        # LeRobot's queue keeps the chunk's LAST n_action_steps rows
        actions.append(unnormalize_action(chunk[0, horizon - n + (step - start)], low, high))
    return actions


def test_a_whole_episode_from_camera_frames_to_robot_actions(episode, prompt):
    """Frames, state and task in, the queue's actions out, every step: LeRobot's select_action and postprocessor."""
    case, rec, backbone, head, _w, _u = episode
    for step, action in enumerate(_our_episode(case, rec, backbone, head, prompt, rec["noise"])):
        assert torch.equal(action, rec["actions"][step]), (step, action, rec["actions"][step])


def test_lerobot_samples_from_our_counter_stream(episode, prompt, tmp_path):
    """Our noise stream (``ops.counter_rng``: seed, plan counter) handed to LeRobot's sampler instead of its
    ``torch.randn``: its episode and ours agree step for step with the noise a capsule can restore."""
    from groot_reference import Case, reference_record, run_reference
    from safetensors.torch import save_file

    from flashrt_ros.ops.counter_rng import normal
    case, _rec, backbone, head, _w, _u = episode
    h, m = head.sizes.action_horizon, head.sizes.action_dim
    seed = torch.tensor(1234, dtype=torch.int64)
    noise = torch.stack([normal(seed, torch.tensor(p, dtype=torch.int64), h * m).view(1, h, m) for p in range(3)])
    save_file({"noise": noise}, str(tmp_path / "noise.safetensors"))
    ours_case = Case(**{**case.__dict__, "directory": str(tmp_path / "counter"),
                        "noise_file": str(tmp_path / "noise.safetensors")})
    run_reference([ours_case], tmp_path / "spec")
    rec = reference_record(ours_case)
    assert torch.equal(rec["noise"], noise)
    for step, action in enumerate(_our_episode(ours_case, rec, backbone, head, prompt, noise)):
        assert torch.equal(action, rec["actions"][step]), step
    assert not torch.equal(rec["actions"], episode[1]["actions"])     # the other noise did change the episode
