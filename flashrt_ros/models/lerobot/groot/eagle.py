"""GR00T N1.5's vision-language backbone, Eagle 2.5 VL as LeRobot 0.4.4 runs it: SigLIP, one projector, Qwen3 cut.

Why a module tree of its own: the names are the checkpoint's (``backbone.eagle_model.vision_model.vision_model...``,
``backbone.eagle_model.mlp1.0``, ``backbone.eagle_model.language_model.model.layers.<i>...``), so the backbone
loads without transformers; the operations are transformers 4.57's with the SDPA attention LeRobot's GR00T runs
on a machine without flash-attn, so ``exact`` numerics give LeRobot's bits on the CPU.

What GR00T reads of Eagle: the SigLIP features of the layer ``select_layer`` of the vision tower counts
(``hidden_states[k]``: after k encoder layers, before ``post_layernorm``; the tower's pooling head is computed by
LeRobot and never read), projected to the LLM's width by ``mlp1`` and written over the ``<IMG_CONTEXT>`` token
rows; then the language model cut to its first ``select_layer`` layers, and its final RMSNorm. The LLM's head
(logits over the vocabulary) is never needed. One prompt without padding is what ``exact`` runs (batch 1):
the causal mask is then SDPA's own. ``fast`` runs the prompt buffer's whole capacity, right-padded: the causal
mask keeps the padding out of every prompt row, so no other mask is needed; it writes the image tokens with
``embed_fixed`` (a gather, no shape that depends on the ids) and takes the RoPE tables of its fixed positions
once (``rope_table``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.siglip import SiglipSizes, VisionEmbeddings, VisionLayer


@dataclass(frozen=True)
class Qwen3Sizes:
    """The language model's sizes; the defaults are Qwen3-1.7B's (GR00T N1.5's, cut at 12 of 28 layers)."""

    width: int = 2048
    layers: int = 12
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 6144
    vocab: int = 151680
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6


@dataclass(frozen=True)
class EagleSizes:
    vision: SiglipSizes = SiglipSizes(hidden=1152, intermediate=4304, layers=27, heads=16, patch_size=14, eps=1e-6)
    image_size: int = 224
    vision_select_layer: int = 27           # hidden_states index of the vision tower (-1: after post_layernorm)
    text: Qwen3Sizes = Qwen3Sizes()
    image_token_id: int = 151669

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.vision.patch_size) ** 2


# --- SigLIP (transformers' SiglipVisionModel names) ---------------------------------------------------------------
class SiglipEncoder(nn.Module):
    def __init__(self, s: SiglipSizes) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(s, "gelu_pytorch_tanh") for _ in range(s.layers))


class SiglipTransformer(nn.Module):
    def __init__(self, s: SiglipSizes, image_size: int) -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(s, image_size, bucketed=False)
        self.encoder = SiglipEncoder(s)
        self.post_layernorm = nn.LayerNorm(s.hidden, eps=s.eps)


class SiglipVisionModel(nn.Module):
    def __init__(self, s: SiglipSizes, image_size: int) -> None:
        super().__init__()
        self.vision_model = SiglipTransformer(s, image_size)

    def features(self, pixels: Tensor, select_layer: int) -> Tensor:
        """``hidden_states[select_layer]`` of transformers' tower: embeddings, then ``select_layer`` layers
        (-1: all of them and the post-layernorm)."""
        t = self.vision_model
        x = t.embeddings(pixels)
        n = len(t.encoder.layers) if select_layer == -1 else select_layer
        for layer in t.encoder.layers[:n]:
            x = layer(x)
        return t.post_layernorm(x) if select_layer == -1 else x


# --- Qwen3 (transformers' Qwen3ForCausalLM names) -----------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _no_autocast(device: torch.device):
    """Autocast off (where a device has it; the meta device of the shape tests has none)."""
    return torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda") else contextlib.nullcontext()


