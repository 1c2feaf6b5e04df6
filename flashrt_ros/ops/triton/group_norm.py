"""GroupNorm, Mish and what follows them in a Diffusion Policy UNet block, in one launch.

Why: at batch 1 and a horizon of 16 each of the UNet's 27 conv blocks is
followed by a GroupNorm (three to four kernels), a Mish, and either the FiLM
modulation or the residual add; ten denoising steps make ~1,900 kernels of a
few microseconds each, more device time than the convolutions. One program per
(batch, group) holds the group's ``C / G * T`` values, computes the float32
statistics, applies the affine, Mish, then FiLM (``scale * y + bias`` or
``y + bias``) or the residual, and rounds once to the output dtype (the torch
reference in ``ops.group_norm`` rounds after each op; the two differ by those
roundings only).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrt_ros.ops.triton import next_power_of_2


@triton.jit
def _group_norm_mish_kernel(x_ptr, w_ptr, b_ptr, film_ptr, res_ptr, out_ptr, C, T, G, film_stride, eps,
                            FILM: tl.constexpr, FILM_SCALE: tl.constexpr, RESIDUAL: tl.constexpr,
                            BLOCK: tl.constexpr):
    pid = tl.program_id(0)                  # batch * G + group
    batch, group = pid // G, pid % G
    cg = C // G
    n = cg * T
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    base = batch * C * T + group * n
    x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n
    ch = group * cg + offs // T
    w = tl.load(w_ptr + ch, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + ch, mask=mask, other=0.0).to(tl.float32)
    y = d * tl.rsqrt(var + eps) * w + b
    e = tl.exp(tl.minimum(y, 20.0))         # mish(y) = y * tanh(softplus(y)) = y * n / (n + 2), n = e^y (e^y + 2)
    m = e * (e + 2.0)
    y = tl.where(y > 20.0, y, y * m / (m + 2.0))
    if FILM:
        bias_off = C if FILM_SCALE else 0
        fb = tl.load(film_ptr + batch * film_stride + bias_off + ch, mask=mask, other=0.0).to(tl.float32)
        if FILM_SCALE:
            fs = tl.load(film_ptr + batch * film_stride + ch, mask=mask, other=0.0).to(tl.float32)
            y = fs * y + fb
        else:
            y = y + fb
    if RESIDUAL:
        y = y + tl.load(res_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + base + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def group_norm_mish(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int, eps: float, *,
                    film: torch.Tensor | None = None, film_scale: bool = False,
                    residual: torch.Tensor | None = None) -> torch.Tensor:
    """``mish(group_norm(x))``, then ``+ film`` / ``film[:, :C] * . + film[:, C:]``, then ``+ residual``.

    ``x`` ``(B, C, T)``; ``film`` ``(B, C or 2C, 1)``; ``residual`` like ``x``. Returns a new tensor.
    """
    B, C, T = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    film_t = film.reshape(B, -1).contiguous() if film is not None else x
    res = residual.contiguous() if residual is not None else x
    block = next_power_of_2(C // groups * T)
    _group_norm_mish_kernel[(B * groups,)](
        x, weight, bias, film_t, res, out, C, T, groups, film_t.stride(0) if film is not None else 0, eps,
        FILM=film is not None, FILM_SCALE=film_scale, RESIDUAL=residual is not None, BLOCK=block,
        num_warps=4 if block <= 1024 else 8)
    return out
