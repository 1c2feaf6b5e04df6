"""bf16 / fp16 ACT and Diffusion Policy against fp32, on the CPU and (if present) the GPU.

The networks run in the low precision (``cast_networks``); normalisation, the
arena state, the diffusion sample and the scheduler arithmetic stay fp32. The
tolerance is stated relative to the largest fp32 action of the episode. bf16
keeps 8 significant bits (relative rounding 2^-9 per operation), fp16 11: ACT
2 % (bf16) / 0.5 % (fp16), measured 1.0 % / 0.2 % on the CPU; Diffusion 8 % /
2 %, measured 4.4 % / 0.6 %: its DDIM update divides the network's noise
estimate by sqrt(alpha_bar) at the noisy end of the schedule, which amplifies
the network's rounding. Seeds fixed, so the same noise enters both sides.
"""
from __future__ import annotations

import copy

import pytest
import torch

from tiny_lerobot_policies import episode_observations, tiny_act, tiny_diffusion
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.lerobot import cast_networks

def fan_in_scaled(policy: torch.nn.Module) -> torch.nn.Module:
    """Convolution and linear weights rescaled to std 1/sqrt(fan_in), as a trained network keeps them.

    Why: ``randomize_``'s weights let the tiny ResNet's activations grow ~10x per
    convolution (measured 9 -> 1e3 -> 9e3 -> inf in fp16, whose largest value is
    65504); a trained network's batch norm keeps them O(1), and fp16 overflow
    there would be the weights' fault, not the cast's.
    """
    with torch.no_grad():
        for m in policy.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
                w = m.weight
                w.mul_(1.0 / (w[0].numel() ** 0.5 * w.std()))
    return policy


POLICIES = {
    "act_queue": lambda: fan_in_scaled(tiny_act()),
    "act_temporal_ensemble": lambda: fan_in_scaled(tiny_act(ensemble=True)),
    "diffusion_ddim": lambda: fan_in_scaled(tiny_diffusion(scheduler="DDIM")),
}
TOLERANCE = {("act", torch.bfloat16): 0.02, ("act", torch.float16): 0.005,
             ("diffusion", torch.bfloat16): 0.08, ("diffusion", torch.float16): 0.02}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _episode(policy, device: str, obs, tmp, cuda_graph: bool = False) -> torch.Tensor:
    engine = PolicyEngine(policy, device=device, cuda_graph=cuda_graph, directory=str(tmp))
    try:
        return torch.stack([engine.step(o).cpu() for o in obs])
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_low_precision_matches_fp32(name, dtype, device, tmp_path):
    fp32 = POLICIES[name]()
    low = cast_networks(copy.deepcopy(fp32), dtype)
    assert low.norm.float() is low.norm and all(p.dtype == torch.float32 for p in low.norm.buffers())
    obs = episode_observations(fp32, 12, seed=2)
    expected = _episode(fp32, "cpu", obs, tmp_path / "fp32")
    got = _episode(low, device, obs, tmp_path / "low", cuda_graph=device == "cuda")
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    print(f"{name} {dtype} {device}: max error {err:.2e} of the largest action")
    assert err <= TOLERANCE[name.split("_")[0], dtype], f"{name} {dtype} {device}: {err:.3e}"
    assert not torch.equal(got, expected)          # the networks really ran in the low precision


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_kept_tensors_keep_their_exact_float32_values(name):
    """The normalisation statistics (and ACT's ensembling weights) stay float32 with their exact values: no
    round trip through the low precision (``precision.cast_keeping_float32``); the networks are cast."""
    fp32 = POLICIES[name]()
    # the tiny policies have no checkpoint, so an identity normaliser: a statistic bf16 cannot hold stands in
    fp32.norm.register_buffer("mean_probe", torch.tensor([1 / 3, 0.1, 517.3]))
    low = cast_networks(copy.deepcopy(fp32), torch.bfloat16)
    assert not torch.equal(fp32.norm.mean_probe.bfloat16().float(), fp32.norm.mean_probe)
    assert low.norm.mean_probe.dtype == torch.float32 and torch.equal(low.norm.mean_probe, fp32.norm.mean_probe)
    for attr in ("ensemble_weights", "ensemble_weights_cumsum"):
        if hasattr(fp32, attr):
            assert getattr(low, attr).dtype == torch.float32 and torch.equal(getattr(low, attr), getattr(fp32, attr))
    assert any(p.dtype == torch.bfloat16 for p in low.parameters())
