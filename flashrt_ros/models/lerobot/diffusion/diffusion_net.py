"""Diffusion Policy's network, pure torch: the image encoder and the 1-D
conditional UNet, as LeRobot's ``DiffusionModel`` names them (its ``model.safetensors`` loads strictly).

Why apart from the policy (``modeling_diffusion.py``): the network is stateless arithmetic
over weights; the policy owns the arena state (observation history, action queue,
noise stream) and the denoising loop that calls this network.

Speed at batch 1 (the UNet reads ~1 GB of fp32 weights per denoising step): the
1-D convolutions read weights stored once in the layout cuDNN wants
(``layout.lay_out_convs``: no per-call weight transposes), each block's GroupNorm,
Mish and FiLM or residual add is one fused kernel on CUDA, and the FiLM
conditioning of all K timesteps is computed in one batch per replan. The
sample and the scheduler arithmetic stay fp32; with bf16 / fp16 weights only
the networks run in the low precision.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.diffusion.configuration_diffusion import DiffusionConfig
from flashrt_ros.models.lerobot.diffusion.conv1d import conv1d
from flashrt_ros.models.lerobot.resnet import ResNetTrunk
from flashrt_ros.ops.group_norm import group_norm_mish


# --- image encoder ----------------------------------------------------------------

def center_crop(x: Tensor, size: tuple[int, int]) -> Tensor:
    """torchvision's ``center_crop`` offsets: ``int(round((H - h) / 2))`` (Python's round-half-to-even)."""
    H, W = x.shape[-2:]
    h, w = size
    top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
    return x[..., top:top + h, left:left + w]


class SpatialSoftmax(nn.Module):
    """Keypoints as the softmax-weighted mean pixel position of each of K 1x1-conv feature maps."""

    def __init__(self, in_shape: tuple[int, int, int], num_kp: int) -> None:
        super().__init__()
        c, h, w = in_shape
        self.nets = nn.Conv2d(c, num_kp, 1)
        self.num_kp, self.hw = num_kp, h * w
        self.register_buffer("pos_grid", torch.zeros(h * w, 2))      # loaded from the checkpoint

    def forward(self, features: Tensor) -> Tensor:
        attention = F.softmax(self.nets(features).reshape(-1, self.hw), dim=-1)
        return (attention @ self.pos_grid).view(-1, self.num_kp, 2)


class RgbEncoder(nn.Module):
    """Resize, center crop (the eval-mode crop; training's random crop is not used at inference),
    ResNet trunk, spatial softmax, linear + ReLU."""

    def __init__(self, c: DiffusionConfig) -> None:
        super().__init__()
        self.resize_shape, self.crop_shape = c.resize_shape, c.crop_shape
        self.backbone = ResNetTrunk(c.vision_backbone, "group" if c.use_group_norm else "batch", named=False)
        hw = c.crop_shape or c.resize_shape or c.image_shape[1:]
        fh, fw = _trunk_out(hw[0]), _trunk_out(hw[1])
        self.pool = SpatialSoftmax((ResNetTrunk.out_channels, fh, fw), c.spatial_softmax_num_keypoints)
        self.feature_dim = 2 * c.spatial_softmax_num_keypoints
        self.out = nn.Linear(self.feature_dim, self.feature_dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.resize_shape is not None:
            x = F.interpolate(x, size=list(self.resize_shape), mode="bilinear", align_corners=False, antialias=True)
        if self.crop_shape is not None:
            x = center_crop(x, self.crop_shape)
        return F.relu(self.out(self.pool(self.backbone(x)).flatten(1)))


def _trunk_out(n: int) -> int:
    """Spatial size after conv1 (s2), maxpool (s2) and three stride-2 stages."""
    n = (n + 2 * 3 - 7) // 2 + 1
    for _ in range(4):
        n = (n + 2 - 3) // 2 + 1
    return n


# --- 1-D conditional UNet ---------------------------------------------------------

class Mish(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.mish(x)


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        half = self.dim // 2
        freq = torch.exp(torch.arange(half, device=x.device) * -(math.log(10000) / (half - 1)))
        emb = x.unsqueeze(-1) * freq.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


def gemm_conv1d(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """``conv(x)`` as one GEMM: im2col copy of ``x`` times the weight flattened as ``(out, k * in)``."""
    (k,), (stride,), (pad,) = conv.kernel_size, conv.stride, conv.padding
    w = conv.weight.permute(0, 2, 1).reshape(conv.out_channels, -1)       # a view when laid out (layout.py)
    cols = F.pad(x, (pad, pad)).unfold(2, k, stride)                       # (B, in, T', k)
    cols = cols.permute(0, 3, 1, 2).reshape(x.shape[0], k * x.shape[1], -1)
    return torch.baddbmm(conv.bias.view(1, -1, 1), w.expand(x.shape[0], -1, -1), cols)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish (``block.0``, ``block.1`` as in LeRobot)."""

    def __init__(self, cin: int, cout: int, k: int, n_groups: int = 8) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, k, padding=k // 2), nn.GroupNorm(n_groups, cout), Mish())

    def forward(self, x: Tensor, film: Tensor | None = None, film_scale: bool = False,
                residual: Tensor | None = None) -> Tensor:
        """conv, then GroupNorm + Mish (+ FiLM, + residual) fused on CUDA (``ops.group_norm``)."""
        return group_norm_mish(conv1d(self.block[0], x), self.block[1], film=film, film_scale=film_scale,
                               residual=residual)


class ResidualBlock1d(nn.Module):
    """Two conv blocks with FiLM conditioning (bias, or scale and bias) between them."""

    def __init__(self, cin: int, cout: int, cond_dim: int, k: int, n_groups: int, film_scale: bool) -> None:
        super().__init__()
        self.film_scale, self.out_channels = film_scale, cout
        self.conv1 = Conv1dBlock(cin, cout, k, n_groups)
        self.cond_encoder = nn.Sequential(Mish(), nn.Linear(cond_dim, 2 * cout if film_scale else cout))
        self.conv2 = Conv1dBlock(cout, cout, k, n_groups)
        self.residual_conv = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor, film: Tensor) -> Tensor:
        """``film``: this block's ``cond_encoder`` output for the step, ``(B, C', 1)`` (``ConditionalUnet1d.films``)."""
        out = self.conv1(x, film=film, film_scale=self.film_scale)
        return self.conv2(out, residual=conv1d(self.residual_conv, x))


