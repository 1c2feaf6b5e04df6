"""GR00T N1.5's configuration as a LeRobot 0.4.4 checkpoint fixes it, read without transformers or LeRobot.

Why three sources: a LeRobot GR00T checkpoint (``config.json`` with ``"type": "groot"``, ``model.safetensors``
under ``_groot_model.``) says what the robot feeds and how the policy runs (dims, cameras, embodiment, chunking);
the weights' shapes (the safetensors header only: no tensor is loaded) give every width and layer count of
the network; what shapes cannot tell (attention heads, RoPE theta, norm eps, the image token, the vision tap,
the flow's steps) is in the two configs LeRobot builds the model from: the Eagle assets' ``config.json``
(``tokenizer_assets_repo``, read from ``HF_LEROBOT_HOME``) and the base model's GR00T N1.5 ``config.json``
(``base_model_path``, a local directory or the hub cache). Settings our modules do not implement are refused by
name (``InvalidArgument``) rather than run differently.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashrt_ros.models.lerobot.checkpoint import (CONFIG, WEIGHTS, LeRobotCheckpoint, PolicyIO, _features,
                                                   _read_json)
from flashrt_ros.models.lerobot.groot.action_head import DiTSizes, HeadSizes
from flashrt_ros.models.lerobot.groot.eagle import EagleSizes, Qwen3Sizes
from flashrt_ros.models.lerobot.groot.processor_groot import embodiment_id
from flashrt_ros.models.lerobot.siglip import SiglipSizes
from flashrt_ros.models.lerobot.tokenizer_files import hub_cache_file
from flashrt_ros.runtime.errors import InvalidArgument

PREFIX = "_groot_model."
BACKBONE = PREFIX + "backbone.eagle_model."
VISION = BACKBONE + "vision_model.vision_model."
LLM = BACKBONE + "language_model."
HEAD = PREFIX + "action_head."
DEFAULT_ASSETS_REPO = "lerobot/eagle2hg-processor-groot-n1p5"
DEFAULT_BASE_MODEL = "nvidia/GR00T-N1.5-3B"
#: nvidia/GR00T-N1.5-3B's action_head_cfg values the weights cannot show; used only when its config.json is not
#: on this machine and the weights' widths are the published ones
PUBLISHED_HEAD = {"dit_heads": 32, "dit_head_dim": 48, "vl_heads": 32, "vl_head_dim": 64,
                  "num_inference_timesteps": 4, "num_timestep_buckets": 1000, "action_horizon": 16}


@dataclass(frozen=True)
class GrootConfig:
    """What a LeRobot GR00T N1.5 checkpoint asks for: the policy's settings and the network's sizes."""

    state_dim: int
    action_dim: int
    cameras: tuple[str, ...]                      # sorted, as LeRobot's preprocessor orders them
    image_shape: tuple[int, int, int] | None
    embodiment_tag: str
    embodiment_id: int
    n_action_steps: int
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    use_bf16: bool
    base_model_path: str
    tokenizer_assets_repo: str
    assets_dir: Path                              # the Eagle assets (config, tokenizer, chat template)
    base_config_path: Path | None                 # None: the published GR00T-N1.5-3B values were used
    vision: SiglipSizes = field(default_factory=SiglipSizes)
    image_size: int = 224
    vision_select_layer: int = 27
    text: Qwen3Sizes = field(default_factory=Qwen3Sizes)
    image_token_id: int = 151669
    project_to_dim: int | None = None             # eagle_linear's output; None: Identity (published)
    head: HeadSizes = field(default_factory=HeadSizes)

    def eagle_sizes(self) -> EagleSizes:
        return EagleSizes(vision=self.vision, image_size=self.image_size, vision_select_layer=self.vision_select_layer,
                          text=self.text, image_token_id=self.image_token_id)

    def head_sizes(self) -> HeadSizes:
        return self.head

    @property
    def tokens_per_image(self) -> int:
        return self.eagle_sizes().tokens_per_image


def read_groot_config(ckpt_or_dir: LeRobotCheckpoint | str | Path) -> GrootConfig:
    """The configuration of the GR00T checkpoint (a directory, or one ``read_checkpoint`` parsed);
    ``InvalidArgument`` names what is missing or unsupported."""
    if isinstance(ckpt_or_dir, LeRobotCheckpoint):
        root, config = ckpt_or_dir.path, ckpt_or_dir.config
        shapes = {k: tuple(v.shape) for k, v in ckpt_or_dir.weights.items()}
    else:
        root = Path(ckpt_or_dir).expanduser()
        if not (root / CONFIG).is_file() or not (root / WEIGHTS).is_file():
            raise InvalidArgument(f"GR00T checkpoint {str(root)!r} needs {CONFIG} and {WEIGHTS}")
        config = _read_json(root / CONFIG)
        shapes = _header_shapes(root / WEIGHTS)
    where = f"{root / CONFIG}"
    if config.get("type") != "groot":
        raise InvalidArgument(f"{where}: type {config.get('type')!r} is not 'groot'")
    if int(config.get("n_obs_steps", 1)) != 1:
        raise InvalidArgument(f"{where}: GR00T supports n_obs_steps == 1 only, got {config.get('n_obs_steps')}")
    if int(config.get("lora_rank", 0) or 0) > 0:
        raise InvalidArgument(f"{where}: lora_rank {config['lora_rank']} (LoRA adapters) is not supported")
    io = PolicyIO.from_features(_features(config, "input_features", root), _features(config, "output_features", root),
                                root, "GR00T")
    if not io.cameras:
        raise InvalidArgument(f"{where}: GR00T needs at least one VISUAL input")
    tag = str(config.get("embodiment_tag", "new_embodiment"))
    try:
        emb_id = embodiment_id(tag)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None

    repo = str(config.get("tokenizer_assets_repo") or DEFAULT_ASSETS_REPO)
    assets = _assets_dir(repo)
    eagle = _read_json(assets / CONFIG)
    base_path = str(config.get("base_model_path") or DEFAULT_BASE_MODEL)
    base_file = _base_config_file(base_path)
    base = _read_json(base_file) if base_file is not None else None

    vision, image_size, select = _vision(shapes, eagle, assets)
    text, image_token = _text(shapes, eagle, assets)
    project_to_dim = shapes[PREFIX + "backbone.eagle_linear.weight"][0] \
        if PREFIX + "backbone.eagle_linear.weight" in shapes else None
    head = _head(shapes, base, base_file, base_path, text.width if project_to_dim is None else project_to_dim)

    cfg = GrootConfig(
        state_dim=io.state_dim, action_dim=io.action_dim, cameras=tuple(sorted(io.cameras)),
        image_shape=io.image_shape, embodiment_tag=tag, embodiment_id=emb_id,
        n_action_steps=int(config.get("n_action_steps", 50)), chunk_size=int(config.get("chunk_size", 50)),
        max_state_dim=int(config.get("max_state_dim", 64)), max_action_dim=int(config.get("max_action_dim", 32)),
        use_bf16=bool(config.get("use_bf16", True)), base_model_path=base_path, tokenizer_assets_repo=repo,
        assets_dir=assets, base_config_path=base_file, vision=vision, image_size=image_size,
        vision_select_layer=select, text=text, image_token_id=image_token, project_to_dim=project_to_dim, head=head)
    if cfg.max_state_dim != head.max_state_dim:
        raise InvalidArgument(f"{where}: max_state_dim {cfg.max_state_dim} but the state encoder reads "
                              f"{head.max_state_dim}")
    if cfg.max_action_dim != head.action_dim:
        raise InvalidArgument(f"{where}: max_action_dim {cfg.max_action_dim} but the action head predicts "
                              f"{head.action_dim}")
    if cfg.state_dim > cfg.max_state_dim or cfg.action_dim > cfg.max_action_dim:
        raise InvalidArgument(f"{where}: state/action ({cfg.state_dim} / {cfg.action_dim}) longer than "
                              f"max_state_dim / max_action_dim ({cfg.max_state_dim} / {cfg.max_action_dim})")
    if cfg.n_action_steps > cfg.chunk_size:
        raise InvalidArgument(f"{where}: n_action_steps {cfg.n_action_steps} > chunk_size {cfg.chunk_size}")
    return cfg


# --- where the two configs are ---------------------------------------------------------------------------------
def _assets_dir(repo: str) -> Path:
    """LeRobot's ``HF_LEROBOT_HOME / tokenizer_assets_repo`` (an absolute repo is itself)."""
    candidates = []
    if Path(repo).is_absolute():
        candidates.append(Path(repo))
    else:
        if os.environ.get("HF_LEROBOT_HOME"):
            candidates.append(Path(os.environ["HF_LEROBOT_HOME"]).expanduser() / repo)
        if os.environ.get("HF_HOME"):
            candidates.append(Path(os.environ["HF_HOME"]).expanduser() / "lerobot" / repo)
        candidates.append(Path.home() / ".cache" / "huggingface" / "lerobot" / repo)
    for c in candidates:
        if (c / CONFIG).is_file():
            return c
    raise InvalidArgument(f"GR00T's Eagle assets (tokenizer_assets_repo {repo!r}, the hub repo LeRobot downloads "
                          f"them from) are not on this machine: no {CONFIG} in {', '.join(map(str, candidates))}")


