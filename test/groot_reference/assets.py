"""A local stand-in for the hub repo ``lerobot/eagle2hg-processor-groot-n1p5`` at the case's sizes.

``EagleBackbone.__init__`` (``groot_n1.py``) and ``_build_eagle_processor`` (``processor_groot.py``) read
``HF_LEROBOT_HOME / tokenizer_assets_repo``; ``utils.ensure_eagle_cache_ready`` copies the vendored
``eagle2_hg_model/*.py`` there and ``hf_hub_download``s each of these 10 files only if it is missing:
``vocab.json merges.txt added_tokens.json chat_template.json special_tokens_map.json config.json
generation_config.json preprocessor_config.json processor_config.json tokenizer_config.json``.
Writing all 10 (plus ``tokenizer.json`` for the fast tokenizer) makes construction offline. The reference
gives an absolute directory as ``tokenizer_assets_repo`` (``Path / absolute`` is the absolute path), so a
checkpoint's assets live beside it.

Tokenizer: byte-level BPE with the 256 byte symbols and no merges (one token per UTF-8 byte), plus the
Qwen / Eagle special tokens as added tokens: vocab 264, ``<IMG_CONTEXT>`` = 261. The real one is Qwen3's
(vocab 151680, ``<IMG_CONTEXT>`` = 151669).
"""
from __future__ import annotations

import json
from pathlib import Path

# ChatML as in Qwen / Eagle 2.5. The Eagle processor needs "<image-k>" per image (processing_eagle2_5_vl.py's
# regex "<(image|video)-(\d+)>"), which it replaces by "<image k><img>" + "<IMG_CONTEXT>" * tokens_per_tile
# * tiles + "</img>". The system prompt is the Qwen2-VL / Eagle convention; the hub file's exact text is unverified.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    "{% set image_count.value = image_count.value + 1 %}<image-{{ image_count.value }}>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>",
           "<|vision_start|>", "<|vision_end|>"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_assets(directory: Path, sizes: dict, *, torch_dtype: str = "float32") -> dict:
    """Write the 10 asset files and ``tokenizer.json`` for ``sizes`` (``reference.TINY``'s layout: ``image_size``,
    ``patch_size``, ``vision``, ``text``); returns ``vocab_size``, ``image_token_index``, ``tokens_per_tile`` and
    ``added_tokens``.

    ``torch_dtype``: the published Eagle config says bfloat16, and ``AutoModel.from_config`` then builds the Eagle
    weights in bf16 (and ``use_bf16=False`` fails with a dtype mismatch); float32 gives an fp32 reference.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    image_size, patch_size, vision, text = sizes["image_size"], sizes["patch_size"], sizes["vision"], sizes["text"]
    directory.mkdir(parents=True, exist_ok=True)
    b2u = bytes_to_unicode()
    vocab = {ch: i for i, ch in enumerate(sorted(b2u.values(), key=ord))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.save(str(directory / "tokenizer.json"))
    added = {s: tok.token_to_id(s) for s in SPECIAL}
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    image_token_index = added["<IMG_CONTEXT>"]

    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    (directory / "added_tokens.json").write_text(json.dumps(added, indent=1))
    (directory / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=1))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 8192, "errors": "replace",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "normalized": False, "lstrip": False,
                                          "rstrip": False, "single_word": False} for s, i in added.items()},
    }, indent=1))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=1))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": added["<|im_end|>"]}))

    tokens_per_tile = (image_size // patch_size) ** 2          # use_pixel_shuffle false (published N1.5 Eagle)
    auto_map = {"AutoProcessor": "processing_eagle2_5_vl.Eagle25VLProcessor",
                "AutoImageProcessor": "image_processing_eagle2_5_vl_fast.Eagle25VLImageProcessorFast"}
    # the published values (Isaac-GR00T n1.5 eagle2_hg_model/preprocessor_config.json), size reduced
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "auto_map": auto_map, "image_processor_type": "Eagle25VLImageProcessorFast",
        "processor_class": "Eagle25VLProcessor", "crop_size": None, "data_format": "channels_first",
        "default_to_square": False, "do_center_crop": None, "do_convert_rgb": True, "do_normalize": True,
        "do_pad": False, "do_rescale": True, "do_resize": False, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "max_dynamic_tiles": 12, "min_dynamic_tiles": 1,
        "pad_during_tiling": False, "resample": 3, "rescale_factor": 1 / 255,
        "size": {"height": image_size, "width": image_size}, "tokens_per_tile": tokens_per_tile,
        "use_thumbnail": True}, indent=1))
    (directory / "processor_config.json").write_text(json.dumps({
        "auto_map": auto_map, "processor_class": "Eagle25VLProcessor", "image_end_token": "</img>",
        "image_placeholder": "image", "image_start_token": "<img>", "image_token": "<IMG_CONTEXT>",
        "tokens_per_tile": tokens_per_tile, "video_placeholder": "video", "video_token": "<IMG_CONTEXT>",
        "vision_feature_select_strategy": None}, indent=1))

    # Eagle 2.5 VL: the published N1.5 values (Isaac-GR00T n1.5 eagle2_hg_model/config.json), sizes reduced
    text_cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
                "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
                "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_scaling": None,
                "rope_theta": 1000000.0, "sliding_window": None, "use_sliding_window": False,
                "tie_word_embeddings": True, "use_cache": False, "vocab_size": vocab_size,
                "bos_token_id": added["<|endoftext|>"], "eos_token_id": added["<|im_end|>"],
                "_attn_implementation_autoset": True, "torch_dtype": torch_dtype, **text}
    vision_cfg = {"model_type": "siglip_vision_model", "hidden_act": "gelu_pytorch_tanh", "attention_dropout": 0.0,
                  "layer_norm_eps": 1e-6, "num_channels": 3, "image_size": image_size, "patch_size": patch_size,
                  # published true; without it SigLIP's __init__ checks the flash-attn that Eagle forces on it
                  "_attn_implementation_autoset": True, "torch_dtype": torch_dtype, **vision}
    eagle = {
        "architectures": ["Eagle25VLForConditionalGeneration"],
        # LeRobot renamed the vendored classes (Isaac-GR00T's upstream copy says Eagle2_5_VL*)
        "auto_map": {"AutoConfig": "configuration_eagle2_5_vl.Eagle25VLConfig",
                     "AutoModel": "modeling_eagle2_5_vl.Eagle25VLForConditionalGeneration"},
        "model_type": "eagle_2_5_vl",
        "torch_dtype": torch_dtype,
        "_attn_implementation": "flash_attention_2",          # as published; env.no_flash_attention maps it
        "downsample_ratio": 0.5, "dynamic_image_size": True, "force_image_size": image_size,
        "image_token_index": image_token_index, "loss_version": "efficient_v2_cp_head",
        "max_dynamic_tiles": 12, "min_dynamic_tiles": 1, "mlp_checkpoint": False, "mlp_connector_layers": 1,
        "pad2square": False,
        # published 27 == SigLIP's layers: hidden_states[27] is the last encoder layer, before post_layernorm
        "select_layer": vision["num_hidden_layers"],
        "template": "qwen3-chat", "use_backbone_lora": 0, "use_llm_lora": 0, "use_pixel_shuffle": False,
        "use_thumbnail": True, "text_config": text_cfg, "vision_config": vision_cfg,
    }
    (directory / "config.json").write_text(json.dumps(eagle, indent=1))
    return {"vocab_size": vocab_size, "image_token_index": image_token_index, "tokens_per_tile": tokens_per_tile,
            "added_tokens": added}