class ConditionalUnet1d(nn.Module):
    """LeRobot's ``DiffusionConditionalUnet1d`` (same module names): ``(B, T, A)`` -> ``(B, T, A)``."""

    def __init__(self, c: DiffusionConfig, global_cond_dim: int) -> None:
        super().__init__()
        e = c.diffusion_step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(SinusoidalPosEmb(e), nn.Linear(e, 4 * e), Mish(),
                                                    nn.Linear(4 * e, e))
        kw = dict(cond_dim=e + global_cond_dim, k=c.kernel_size, n_groups=c.n_groups,
                  film_scale=c.use_film_scale_modulation)
        in_out = [(c.action_dim, c.down_dims[0]), *zip(c.down_dims[:-1], c.down_dims[1:])]
        self.down_modules = nn.ModuleList()
        for i, (cin, cout) in enumerate(in_out):
            last = i >= len(in_out) - 1
            self.down_modules.append(nn.ModuleList([
                ResidualBlock1d(cin, cout, **kw), ResidualBlock1d(cout, cout, **kw),
                nn.Identity() if last else nn.Conv1d(cout, cout, 3, 2, 1)]))
        d = c.down_dims[-1]
        self.mid_modules = nn.ModuleList([ResidualBlock1d(d, d, **kw), ResidualBlock1d(d, d, **kw)])
        self.up_modules = nn.ModuleList()
        for i, (cout, cin) in enumerate(reversed(in_out[1:])):
            last = i >= len(in_out) - 1
            self.up_modules.append(nn.ModuleList([
                ResidualBlock1d(2 * cin, cout, **kw), ResidualBlock1d(cout, cout, **kw),
                nn.Identity() if last else nn.ConvTranspose1d(cout, cout, 4, 2, 1)]))
        self.final_conv = nn.Sequential(Conv1dBlock(c.down_dims[0], c.down_dims[0], c.kernel_size),
                                        nn.Conv1d(c.down_dims[0], c.action_dim, 1))

    def residual_blocks(self) -> list[ResidualBlock1d]:
        """Every FiLM-conditioned block, in the order ``run`` uses them."""
        blocks = [b for res1, res2, _ in self.down_modules for b in (res1, res2)] + list(self.mid_modules)
        return blocks + [b for res1, res2, _ in self.up_modules for b in (res1, res2)]

    def films(self, timesteps: Tensor, global_cond: Tensor) -> list[Tensor]:
        """Each block's FiLM parameters for every timestep at once: ``(K, C', 1)`` per block.

        Why batched: the conditioning depends only on the timestep and the
        observation, so one replan computes it for its whole schedule in one
        GEMM per block instead of K.
        """
        dtype = global_cond.dtype
        step = self.diffusion_step_encoder[1:](self.diffusion_step_encoder[0](timesteps).to(dtype))
        cond = torch.cat([step, global_cond.expand(timesteps.shape[0], -1)], dim=-1)
        return [block.cond_encoder(cond).unsqueeze(-1) for block in self.residual_blocks()]

    def run(self, x: Tensor, films: list[Tensor]) -> Tensor:
        """``(B, T, A)`` -> ``(B, T, A)`` with precomputed FiLM parameters (one ``(B, C', 1)`` per block)."""
        x = x.transpose(1, 2)
        film = iter(films)
        skips = []
        for res1, res2, down in self.down_modules:
            x = res2(res1(x, next(film)), next(film))
            skips.append(x)
            x = conv1d(down, x)
        for mid in self.mid_modules:
            x = mid(x, next(film))
        for res1, res2, up in self.up_modules:
            x = conv1d(up, res2(res1(torch.cat((x, skips.pop()), dim=1), next(film)), next(film)))
        return conv1d(self.final_conv[1], self.final_conv[0](x)).transpose(1, 2)

    def forward(self, x: Tensor, timestep: Tensor, global_cond: Tensor) -> Tensor:
        """LeRobot's signature: one timestep ``(B,)`` and ``global_cond (B, G)``."""
        return self.run(x, self.films(timestep, global_cond))