def _base_config_file(base_model_path: str) -> Path | None:
    local = Path(base_model_path).expanduser()
    if (local / CONFIG).is_file():
        return local / CONFIG
    return hub_cache_file(base_model_path, CONFIG)


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types
        raise InvalidArgument(f"{path}: not a readable safetensors file ({exc})") from None


def _shape(shapes: dict[str, tuple[int, ...]], key: str) -> tuple[int, ...]:
    if key not in shapes:
        raise InvalidArgument(f"GR00T's {WEIGHTS} has no {key}")
    return shapes[key]


def _count(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    """How many consecutive ``prefix<i>.`` blocks the weights hold."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in shapes):
        n += 1
    return n


def _sub(cfg: dict[str, Any], key: str, where: Path) -> dict[str, Any]:
    value = cfg.get(key)
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: no {key}")
    return value


# --- the backbone ----------------------------------------------------------------------------------------------
def _vision(shapes, eagle: dict[str, Any], assets: Path) -> tuple[SiglipSizes, int, int]:
    where = assets / CONFIG
    if eagle.get("use_pixel_shuffle"):
        raise InvalidArgument(f"{where}: use_pixel_shuffle true is not supported (GR00T N1.5 has none)")
    if int(eagle.get("mlp_connector_layers", 1)) != 1:
        raise InvalidArgument(f"{where}: mlp_connector_layers {eagle.get('mlp_connector_layers')} is not supported "
                              f"(GR00T N1.5's projector is one Linear)")
    for key in ("use_backbone_lora", "use_llm_lora"):
        if eagle.get(key):
            raise InvalidArgument(f"{where}: {key} {eagle[key]} (LoRA) is not supported")
    vc = _sub(eagle, "vision_config", where)
    if vc.get("model_type") != "siglip_vision_model":
        raise InvalidArgument(f"{where}: vision_config.model_type {vc.get('model_type')!r} is not "
                              f"'siglip_vision_model'")
    width, _, patch, _ = _shape(shapes, VISION + "embeddings.patch_embedding.weight")
    positions = _shape(shapes, VISION + "embeddings.position_embedding.weight")[0]
    side = int(round(positions ** 0.5))
    if side * side != positions:
        raise InvalidArgument(f"GR00T's SigLIP has {positions} positions, not a square grid")
    image_size = side * patch
    if "force_image_size" in eagle and eagle["force_image_size"] is not None and \
            int(eagle["force_image_size"]) != image_size:
        raise InvalidArgument(f"{where}: force_image_size {eagle['force_image_size']} but the weights' SigLIP "
                              f"positions give {image_size}")
    layers = _count(shapes, VISION + "encoder.layers.")
    heads = int(vc.get("num_attention_heads", 0))
    if heads <= 0 or width % heads:
        raise InvalidArgument(f"{where}: vision_config.num_attention_heads {vc.get('num_attention_heads')} does not "
                              f"divide the SigLIP width {width}")
    vision = SiglipSizes(hidden=width, intermediate=_shape(shapes, VISION + "encoder.layers.0.mlp.fc1.weight")[0],
                         layers=layers, heads=heads, patch_size=patch, eps=float(vc.get("layer_norm_eps", 1e-6)))
    select = int(eagle.get("select_layer", -1))
    if select < -1:                          # hidden_states[-k]: after layers + 1 - k layers
        select = layers + 1 + select
    if not (select == -1 or 0 <= select <= layers):
        raise InvalidArgument(f"{where}: select_layer {eagle.get('select_layer')} is outside SigLIP's {layers} layers")
    return vision, image_size, select


def _text(shapes, eagle: dict[str, Any], assets: Path) -> tuple[Qwen3Sizes, int]:
    where = assets / CONFIG
    tc = _sub(eagle, "text_config", where)
    if list(tc.get("architectures") or []) != ["Qwen3ForCausalLM"]:
        raise InvalidArgument(f"{where}: text_config.architectures {tc.get('architectures')} is not "
                              f"['Qwen3ForCausalLM']")
    if tc.get("rope_scaling") is not None:
        raise InvalidArgument(f"{where}: text_config.rope_scaling {tc['rope_scaling']} is not supported")
    if "image_token_index" not in eagle:
        raise InvalidArgument(f"{where}: no image_token_index")
    layer = LLM + "model.layers.0."
    q_rows, width = _shape(shapes, layer + "self_attn.q_proj.weight")
    head_dim = _shape(shapes, layer + "self_attn.q_norm.weight")[0]
    vocab_key = LLM + "lm_head.weight" if LLM + "lm_head.weight" in shapes else LLM + "model.embed_tokens.weight"
    text = Qwen3Sizes(width=width, layers=_count(shapes, LLM + "model.layers."), heads=q_rows // head_dim,
                      kv_heads=_shape(shapes, layer + "self_attn.k_proj.weight")[0] // head_dim, head_dim=head_dim,
                      intermediate=_shape(shapes, layer + "mlp.gate_proj.weight")[0],
                      vocab=_shape(shapes, vocab_key)[0], rope_theta=float(tc.get("rope_theta", 1_000_000.0)),
                      eps=float(tc.get("rms_norm_eps", 1e-6)))
    _shape(shapes, BACKBONE + "mlp1.0.weight")
    return text, int(eagle["image_token_index"])


# --- the action head -------------------------------------------------------------------------------------------
def _head(shapes, base: dict[str, Any] | None, base_file: Path | None, base_path: str,
          backbone_width: int) -> HeadSizes:
    categories, max_state_dim, hidden = _shape(shapes, HEAD + "state_encoder.layer1.W")
    width = _shape(shapes, HEAD + "state_encoder.layer2.W")[2]
    action_dim = _shape(shapes, HEAD + "action_encoder.W1.W")[1]
    blocks = HEAD + "model.transformer_blocks."
    dit_layers = _count(shapes, blocks)
    kv_in = [_shape(shapes, f"{blocks}{i}.attn1.to_k.weight")[1] for i in range(dit_layers)]
    dit_width = _shape(shapes, f"{blocks}0.attn1.to_q.weight")[0]
    cross_dim = kv_in[0]
    use_vlln = HEAD + "vlln.weight" in shapes
    vl_prefix = HEAD + "vl_self_attention.transformer_blocks."
    vl_layers = _count(shapes, vl_prefix)
    vl_width = _shape(shapes, vl_prefix + "0.attn1.to_q.weight")[0] if vl_layers else 0

    if base is None:
        if (dit_width, vl_width) != (1536, 2048):
            raise InvalidArgument(
                f"GR00T's base model config.json (base_model_path {base_path!r}) is not on this machine (looked in "
                f"{Path(base_path).expanduser() / CONFIG} and the hub cache): its action_head_cfg's "
                f"diffusion_model_cfg / vl_self_attention_cfg attention heads and head dims, num_inference_timesteps "
                f"and num_timestep_buckets are missing, and the weights' widths ({dit_width}, {vl_width}) are not "
                f"GR00T-N1.5-3B's (1536, 2048)")
        p = PUBLISHED_HEAD
        dit_heads, dit_head_dim = p["dit_heads"], p["dit_head_dim"]
        vl_heads, vl_head_dim = p["vl_heads"], p["vl_head_dim"]
        steps, buckets, horizon, interleave_cfg = (p["num_inference_timesteps"], p["num_timestep_buckets"],
                                                   p["action_horizon"], True)
    else:
        ah = _sub(base, "action_head_cfg", base_file)
        dit_cfg = _sub(ah, "diffusion_model_cfg", base_file)
        vl_cfg = _sub(ah, "vl_self_attention_cfg", base_file)
        for name, sub in (("diffusion_model_cfg", dit_cfg), ("vl_self_attention_cfg", vl_cfg)):
            if sub.get("positional_embeddings") is not None:
                raise InvalidArgument(f"{base_file}: action_head_cfg.{name}.positional_embeddings "
                                      f"{sub['positional_embeddings']!r} is not supported (null only)")
        if dit_cfg.get("norm_type", "ada_norm") != "ada_norm":
            raise InvalidArgument(f"{base_file}: action_head_cfg.diffusion_model_cfg.norm_type "
                                  f"{dit_cfg['norm_type']!r} is not supported ('ada_norm' only)")
        try:
            dit_heads, dit_head_dim = int(dit_cfg["num_attention_heads"]), int(dit_cfg["attention_head_dim"])
            vl_heads, vl_head_dim = int(vl_cfg["num_attention_heads"]), int(vl_cfg["attention_head_dim"])
        except KeyError as exc:
            raise InvalidArgument(f"{base_file}: action_head_cfg has no {exc.args[0]} for the DiT / VL "
                                  f"self-attention") from None
        steps = int(ah.get("num_inference_timesteps", 4))
        buckets = int(ah.get("num_timestep_buckets", 1000))
        horizon = int(ah.get("action_horizon", base.get("action_horizon", 16)))
        interleave_cfg = bool(dit_cfg.get("interleave_self_attention", True))
    if dit_heads * dit_head_dim != dit_width:
        raise InvalidArgument(f"{base_file}: diffusion_model_cfg heads x head dim {dit_heads} x {dit_head_dim} is not "
                              f"the weights' DiT width {dit_width}")
    if vl_layers and vl_heads * vl_head_dim != vl_width:
        raise InvalidArgument(f"{base_file}: vl_self_attention_cfg heads x head dim {vl_heads} x {vl_head_dim} is "
                              f"not the weights' width {vl_width}")
    if dit_width != width:
        raise InvalidArgument(f"GR00T's DiT width {dit_width} is not the action encoder's {width}")

    # cross-attention blocks read the backbone's width in to_k; interleaved: even blocks cross, odd self
    if cross_dim == dit_width:
        interleave = interleave_cfg                  # the shapes cannot tell: the config does
    else:
        interleave = dit_layers > 1 and kv_in[1] == dit_width
    expected = [dit_width if interleave and i % 2 == 1 else cross_dim for i in range(dit_layers)]
    if kv_in != expected:
        raise InvalidArgument(f"GR00T's DiT blocks read keys of widths {kv_in}: not alternating cross- and "
                              f"self-attention, nor all cross-attention")
    if cross_dim != backbone_width:
        raise InvalidArgument(f"GR00T's DiT cross-attends to width {cross_dim}, the backbone gives {backbone_width}")

    has_pos = HEAD + "position_embedding.weight" in shapes
    return HeadSizes(
        action_dim=action_dim, action_horizon=horizon, max_state_dim=max_state_dim, hidden_size=hidden,
        input_embedding_dim=width, backbone_embedding_dim=cross_dim, max_num_embodiments=categories,
        num_target_vision_tokens=_shape(shapes, HEAD + "future_tokens.weight")[0],
        max_seq_len=shapes[HEAD + "position_embedding.weight"][0] if has_pos else 1024,
        num_inference_timesteps=steps, num_timestep_buckets=buckets, add_pos_embed=has_pos, use_vlln=use_vlln,
        dit=DiTSizes(heads=dit_heads, head_dim=dit_head_dim, layers=dit_layers, cross_attention_dim=cross_dim,
                     interleave_self_attention=interleave,
                     output_dim=_shape(shapes, HEAD + "model.proj_out_2.weight")[0]),
        vl_self_attention=DiTSizes(heads=vl_heads, head_dim=vl_head_dim, layers=vl_layers, cross_attention_dim=None,
                                   interleave_self_attention=False, output_dim=0))