def rope(positions: Tensor, s: Qwen3Sizes, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` (B, T, head_dim) of Qwen3's default RoPE, transformers' float32 arithmetic."""
    inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64).to(
        device=positions.device, dtype=torch.float) / s.head_dim))
    inv = inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
    with _no_autocast(positions.device):               # float32 under bf16 autocast, as transformers computes it
        freqs = (inv.float() @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * 1.0).to(dtype), (emb.sin() * 1.0).to(dtype)


class Qwen3Attention(nn.Module):
    def __init__(self, s: Qwen3Sizes) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.width, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.width, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.width, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.width, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.eps)
        self.k_norm = RMSNorm(s.head_dim, s.eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Causal self-attention over one unpadded prompt (SDPA's causal mask, grouped heads)."""
        shape = (*x.shape[:-1], -1, self.s.head_dim)
        q = self.q_norm(self.q_proj(x).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(shape)).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=self.s.head_dim ** -0.5,
                                             is_causal=q.shape[2] > 1, enable_gqa=True)
        out = out.transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


class Qwen3MLP(nn.Module):
    def __init__(self, s: Qwen3Sizes) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.width, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.width, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    def __init__(self, s: Qwen3Sizes) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(s)
        self.mlp = Qwen3MLP(s)
        self.input_layernorm = RMSNorm(s.width, s.eps)
        self.post_attention_layernorm = RMSNorm(s.width, s.eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, s: Qwen3Sizes) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.width)
        self.layers = nn.ModuleList(Qwen3Layer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.width, s.eps)


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, s: Qwen3Sizes) -> None:
        super().__init__()
        self.model = Qwen3Model(s)


class Projector(nn.Module):
    """``mlp1``: one Linear from the SigLIP width to the LLM's (GR00T N1.5: one connector layer, no pixel shuffle)."""

    def __init__(self, vision: int, width: int) -> None:
        super().__init__()
        self.add_module("0", nn.Linear(vision, width))

    def forward(self, x: Tensor) -> Tensor:
        return getattr(self, "0")(x)


class EagleModel(nn.Module):
    def __init__(self, s: EagleSizes) -> None:
        super().__init__()
        self.sizes = s
        self.vision_model = SiglipVisionModel(s.vision, s.image_size)
        self.mlp1 = Projector(s.vision.hidden, s.text.width)
        self.language_model = Qwen3ForCausalLM(s.text)

    def image_tokens(self, pixels: Tensor) -> Tensor:
        """(images, tokens_per_image, width): what replaces the ``<IMG_CONTEXT>`` rows, image by image."""
        return self.mlp1(self.vision_model.features(pixels, self.sizes.vision_select_layer))

    def embed(self, input_ids: Tensor, image_tokens: Tensor) -> Tensor:
        """Token embeddings with the image features written over the image-token rows, in order."""
        x = self.language_model.model.embed_tokens(input_ids)
        b, n, c = x.shape
        x = x.reshape(b * n, c)
        rows = input_ids.reshape(b * n) == self.sizes.image_token_id
        x[rows] = x[rows] * 0.0 + image_tokens.reshape(-1, c)
        return x.reshape(b, n, c)

    def embed_fixed(self, input_ids: Tensor, image_tokens: Tensor) -> Tensor:
        """``embed``'s values with device ops of fixed shapes (``fast``): the k-th image-token row takes image
        token k by a gather over the running count of image-token ids, not by a boolean index (whose result
        shape is read on the host). The prompt holds exactly as many image-token ids as there are image tokens
        (``GrootPolicy.write_instruction`` checks it); the count is clamped so that no index leaves the table."""
        x = self.language_model.model.embed_tokens(input_ids)
        c = x.shape[-1]
        tokens = image_tokens.reshape(-1, c)
        rows = input_ids == self.sizes.image_token_id
        order = (rows.reshape(-1).cumsum(0) - 1).clamp(0, tokens.shape[0] - 1)
        written = tokens.index_select(0, order).view_as(x)
        return torch.where(rows.unsqueeze(-1), x * 0.0 + written, x)

    def rope_table(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` (1, length, head_dim) of positions 0 .. length - 1, as ``features`` makes them."""
        return rope(torch.arange(length, device=device).unsqueeze(0), self.sizes.text, dtype)

    def features(self, embeddings: Tensor, rope_table: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """The cut language model over one prompt (``exact``: unpadded; ``fast``: right-padded, module doc):
        (B, T, width) after its final norm. ``rope_table``: ``rope_table(T)`` made beforehand, or None."""
        lm = self.language_model.model
        if rope_table is None:
            rope_table = self.rope_table(embeddings.shape[1], embeddings.device, embeddings.dtype)
        cos, sin = rope_table
        x = embeddings
        for layer in lm.layers:
            x = layer(x, cos, sin)
        return lm.norm(x)

    def forward(self, input_ids: Tensor, pixels: Tensor) -> Tensor:
        return self.features(self.embed(input_ids, self.image_tokens(pixels)))


class EagleBackbone(nn.Module):
    """``backbone``: the Eagle model and ``eagle_linear`` (Identity when ``project_to_dim`` is None, as published)."""

    def __init__(self, s: EagleSizes, project_to_dim: int | None) -> None:
        super().__init__()
        self.eagle_model = EagleModel(s)
        # LeRobot hard-codes the input width to 2048, Qwen3-1.7B's
        self.eagle_linear = nn.Linear(2048, project_to_dim) if project_to_dim is not None else nn.Identity()

    def forward(self, input_ids: Tensor, pixels: Tensor) -> Tensor:
        return self.eagle_linear(self.eagle_model(input_ids, pixels))


#: checkpoint keys LeRobot saves that GR00T never reads: the SigLIP pooling head and the LLM's vocabulary head
UNUSED_KEY_PARTS = (".vision_model.vision_model.head.", ".language_model.lm_head.")
EMBED = "eagle_model.language_model.model.embed_tokens.weight"
LM_HEAD = "eagle_model.language_model.lm_head.weight"


def backbone_weights(weights: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The backbone's state dict from a checkpoint's tensors under ``prefix`` (``_groot_model.backbone.``).

    Qwen3-1.7B ties its embedding to its vocabulary head, and safetensors keeps one name of a shared tensor:
    LeRobot's files hold ``lm_head.weight`` and no ``embed_tokens.weight``, so the embedding is read from there."""
    mine = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    if EMBED not in mine and LM_HEAD in mine:
        mine[EMBED] = mine[LM_HEAD]
    return {k: v for k, v in mine.items() if not any(part in "." + k for part in UNUSED_KEY_PARTS)}
