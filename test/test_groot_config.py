"""GR00T N1.5's configuration read from a LeRobot 0.4.4 checkpoint (``configuration_groot.read_groot_config``).

The checkpoint is the one LeRobot's own ``GrootPolicy`` saves (``groot_reference``, tiny sizes): the sizes read
from its config.json, its weights' shapes, its Eagle assets' and its base model's configs must be the ones
built by hand from the reference's ``TINY`` dict, and the modules built from them must load the checkpoint
strictly. Every refusal is triggered on an edited copy and must name the field.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flashrt_ros.models.lerobot.groot.action_head import FlowmatchingActionHead
from flashrt_ros.models.lerobot.groot.configuration_groot import PREFIX, read_groot_config
from flashrt_ros.models.lerobot.groot.eagle import EagleBackbone, backbone_weights
from flashrt_ros.runtime.errors import InvalidArgument

ASSETS = "eagle2hg-processor-groot-n1p5"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from groot_reference import Case, run_reference
    root = tmp_path_factory.mktemp("groot_config")
    c = Case(directory=str(root / "a"), attn="sdpa", n_action_steps=8, steps=1)
    run_reference([c], root / "spec")
    return c


@pytest.fixture
def no_caches(tmp_path, monkeypatch):
    """No hub or LeRobot cache of this machine is seen."""
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HF_LEROBOT_HOME", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home


def _copy(case, tmp_path: Path) -> Path:
    """The checkpoint, its base and its assets copied, config.json pointing at the copies."""
    d = tmp_path / "ckpt"
    shutil.copytree(case.directory, d, ignore=shutil.ignore_patterns("reference_*"))
    _edit(d / "config.json", base_model_path=str(d / "base"), tokenizer_assets_repo=str(d / ASSETS))
    return d


def _edit(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        node = cfg
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(json.dumps(cfg))


def test_the_sizes_are_the_hand_built_ones_and_the_modules_load_strictly(case):
    from groot_reference import TINY
    from test_groot_lerobot import _sizes

    sizes = json.loads((case.path / "groot_sizes.json").read_text())
    cfg = read_groot_config(case.directory)
    eagle, head = _sizes(TINY, sizes["vocab_size"], sizes["image_token_index"])
    assert cfg.eagle_sizes() == eagle
    assert cfg.head_sizes() == head
    assert cfg.tokens_per_image == sizes["tokens_per_tile"] == 16
    assert cfg.assets_dir == case.path / ASSETS and cfg.base_config_path == case.path / "base" / "config.json"
    assert (cfg.state_dim, cfg.action_dim, cfg.max_state_dim, cfg.max_action_dim) == (6, 5, 16, 8)
    assert cfg.cameras == ("observation.images.cam0", "observation.images.cam1")
    assert (cfg.embodiment_tag, cfg.embodiment_id, cfg.n_action_steps, cfg.chunk_size) == ("new_embodiment", 31, 8, 16)
    assert cfg.project_to_dim is None and cfg.use_bf16 is False

    weights = load_file(str(case.path / "model.safetensors"))
    backbone = EagleBackbone(cfg.eagle_sizes(), project_to_dim=cfg.project_to_dim)
    backbone.load_state_dict(backbone_weights(weights, PREFIX + "backbone."), strict=True)
    action_head = FlowmatchingActionHead(cfg.head_sizes())
    action_head.load_state_dict({k[len(PREFIX + "action_head."):]: v for k, v in weights.items()
                                 if k.startswith(PREFIX + "action_head.")}, strict=True)


def test_a_parsed_checkpoint_gives_the_same_config(case):
    """A ``LeRobotCheckpoint`` whose weights are loaded (their shapes read instead of the header). GR00T's
    checkpoints have no normalizer step (its min-max stats are in the pack step), so ``read_checkpoint`` refuses
    them: the checkpoint is made here."""
    from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, Normalization
    none = Normalization(norm_map={}, features={}, stats={})
    ckpt = LeRobotCheckpoint(path=case.path, config=json.loads((case.path / "config.json").read_text()),
                             weights=load_file(str(case.path / "model.safetensors")), normalize=none, unnormalize=none)
    assert read_groot_config(ckpt) == read_groot_config(case.path)


def test_the_assets_are_found_under_hf_lerobot_home_by_repo_name(case, tmp_path, no_caches, monkeypatch):
    d = _copy(case, tmp_path)
    lerobot_home = tmp_path / "lerobot_home"
    shutil.copytree(d / ASSETS, lerobot_home / "lerobot" / ASSETS)
    _edit(d / "config.json", tokenizer_assets_repo="lerobot/" + ASSETS)
    monkeypatch.setenv("HF_LEROBOT_HOME", str(lerobot_home))
    assert read_groot_config(d).assets_dir == lerobot_home / "lerobot" / ASSETS


@pytest.mark.parametrize("file, changes, match", [
    ("config.json", {"embodiment_tag": "so101"}, "embodiment_tag 'so101'"),
    ("config.json", {"lora_rank": 1}, "lora_rank 1"),
    ("config.json", {"n_obs_steps": 2}, "n_obs_steps"),
    (ASSETS + "/config.json", {"use_pixel_shuffle": True}, "use_pixel_shuffle"),
    (ASSETS + "/config.json", {"mlp_connector_layers": 2}, "mlp_connector_layers 2"),
    (ASSETS + "/config.json", {"use_llm_lora": 1}, "use_llm_lora"),
    (ASSETS + "/config.json", {"use_backbone_lora": 1}, "use_backbone_lora"),
    (ASSETS + "/config.json", {"text_config__architectures": ["LlamaForCausalLM"]}, "text_config.architectures"),
    (ASSETS + "/config.json", {"vision_config__model_type": "clip_vision_model"}, "vision_config.model_type"),
    ("base/config.json", {"action_head_cfg__diffusion_model_cfg__positional_embeddings": "sinusoidal"},
     "diffusion_model_cfg.positional_embeddings"),
    ("base/config.json", {"action_head_cfg__vl_self_attention_cfg__positional_embeddings": "sinusoidal"},
     "vl_self_attention_cfg.positional_embeddings"),
    ("base/config.json", {"action_head_cfg__diffusion_model_cfg__norm_type": "layer_norm"}, "norm_type 'layer_norm'"),
])
def test_unsupported_settings_are_refused_by_name(case, tmp_path, file, changes, match):
    d = _copy(case, tmp_path)
    _edit(d / file, **changes)
    with pytest.raises(InvalidArgument, match=match):
        read_groot_config(d)


def test_missing_eagle_assets_name_the_hub_repo_and_the_paths_tried(case, tmp_path, no_caches, monkeypatch):
    d = _copy(case, tmp_path)
    _edit(d / "config.json", tokenizer_assets_repo="lerobot/" + ASSETS)
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "empty"))
    with pytest.raises(InvalidArgument, match="tokenizer_assets_repo 'lerobot/eagle2hg-processor-groot-n1p5'") as err:
        read_groot_config(d)
    assert str(tmp_path / "empty" / "lerobot" / ASSETS) in str(err.value)
    assert str(no_caches / ".cache" / "huggingface" / "lerobot" / "lerobot" / ASSETS) in str(err.value)


def test_a_missing_base_config_is_refused_unless_the_widths_are_the_published_ones(case, tmp_path, no_caches):
    d = _copy(case, tmp_path)
    shutil.rmtree(d / "base")
    with pytest.raises(InvalidArgument, match=r"base_model_path .*not on this machine.*attention heads.*"
                                              r"num_inference_timesteps.*\(32, 64\)"):
        read_groot_config(d)
    _edit(d / "config.json", base_model_path="nvidia/GR00T-N1.5-3B")      # not in the (empty) hub cache either
    with pytest.raises(InvalidArgument, match="'nvidia/GR00T-N1.5-3B'.*hub cache"):
        read_groot_config(d)


def test_without_a_base_config_the_published_widths_give_gr00t_n15_3bs_head():
    """The published head's shapes alone (no base config.json): GR00T-N1.5-3B's values, ``HeadSizes()``."""
    from flashrt_ros.models.lerobot.groot.action_head import HeadSizes
    from flashrt_ros.models.lerobot.groot.configuration_groot import HEAD, _head
    shapes = {HEAD + "state_encoder.layer1.W": (32, 64, 1024), HEAD + "state_encoder.layer2.W": (32, 1024, 1536),
              HEAD + "action_encoder.W1.W": (32, 32, 1536), HEAD + "future_tokens.weight": (32, 1536),
              HEAD + "position_embedding.weight": (1024, 1536), HEAD + "model.proj_out_2.weight": (1024, 1536),
              HEAD + "vlln.weight": (2048,)}
    for i in range(16):
        shapes[f"{HEAD}model.transformer_blocks.{i}.attn1.to_q.weight"] = (1536, 1536)
        shapes[f"{HEAD}model.transformer_blocks.{i}.attn1.to_k.weight"] = (1536, 1536 if i % 2 else 2048)
    for i in range(4):
        shapes[f"{HEAD}vl_self_attention.transformer_blocks.{i}.attn1.to_q.weight"] = (2048, 2048)
    assert _head(shapes, None, None, "nvidia/GR00T-N1.5-3B", 2048) == HeadSizes()


def test_the_published_size_is_lerobots_less_the_pooling_head_it_never_reads():
    """GR00T-N1.5-3B at its published sizes (our defaults), built on the meta device: LeRobot's 2,413,522,880
    parameters (its classes on the meta device, ``groot_reference/NOTES.md``) less SigLIP's pooling head, which
    LeRobot builds and we do not: probe 1,152 + attention 3,984,768 + 1,328,256 + norm 2,304 + MLP 9,921,872.
    The tied vocabulary head is one tensor in both counts."""
    from flashrt_ros.models.lerobot.groot.action_head import HeadSizes
    from flashrt_ros.models.lerobot.groot.eagle import EagleSizes
    with torch.device("meta"):
        modules = (EagleBackbone(EagleSizes(), project_to_dim=None), FlowmatchingActionHead(HeadSizes()))
    ours = sum(p.numel() for m in modules for p in m.parameters())
    pooling_head = 1152 + (3 * 1152 * 1152 + 3 * 1152) + (1152 * 1152 + 1152) + 2 * 1152 \
        + (1152 * 4304 + 4304 + 4304 * 1152 + 1152)
    assert ours + pooling_head == 2_413_522_880
