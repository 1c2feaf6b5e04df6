"""SmolVLA's network (SmolVLM2 vision encoder + connector, truncated text model, action expert), pure torch.

Why our own code: LeRobot builds it from transformers' ``SmolVLMForConditionalGeneration``
and a ``LlamaModel`` and keeps the VLM prefix KV in a Python dict rebuilt every
chunk; the runtime needs the prefix KV in fixed arena buffers (a capsule must
hold it) and no transformers at run time. Module and parameter names are
LeRobot's (``model.vlm_with_expert.vlm.model.vision_model...``), so its
``model.safetensors`` loads strictly. The arithmetic follows LeRobot 0.4.4's
``smolvlm_with_expert.py`` (its own RoPE with wavelength 10 000, float32 RMSNorm,
attention with float32 scores), so fp32 results agree to rounding.

Attention pattern of the action expert (``attention_mode == "cross_attn"``):
layer ``i`` of the expert is a *self-attention* layer when ``i % self_attn_every_n_layers == 0``:
its queries attend to the prefix KV of VLM layer ``i`` followed by its own causal
action-token keys; otherwise it is a *cross-attention* layer: it projects the
(RoPE'd) prefix keys and values of VLM layer ``i`` with its own ``k_proj`` /
``v_proj`` and attends to those only, with positions restarting at 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.siglip import VisionModel
from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import VLMSizes
from flashrt_ros.models.llama import RMSNorm


def expert_intermediate(hidden: int, ffn_multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's ``get_intermediate_size`` for the action expert's MLP."""
    h = int(ffn_multiplier * int(2 * hidden / 3))
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


# --- shared pieces (RMSNorm is Llama's: ``models.llama.RMSNorm``) -------------------------

def rope(x: Tensor, positions: Tensor, max_wavelength: float = 10_000.0) -> Tensor:
    """LeRobot's ``apply_rope`` (computed in float32): ``x (L, H, D)``, ``positions (L,)``.

    Not ``ops.rope``: LeRobot divides the positions by ``wavelength ** (2i / D)`` (not a
    multiply by an inverse frequency, whatever the VLM config's ``rope_theta``), and
    rotates in float32; the same operations keep fp32 parity at rounding level."""
    dtype, half = x.dtype, x.shape[-1] // 2
    x = x.to(torch.float32)
    cos, sin = rope_tables(positions, x.shape[-1], max_wavelength)
    sin, cos = sin[:, None, :], cos[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


def rope_tables(positions: Tensor, head_dim: int, max_wavelength: float = 10_000.0) -> tuple[Tensor, Tensor]:
    """``rope``'s cos / sin ``(L, head_dim / 2)`` in float32 at ``positions``, LeRobot's formula (the fast
    numerics' row kernel rotates with them)."""
    exponents = (2.0 / head_dim) * torch.arange(head_dim // 2, dtype=torch.float32, device=positions.device)
    radians = positions[:, None].to(torch.float32) / (max_wavelength ** exponents)[None, :]
    return torch.cos(radians), torch.sin(radians)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, n_kv_heads: int) -> Tensor:
    """Grouped-query attention with float32 scores: ``q (L, H, D)``, ``k, v (S, Hkv, D)``,
    boolean ``mask (L, S)`` -> ``(L, H * D)``. Every query row must see at least one key."""
    L, H, D = q.shape
    group = H // n_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(torch.float32).transpose(0, 1), k.to(torch.float32).permute(1, 2, 0)) * D ** -0.5
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = F.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v.transpose(0, 1)).transpose(0, 1).reshape(L, H * D)


class LlamaAttention(nn.Module):
    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, kv_in: int | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(kv_in or hidden, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(kv_in or hidden, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """One decoder layer (names as transformers' ``LlamaDecoderLayer``); the attention runs outside."""

    def __init__(self, hidden: int, intermediate: int, s: VLMSizes, kv_in: int | None = None) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(hidden, s.text_heads, s.text_kv_heads, s.head_dim, kv_in)
        self.mlp = LlamaMLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, s.rms_norm_eps)

    def finish(self, residual: Tensor, attn: Tensor) -> Tensor:
        """Output projection, residual, MLP, residual."""
        x = self.self_attn.o_proj(attn.to(self.self_attn.o_proj.weight.dtype)) + residual
        return self.mlp(self.post_attention_layernorm(x)) + x


# --- connector (the vision encoder before it: ``siglip.VisionModel``) -------------------

class ModalityProjection(nn.Module):
    def __init__(self, s: VLMSizes) -> None:
        super().__init__()
        self.proj = nn.Linear(s.vision_hidden * s.scale_factor ** 2, s.text_hidden, bias=False)


class Connector(nn.Module):
    """Pixel shuffle (``scale_factor``) and a linear projection into the text width."""

    def __init__(self, s: VLMSizes) -> None:
        super().__init__()
        self.scale_factor = s.scale_factor
        self.modality_projection = ModalityProjection(s)

    def forward(self, x: Tensor) -> Tensor:
        return self.modality_projection.proj(pixel_shuffle(x, self.scale_factor))


def pixel_shuffle(x: Tensor, r: int) -> Tensor:
    """SmolVLM's pixel shuffle: ``(B, N, D)`` patch features -> ``(B, N / r^2, D r^2)`` (each ``r x r`` block
    of patches becomes one token)."""
    B, N, D = x.shape
    side = int(N ** 0.5)
    x = x.view(B, side, side // r, D * r).permute(0, 2, 1, 3)
    x = x.reshape(B, side // r, side // r, D * r * r).permute(0, 2, 1, 3)
    return x.reshape(B, N // (r * r), D * r * r)


# --- the module tree LeRobot saves ------------------------------------------------

class TextModel(nn.Module):
    def __init__(self, s: VLMSizes, n_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.text_hidden)
        self.layers = nn.ModuleList(LlamaLayer(s.text_hidden, s.text_intermediate, s) for _ in range(n_layers))
        self.norm = RMSNorm(s.text_hidden, s.rms_norm_eps)        # in the checkpoint; the prefix output is unused


class VLMInner(nn.Module):
    def __init__(self, s: VLMSizes, n_layers: int) -> None:
        super().__init__()
        self.vision_model = VisionModel(s.siglip, s.image_size, bucketed=True, act=s.vision_act)
        self.connector = Connector(s)
        self.text_model = TextModel(s, n_layers)


class VLM(nn.Module):
    def __init__(self, s: VLMSizes, n_layers: int) -> None:
        super().__init__()
        self.model = VLMInner(s, n_layers)


class Expert(nn.Module):
    """The action expert: Llama layers of width ``expert_hidden``; cross layers read the VLM's KV width."""

    def __init__(self, s: VLMSizes, hidden: int, n_layers: int, cross: list[bool]) -> None:
        super().__init__()
        kv_width = s.text_kv_heads * s.head_dim
        self.layers = nn.ModuleList(LlamaLayer(hidden, expert_intermediate(hidden), s, kv_width if c else None)
                                    for c in cross)
        self.norm = RMSNorm(hidden, s.rms_norm_eps)


class VLMWithExpert(nn.Module):
    def __init__(self, s: VLMSizes, n_vlm_layers: int, expert_hidden: int, n_expert_layers: int,
                 cross: list[bool]) -> None:
        super().__init__()
        self.vlm = VLM(s, n_vlm_layers)
        self.lm_expert = Expert(s, expert_hidden, n_expert_layers, cross)
