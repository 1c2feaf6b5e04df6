"""The UNet's 1-D convolutions (and transposed convolutions) on the CPU as one GEMM with the time steps as rows.

Why: at batch 1 the UNet's convolutions have a handful of time steps (16 down
to 4) and hundreds of channels, so each is a skinny matrix product. torch's
CPU ``conv1d`` runs it as ``weight (out, in*k) @ columns (in*k, T)`` (its
``slow_conv2d`` im2col path), which MKL computes at ~6 GFLOP/s on one core;
the same product the other way round, ``rows (T, in*k) @ weight.T``, runs at
~30 GFLOP/s. Measured on this project's 2-core AVX-512 CI machine, one thread:
a 512->512, k=5 conv at T=4 took 1.80 ms as ``F.conv1d`` and 0.32 ms as rows
(5.7x; 3.3-5.0x for the other large ones, 0.9x for 128 channels at T=16), and
Diffusion Policy's CPU replan (UNet (128, 256, 512), DDIM-10), which spent ~80 %
of its time in ``slow_conv2d``, went from 245 to 134 ms. bf16 gains less (its
``conv1d`` already avoids that path): 469 -> 250 us for the 512->512 conv.

The up-sampling ``ConvTranspose1d`` (k=4, stride 2) fares worse still in
torch's CPU ``slow_conv_transpose2d``: rows times the weight, then the
overlapping columns summed back with ``F.fold``, took 0.11 ms instead of 0.86 ms
(256 channels, T=4) and 1.5 ms instead of 21 ms (1024 channels); the CPU replan
above went from 134 to 122 ms with it (245 ms before either).

Where it pays: the rows form has ~15 us of fixed cost (pad, im2col copy,
transposes), and ``F.conv1d`` is as fast once the output has 16 steps (512->512,
k=5, T=16: 0.62 vs 0.61 ms; 2->512: 12 vs 18 us). So a convolution takes the
rows form when its output has at most ``ROW_STEPS`` (8) steps and its weight at
least ``ROW_WEIGHTS`` (8192) elements (64->64, k=5, T=8: 35 -> 21 us; 16->32,
k=3, T=8: 11 vs 15 us stays), a transposed one when its weight has at least
``ROW_WEIGHTS`` (64 channels, T=8: 34 -> 24 us; 32 channels: 15 vs 18 us stays).

Only the summation order changes (results equal ``F.conv1d`` /
``F.conv_transpose1d`` to float rounding); CUDA keeps cuDNN (``layout.py`` lays
its weights out for it) and anything but a plain zero-padded, ungrouped,
undilated fp32 / bf16 ``nn.Conv1d`` / ``nn.ConvTranspose1d`` falls back to the
module itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROW_DTYPES = (torch.float32, torch.bfloat16)
ROW_STEPS = 8          # a convolution's output steps at most, for the rows form
ROW_WEIGHTS = 8192     # weight elements at least, for the rows form


def conv1d(conv: nn.Module, x: Tensor) -> Tensor:
    """``conv(x)``: on the CPU a plain fp32 / bf16 ``nn.Conv1d`` runs as ``rows_conv1d``, an
    ``nn.ConvTranspose1d`` as ``rows_conv_transpose1d``, where that pays (see above); anything else as itself."""
    kind = type(conv)
    if (x.is_cuda or kind not in (nn.Conv1d, nn.ConvTranspose1d) or x.dtype not in ROW_DTYPES or conv.groups != 1
            or conv.dilation != (1,) or conv.padding_mode != "zeros" or isinstance(conv.padding, str)):
        return conv(x)
    if conv.weight.numel() < ROW_WEIGHTS:
        return conv(x)
    if kind is nn.ConvTranspose1d:
        return conv(x) if conv.output_padding != (0,) else rows_conv_transpose1d(conv, x)
    (k,), (stride,), (pad,) = conv.kernel_size, conv.stride, conv.padding
    if (x.shape[-1] + 2 * pad - k) // stride + 1 > ROW_STEPS:
        return conv(x)
    return rows_conv1d(conv, x)


def rows_conv1d(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """``(B, in, T) -> (B, out, T')`` as ``bias + rows @ weight.T`` with ``rows`` the im2col ``(B*T', in*k)``."""
    (k,), (stride,), (pad,) = conv.kernel_size, conv.stride, conv.padding
    batch, cin, _ = x.shape
    if k == 1 and stride == 1 and pad == 0:
        rows = x.transpose(1, 2).reshape(-1, cin)
    else:
        cols = F.pad(x, (pad, pad)).unfold(2, k, stride)                # (B, in, T', k), a view
        rows = cols.permute(0, 2, 1, 3).reshape(-1, cin * k)            # (B*T', in*k): (in, k) as the weight
    weight = conv.weight.reshape(conv.out_channels, cin * k)            # a view of the contiguous CPU weight
    out = torch.addmm(conv.bias, rows, weight.t()) if conv.bias is not None else rows @ weight.t()
    return out.view(batch, -1, conv.out_channels).transpose(1, 2)


def rows_conv_transpose1d(conv: nn.ConvTranspose1d, x: Tensor) -> Tensor:
    """``(B, in, T) -> (B, out, T')``: ``rows (B*T, in) @ weight (in, out*k)``, each row's ``k`` taps summed
    into the output steps they reach (``F.fold``, i.e. col2im), plus the bias."""
    (k,), (stride,), (pad,) = conv.kernel_size, conv.stride, conv.padding
    batch, cin, steps = x.shape
    cout = conv.out_channels
    cols = x.transpose(1, 2).reshape(-1, cin) @ conv.weight.reshape(cin, cout * k)    # (B*T, out*k)
    cols = cols.view(batch, steps, cout * k).transpose(1, 2)                            # (B, out*k, T)
    length = (steps - 1) * stride - 2 * pad + k
    out = F.fold(cols, (1, length), (1, k), stride=(1, stride), padding=(0, pad)).view(batch, cout, length)
    return out if conv.bias is None else out + conv.bias.view(1, -1, 1)