class DiffusionNet(nn.Module):
    """LeRobot's ``DiffusionModel`` module tree: ``rgb_encoder`` (shared or one per camera) and ``unet``."""

    def __init__(self, c: DiffusionConfig) -> None:
        super().__init__()
        self.c = c
        cond = c.state_dim + c.env_state_dim
        if c.cameras:
            if c.use_separate_rgb_encoder_per_camera:
                self.rgb_encoder = nn.ModuleList(RgbEncoder(c) for _ in c.cameras)
                cond += self.rgb_encoder[0].feature_dim * len(c.cameras)
            else:
                self.rgb_encoder = RgbEncoder(c)
                cond += self.rgb_encoder.feature_dim * len(c.cameras)
        self.unet = ConditionalUnet1d(c, cond * c.n_obs_steps)

    def global_cond(self, state: Tensor, images: Tensor | None, env: Tensor | None) -> Tensor:
        """History ``state (S, n)``, ``images (S, cams, 3, H, W)``, ``env (S, m)`` -> ``(1, cond)``."""
        feats = [state]
        if images is not None:
            S, N = images.shape[:2]
            if self.c.use_separate_rgb_encoder_per_camera:
                per_cam = [enc(images[:, i]) for i, enc in enumerate(self.rgb_encoder)]      # N x (S, D)
                feats.append(torch.cat(per_cam, dim=-1))
            else:
                feats.append(self.rgb_encoder(images.flatten(0, 1)).view(S, -1))
        if env is not None:
            feats.append(env)
        return torch.cat(feats, dim=-1).reshape(1, -1)
