"""DDPM and DDIM reverse steps as fixed per-step coefficients (our math, diffusers' step functions).

Why precomputed: the denoising loop runs a fixed number of steps with known
timesteps, so every scheduler scalar (alpha products, posterior coefficients,
variance) is computed once on the host, in float32 exactly as diffusers 0.35
computes it, and a step is a few fused multiply-adds on the device: the whole
loop is capturable and reproduces ``DDPMScheduler.step`` /
``DDIMScheduler.step`` (``eta = 0``) for ``epsilon`` and ``sample`` prediction.

Timesteps: "leading" spacing (diffusers' default): ``t_j = (K - 1 - j) * (T // K)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from flashrt_ros.runtime.errors import InvalidArgument


def betas_for(schedule: str, steps: int, beta_start: float, beta_end: float) -> Tensor:
    """The training beta schedule (float32), as diffusers builds it."""
    if schedule == "linear":
        return torch.linspace(beta_start, beta_end, steps, dtype=torch.float32)
    if schedule == "scaled_linear":
        return torch.linspace(beta_start ** 0.5, beta_end ** 0.5, steps, dtype=torch.float32) ** 2
    if schedule == "squaredcos_cap_v2":
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        return torch.tensor([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999)
                             for i in range(steps)], dtype=torch.float32)
    raise InvalidArgument(f"beta_schedule {schedule!r}: use linear, scaled_linear or squaredcos_cap_v2")


@dataclass(frozen=True)
class StepCoefficients:
    """One reverse step ``x_t -> x_{t-1}`` as ``prev = a * x0_hat + b * x + sigma * z``.

    ``x0_hat`` is the clipped prediction of the clean sample; for DDIM the
    direction term uses the (unclipped) epsilon: ``prev = a * x0_hat + b * eps``.
    """

    timestep: int
    sqrt_alpha_prod: float         # for x0_hat from epsilon
    sqrt_beta_prod: float
    coef_x0: float
    coef_x: float                  # DDPM: coefficient of x_t; DDIM: coefficient of eps
    sigma: float                   # DDPM noise scale (0 on the last step and for DDIM)


def reverse_steps(kind: str, *, num_train_timesteps: int, num_inference_steps: int, beta_schedule: str,
                  beta_start: float, beta_end: float) -> list[StepCoefficients]:
    """The coefficients of each of the ``num_inference_steps`` reverse steps, in execution order."""
    if kind not in ("DDPM", "DDIM"):
        raise InvalidArgument(f"noise_scheduler_type {kind!r}: use DDPM or DDIM")
    if not 0 < num_inference_steps <= num_train_timesteps:
        raise InvalidArgument(f"num_inference_steps must be in [1, {num_train_timesteps}]")
    alphas_cumprod = torch.cumprod(1.0 - betas_for(beta_schedule, num_train_timesteps, beta_start, beta_end), 0)
    one = torch.tensor(1.0)
    ratio = num_train_timesteps // num_inference_steps
    out = []
    for j in range(num_inference_steps):
        t = (num_inference_steps - 1 - j) * ratio
        prev_t = t - ratio
        a_t = alphas_cumprod[t]
        a_prev = alphas_cumprod[prev_t] if prev_t >= 0 else one
        b_t, b_prev = 1 - a_t, 1 - a_prev
        if kind == "DDPM":
            alpha_t = a_t / a_prev
            beta_cur = 1 - alpha_t
            coef_x0 = (a_prev ** 0.5 * beta_cur) / b_t
            coef_x = alpha_t ** 0.5 * b_prev / b_t
            variance = torch.clamp(b_prev / b_t * beta_cur, min=1e-20)
            sigma = float(variance ** 0.5) if t > 0 else 0.0
        else:
            coef_x0 = a_prev ** 0.5
            coef_x = (1 - a_prev) ** 0.5
            sigma = 0.0
        out.append(StepCoefficients(t, float(a_t ** 0.5), float(b_t ** 0.5), float(coef_x0), float(coef_x), sigma))
    return out


def reverse_step(kind: str, prediction_type: str, c: StepCoefficients, model_output: Tensor, x: Tensor,
                 noise: Tensor | None, clip: float | None) -> Tensor:
    """``x_{t-1}`` from ``x_t`` and the network output (``noise`` is used only where ``c.sigma > 0``)."""
    if prediction_type == "epsilon":
        x0 = (x - c.sqrt_beta_prod * model_output) / c.sqrt_alpha_prod
        eps = model_output
    elif prediction_type == "sample":
        x0 = model_output
        eps = (x - c.sqrt_alpha_prod * x0) / c.sqrt_beta_prod if kind == "DDIM" else None
    else:
        raise InvalidArgument(f"prediction_type {prediction_type!r}: use epsilon or sample")
    if clip is not None:
        x0 = x0.clamp(-clip, clip)
    if kind == "DDIM":
        return c.coef_x0 * x0 + c.coef_x * eps
    prev = c.coef_x0 * x0 + c.coef_x * x
    return prev + c.sigma * noise if c.sigma > 0 else prev
