"""Real-Time Chunking guidance for flow-matching policies (Black, Galliker, Levine 2025), as device math.

Why: a chunk planned while the robot keeps executing the previous one arrives
``delay`` steps late, and simply replacing the old chunk jumps. RTC treats the new
chunk as inpainting: at every denoising step the velocity is corrected so that
the predicted clean chunk ``x1 = x_t - t v_t`` agrees with the actions of the
previous chunk that are still to run, fully over the first ``delay`` steps,
fading out toward the execution horizon.

The correction, as LeRobot 0.4.4 computes it: ``RTCProcessor.denoise_step`` calls
``torch.autograd.grad(x1_t, x_t, err)``, but it evaluates ``v_t`` before it sets
``x_t.requires_grad_``, so ``v_t`` is a constant to autograd and the
vector-Jacobian product is the identity: the correction is the weighted error
itself. We compute that closed form (no backward pass, no autograd inside a
captured graph), equal to LeRobot's to the last bit on the same inputs
(``test/test_rtc.py``). The paper's full product (through the network's Jacobian)
would cost a backward pass per denoising step.

The plan's side has fixed shapes and reads the leftover's length and the weights
from tensors, so a guided plan has one shape (one CUDA graph) whatever they are;
the weights themselves are made on the host when the plan is launched.
The same fields as LeRobot 0.4.4's ``RTCConfig`` / ``RTCProcessor``:
``execution_horizon``, ``prefix_attention_schedule``, ``max_guidance_weight``,
``inference_delay`` (``Guidance``).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy
import torch
from torch import Tensor

from flashrt_ros.models.policy_interface import Guidance

SCHEDULES = ("zeros", "ones", "linear", "exp")


def prefix_weights(delay: int, horizon: int, total: int, schedule: str) -> Tensor:
    """The per-step guidance weights ``(total,)`` on the host: 1 before ``start = min(delay, horizon)``,
    then the schedule's fall to 0 at ``horizon``, 0 after: LeRobot's ``get_prefix_weights`` with the
    same torch calls (``linspace`` rounds differently in its vectorised and scalar paths, so the
    same calls are what makes the weights equal to the bit). The planner copies them to the device."""
    if schedule not in SCHEDULES:
        raise ValueError(f"prefix attention schedule must be one of {SCHEDULES}, got {schedule!r}")
    start = min(delay, horizon)
    if schedule == "zeros":
        weights = torch.zeros(total)
        weights[:start] = 1.0
        return weights
    if schedule == "ones":
        weights = torch.ones(total)
        weights[horizon:] = 0.0
        return weights
    span = total - max(total - horizon, 0) - start
    ramp = torch.linspace(1, 0, span + 2)[1:-1] if horizon > start and span > 0 else torch.tensor([])
    if schedule == "exp":
        ramp = ramp * torch.expm1(ramp).div(math.e - 1)
    return torch.cat([torch.ones(min(start, total)), ramp, torch.zeros(max(total - horizon, 0))])[:total]


def guidance_weight(time: float, max_weight: float) -> float:
    """``min(c / r^2, max_weight)`` with ``tau = 1 - time``, in float32 as LeRobot computes it (its
    infinities at ``tau = 0`` clamped to ``max_weight``), returned as a host float. Why numpy float32:
    the same IEEE float32 operations as LeRobot's torch ones, computed without touching a tensor, so a
    captured step body never reads the host and a CUDA graph takes the weight as a constant."""
    f32 = numpy.float32
    max_w = f32(max_weight)
    tau = f32(1 - time)
    one_minus_tau = f32(1) - tau
    one_minus_tau_sq = one_minus_tau * one_minus_tau
    with numpy.errstate(divide="ignore", invalid="ignore"):
        inv_r2 = (one_minus_tau_sq + tau * tau) / one_minus_tau_sq
        c = numpy.nan_to_num(one_minus_tau / tau, posinf=max_w)
        weight = numpy.nan_to_num(c * inv_r2, posinf=max_w)
    return float(min(weight, max_w))


def guided_velocity(x: Tensor, time: float, v: Tensor, target: Tensor, weights: Tensor,
                    max_weight: float) -> Tensor:
    """The RTC-corrected velocity ``v - w * (target - (x - time * v)) * weights`` at ``x`` (flow time
    ``time``, 1 = noise; ``v`` the network's velocity there). ``target``: the previous chunk's
    leftover, zero-padded to ``x``'s shape; ``weights``: per step (``prefix_weights``)."""
    x1 = x - time * v
    correction = (target - x1) * weights[:, None]
    # a host float (the float32 weight exactly): multiplying by it is the same float32 product as by a
    # 0-d tensor, and a CUDA graph captures it as a constant (a host tensor copied in could not be captured)
    return v - guidance_weight(time, max_weight) * correction


def guided_rising_velocity(x: Tensor, t: float, v: Tensor, target: Tensor, weights: Tensor,
                           max_weight: float) -> Tensor:
    """``guided_velocity`` for a flow that rises from noise at ``t = 0`` to the actions at 1 (``x + dt v``,
    GR00T's frame): the same correction in π's frame (time ``1 - t``, velocity ``-v``) and mapped back.
    Why a mapping and not a second formula: negation is exact, so this is LeRobot's ``RTCProcessor`` to the
    bit when it is given ``1 - t`` and ``-v``; the predicted clean chunk is ``x + (1 - t) v`` in both frames."""
    return -guided_velocity(x, 1.0 - t, -v, target, weights, max_weight)


def leftover_target(actions: Tensor, left: Tensor, rows: int, cols: int) -> Tensor:
    """The previous chunk's actions still to run, ``actions[refill - left:]``, zero-padded to
    ``(rows, cols)`` with fixed shapes (``left``: an int64 device scalar)."""
    refill = actions.shape[0]
    n = left.to(torch.int64).clamp(0, min(refill, rows))
    i = torch.arange(rows, device=actions.device)
    taken = actions.index_select(0, (refill - n + i).clamp(0, refill - 1))
    target = torch.where((i < n)[:, None], taken, 0.0)
    return torch.nn.functional.pad(target, (0, cols - actions.shape[1]))


def integrate_flow(noise: Tensor, num_steps: int, velocity: Callable[[Tensor, int], Tensor],
                   guide: Guidance | None = None) -> Tensor:
    """The chunk at flow time 0: ``num_steps`` Euler steps from ``noise`` (time 1) with LeRobot's times
    ``1 + s dt``, ``dt = -1 / num_steps`` (Python floats, as its ``sample_actions`` forms them).
    ``velocity(x, s)``: the network's velocity at step ``s``; ``guide``: each one corrected by Real-Time
    Chunking toward the leftover, as LeRobot's ``RTCProcessor.denoise_step`` does with the same ``time``.
    Why shared: SmolVLA and π0 / π0.5 run this same loop (and must stay bit-equal to LeRobot's)."""
    dt = -1.0 / num_steps
    x = noise
    if guide is not None:
        target = leftover_target(guide.actions, guide.left, x.shape[0], x.shape[1])
    for s, time in enumerate(flow_times(num_steps)):
        v = velocity(x, s)
        if guide is not None:
            v = guided_velocity(x, time, v, target, guide.weights, guide.max_weight)
        x = x + dt * v
    return x


def flow_times(num_steps: int) -> list[float]:
    """The Euler steps' flow times ``1 + s dt`` (``dt = -1 / num_steps``) as LeRobot's ``sample_actions``
    forms them: the policies embed them (in float32) once, ``integrate_flow`` guides with them."""
    dt = -1.0 / num_steps
    return [1.0 + s * dt for s in range(num_steps)]
