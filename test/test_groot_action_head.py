"""GR00T N1.5's action head against LeRobot 0.4.4's (`lerobot.policies.groot.action_head`), bit for bit on the CPU.

LeRobot's head is built at a reduced size with its own classes and seeded weights (norms perturbed
too), its state dict loads strictly into ours, and both run the whole flow (the VL self-attention, the
state token, four Euler steps of the DiT with cross-attention on even blocks) from the same noise:
LeRobot draws it with one ``torch.randn`` after our seed, we are handed the same draw.
"""
from __future__ import annotations

import pytest
import torch

from lerobot_reference import lerobot, randomize_

from flashrt_ros.models.lerobot.groot.action_head import DiTSizes, FlowmatchingActionHead, HeadSizes

SIZES = HeadSizes(action_dim=6, action_horizon=16, max_state_dim=10, hidden_size=32, input_embedding_dim=48,
                  backbone_embedding_dim=40, max_num_embodiments=4, num_target_vision_tokens=5, max_seq_len=32,
                  dit=DiTSizes(heads=4, head_dim=12, layers=4, cross_attention_dim=40, output_dim=32),
                  vl_self_attention=DiTSizes(heads=4, head_dim=10, layers=2, cross_attention_dim=None,
                                             interleave_self_attention=False, output_dim=0))


def _reference_config(s: HeadSizes, interleave: bool = True):
    lerobot()
    from lerobot.policies.groot.action_head.flow_matching_action_head import FlowmatchingActionHeadConfig
    return FlowmatchingActionHeadConfig(
        action_dim=s.action_dim, action_horizon=s.action_horizon, max_state_dim=s.max_state_dim,
        hidden_size=s.hidden_size, input_embedding_dim=s.input_embedding_dim,
        backbone_embedding_dim=s.backbone_embedding_dim, max_num_embodiments=s.max_num_embodiments,
        num_target_vision_tokens=s.num_target_vision_tokens, max_seq_len=s.max_seq_len,
        num_inference_timesteps=s.num_inference_timesteps, num_timestep_buckets=s.num_timestep_buckets,
        add_pos_embed=True, use_vlln=True,
        diffusion_model_cfg={"attention_head_dim": s.dit.head_dim, "cross_attention_dim": s.dit.cross_attention_dim,
                             "dropout": 0.2, "final_dropout": True, "interleave_self_attention": interleave,
                             "norm_type": "ada_norm", "num_attention_heads": s.dit.heads, "num_layers": s.dit.layers,
                             "output_dim": s.dit.output_dim, "positional_embeddings": None},
        vl_self_attention_cfg={"attention_head_dim": s.vl_self_attention.head_dim, "dropout": 0.2,
                               "final_dropout": True, "num_attention_heads": s.vl_self_attention.heads,
                               "num_layers": s.vl_self_attention.layers, "positional_embeddings": None})


def _pair(sizes: HeadSizes, seed: int, interleave: bool = True):
    lerobot()                                        # skips (saying how to install) without the reference
    from lerobot.policies.groot.action_head.flow_matching_action_head import FlowmatchingActionHead as Reference
    torch.manual_seed(seed)
    reference = Reference(_reference_config(sizes, interleave)).eval()
    randomize_(reference, seed, scale=0.5)
    ours = FlowmatchingActionHead(sizes).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


def _inputs(sizes: HeadSizes, batch: int, tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, tokens, sizes.backbone_embedding_dim, generator=gen)
    state = torch.rand(batch, 1, sizes.max_state_dim, generator=gen) * 2 - 1
    embodiment = torch.randint(0, sizes.max_num_embodiments, (batch,), generator=gen)
    return features, state, embodiment


def _reference_chunk(reference, features, state, embodiment, noise_seed: int) -> torch.Tensor:
    from transformers.feature_extraction_utils import BatchFeature
    backbone = BatchFeature(data={"backbone_features": features.clone(),
                                  "backbone_attention_mask": torch.ones(features.shape[:2], dtype=torch.bool)})
    torch.manual_seed(noise_seed)
    with torch.no_grad():
        return reference.get_action(backbone, BatchFeature(data={"state": state, "embodiment_id": embodiment}))[
            "action_pred"]


def _noise(sizes: HeadSizes, batch: int, noise_seed: int) -> torch.Tensor:
    torch.manual_seed(noise_seed)
    return torch.randn(batch, sizes.action_horizon, sizes.action_dim)


@pytest.mark.parametrize("batch,tokens,interleave", [(1, 7, True), (3, 11, True), (2, 9, False)])
def test_the_action_chunk_is_lerobots_bit_for_bit(batch, tokens, interleave):
    sizes = SIZES if interleave else HeadSizes(**{**SIZES.__dict__, "dit": DiTSizes(
        **{**SIZES.dit.__dict__, "interleave_self_attention": False})})
    reference, ours = _pair(sizes, seed=batch * 100 + tokens, interleave=interleave)
    features, state, embodiment = _inputs(sizes, batch, tokens, seed=tokens)
    expected = _reference_chunk(reference, features, state, embodiment, noise_seed=7)
    with torch.no_grad():
        got = ours.sample(features, state, embodiment, _noise(sizes, batch, noise_seed=7))
    assert got.shape == (batch, sizes.action_horizon, sizes.action_dim)
    assert torch.equal(got, expected), (got - expected).abs().max()


def test_the_embodiment_selects_its_own_weights_and_the_noise_matters():
    """Power of the parity above: a chunk depends on the embodiment id and on the noise it is handed."""
    reference, ours = _pair(SIZES, seed=3)
    features, state, _ = _inputs(SIZES, 1, 7, seed=1)
    with torch.no_grad():
        a = ours.sample(features, state, torch.tensor([1]), _noise(SIZES, 1, 7))
        b = ours.sample(features, state, torch.tensor([2]), _noise(SIZES, 1, 7))
        c = ours.sample(features, state, torch.tensor([1]), _noise(SIZES, 1, 8))
    assert (a - b).abs().max() > 1e-3 and (a - c).abs().max() > 1e-3
    assert torch.equal(a, _reference_chunk(reference, features, state, torch.tensor([1]), noise_seed=7))


def test_the_flow_times_are_lerobots():
    assert HeadSizes().flow_times() == [0, 250, 500, 750]
    assert HeadSizes(num_inference_timesteps=3).flow_times() == [0, 333, 666]
