"""The SigLIP vision tower in the ``fast`` numerics: all cameras in one batch, seven kernels a layer.

Why: ``siglip.VisionModel`` runs each camera through 27 layers of separate
q / k / v products, LayerNorms, a GELU and residual adds (about 15 kernels a
layer and camera). Here the cameras are one batch and a layer is: the fused
q / k / v product (with its bias), SDPA on views of it, the output product,
one row kernel that adds the residual and the output bias and takes the next
LayerNorm (``ops.fused_rows.residual_layer_norm``), the first MLP product with
its bias and tanh-GELU in the cuBLAS epilogue (``torch._addmm_activation``), the
second product, whose residual and bias the next layer's row kernel adds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.siglip import VisionLayer, VisionModel
from flashrt_ros.ops.fused_rows import residual_layer_norm


def _gelu_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``gelu_tanh(x W^T + b)`` for rows ``x (..., K)``: one cuBLAS call with the GELU epilogue on CUDA."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.is_cuda:
        out = torch._addmm_activation(bias, rows, weight.t(), use_gelu=True)
    else:
        out = F.gelu(F.linear(rows, weight, bias), approximate="tanh")
    return out.view(*x.shape[:-1], weight.shape[0])


class FastVisionLayer(nn.Module):
    def __init__(self, layer: VisionLayer) -> None:
        super().__init__()
        a = layer.self_attn
        self.heads = a.n_heads
        self.qkv = nn.Parameter(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), requires_grad=False)
        self.qkv_bias = nn.Parameter(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]), requires_grad=False)
        self.out = nn.Parameter(a.out_proj.weight.detach(), requires_grad=False)
        self.out_bias = nn.Parameter(a.out_proj.bias.detach(), requires_grad=False)
        self.norm1, self.norm2 = layer.layer_norm1, layer.layer_norm2
        self.fc1, self.fc2 = layer.mlp.fc1, layer.mlp.fc2
        if layer.mlp.approximate != "tanh":
            raise ValueError("the fast SigLIP layer fuses the tanh GELU only")

    def attention(self, h: Tensor) -> Tensor:
        B, N, W = h.shape
        qkv = F.linear(h, self.qkv, self.qkv_bias).view(B, N, 3, self.heads, W // self.heads)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, W) @ self.out.t()


class FastVisionModel(nn.Module):
    """``forward(pixels (B, 3, H, W)) -> (B, tokens, hidden)``, as ``VisionModel`` (whose layers it takes)."""

    def __init__(self, model: VisionModel) -> None:
        super().__init__()
        self.embeddings, self.post_layernorm = model.embeddings, model.post_layernorm
        self.layers = nn.ModuleList(FastVisionLayer(layer) for layer in model.encoder.layers)
        model.encoder.layers = nn.ModuleList()          # the unfused weights go (no second copy)

    def forward(self, pixels: Tensor, dtype: torch.dtype) -> Tensor:
        x = self.embeddings(pixels.to(self.embeddings.patch_embedding.weight.dtype)).to(dtype)
        first = self.layers[0]
        x, h = residual_layer_norm(x, None, None, first.norm1.weight, first.norm1.bias, first.norm1.eps)
        for i, layer in enumerate(self.layers):
            x, h = residual_layer_norm(x, layer.attention(h), layer.out_bias, layer.norm2.weight, layer.norm2.bias,
                                       layer.norm2.eps)
            y = _gelu_linear(h, layer.fc1.weight, layer.fc1.bias) @ layer.fc2.weight.t()
            after = self.layers[i + 1].norm1 if i + 1 < len(self.layers) else self.post_layernorm
            x, h = residual_layer_norm(x, y, layer.fc2.bias, after.weight, after.bias, after.eps)
        return h
