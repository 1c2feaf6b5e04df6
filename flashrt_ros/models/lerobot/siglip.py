"""SigLIP, the vision encoder of SmolVLA (SmolVLM2's) and of π0 / π0.5 (PaliGemma's), pure torch.

Why one module for both: the two towers are the same network under the same
module names (transformers' ``embeddings.patch_embedding``,
``encoder.layers.<i>.self_attn.q_proj``, ``post_layernorm``, ...), so both
checkpoints load strictly into these classes; they differ in their sizes
(``SiglipSizes``), the image side, and the position ids (SmolVLM's bucketed
NaViT ids, PaliGemma's plain ``0..n-1``). Its ``fast`` form: ``siglip_fast``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class SiglipSizes:
    """One SigLIP tower's sizes; the defaults are So400m/14 (PaliGemma's, in the published π0 / π0.5).

    π0's ``PI0Config.vision`` is one; SmolVLA's comes from its VLM's config (``VLMSizes.siglip``)."""

    hidden: int = 1152
    intermediate: int = 4304
    layers: int = 27
    heads: int = 16
    patch_size: int = 14
    eps: float = 1e-6


class VisionEmbeddings(nn.Module):
    """Patches and learned positions: SmolVLM's bucketed ids, or plain ``0..n-1`` (PaliGemma's SigLIP)."""

    def __init__(self, s: SiglipSizes, image_size: int, bucketed: bool) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, s.hidden, s.patch_size, s.patch_size, padding="valid")
        side = image_size // s.patch_size
        self.position_embedding = nn.Embedding(side * side, s.hidden)
        ids = _bucketed_positions(side) if bucketed else torch.arange(side * side)
        self.register_buffer("position_ids", ids, persistent=False)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)
        return x + self.position_embedding(self.position_ids)


def _bucketed_positions(side: int) -> Tensor:
    """The NaViT-style position ids SmolVLM computes for a full image, with its float arithmetic."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    coords = torch.clamp(torch.arange(side, dtype=torch.float32) * (1.0 / torch.tensor([side]))[:, None], max=1.0 - 1e-6)
    buckets = torch.bucketize(coords, boundaries, right=True)[0]
    return (buckets[:, None] * side + buckets[None, :]).reshape(-1)


class VisionAttention(nn.Module):
    def __init__(self, s: SiglipSizes) -> None:
        super().__init__()
        d = s.hidden
        self.n_heads = s.heads
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        h = self.n_heads

        def heads(p: nn.Linear) -> Tensor:
            return p(x).view(B, N, h, D // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(self.q_proj), heads(self.k_proj), heads(self.v_proj))
        return self.out_proj(y.transpose(1, 2).reshape(B, N, D))


class VisionMLP(nn.Module):
    def __init__(self, s: SiglipSizes, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(s.hidden, s.intermediate)
        self.fc2 = nn.Linear(s.intermediate, s.hidden)
        self.approximate = "tanh" if act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class VisionLayer(nn.Module):
    def __init__(self, s: SiglipSizes, act: str) -> None:
        super().__init__()
        self.self_attn = VisionAttention(s)
        self.layer_norm1 = nn.LayerNorm(s.hidden, eps=s.eps)
        self.mlp = VisionMLP(s, act)
        self.layer_norm2 = nn.LayerNorm(s.hidden, eps=s.eps)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, s: SiglipSizes, act: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(s, act) for _ in range(s.layers))


class VisionModel(nn.Module):
    """A SigLIP encoder for one full (un-split) ``image_size`` square image: SmolVLM's (``bucketed`` positions)
    or PaliGemma's (plain positions); ``act``: the MLP's activation as transformers names it."""

    def __init__(self, s: SiglipSizes, image_size: int, *, bucketed: bool, act: str = "gelu_pytorch_tanh") -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(s, image_size, bucketed)
        self.encoder = VisionEncoder(s, act)
        self.post_layernorm = nn.LayerNorm(s.hidden, eps=s.eps)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
