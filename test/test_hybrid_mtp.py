"""The MTP head, loaded from a checkpoint's ``mtp.*`` tensors, computes the published architecture.

transformers ships no Qwen3-Next MTP module (it ignores ``mtp.*`` on load), so the
reference here is the published architecture assembled from transformers' own
Qwen3-Next building blocks: RMSNorm of the next token's embedding and of the main
model's final hidden state, ``fc`` over their concatenation, one full-attention
``Qwen3NextDecoderLayer``, a final RMSNorm, the shared ``lm_head``. The reference
runs the whole sequence at once; ours runs it incrementally over the arena.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from flashrt_ros.models.hybrid import HybridCausalLM, load_hybrid_checkpoint
from hybrid_reference import ReferenceMTP
from test_hybrid_parity import _hf_config as parity_config
from flashrt_ros.runtime.arena import StateArena, core_meta_specs
from flashrt_ros.runtime.errors import InvalidArgument

MAX_CONTEXT = 64
SEQ = 30
REL_TOL = 1e-4          # float32 differences measure ~1e-6; a wrongly loaded norm moves it by >1e-2


def _hf_config(**overrides) -> Qwen3NextConfig:
    """The parity tests' tiny config, with eager attention (the reference passes an explicit causal mask)."""
    config = parity_config(**overrides)
    config._attn_implementation = "eager"
    return config


def _perturb_(module: nn.Module, seed: int) -> None:
    """Noise on every tensor (norms and q/k norms included) so a swapped weight cannot pass."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.add_((0.3 if p.dim() == 1 else 0.05) * torch.randn(p.shape, generator=gen))


def _save_with_mtp(tmp: Path, seed: int, **overrides) -> tuple[Qwen3NextForCausalLM, ReferenceMTP]:
    torch.manual_seed(seed)
    config = _hf_config(**overrides)
    hf = Qwen3NextForCausalLM(config).eval()
    _perturb_(hf, seed)
    hf.save_pretrained(tmp)
    reference = ReferenceMTP(config).eval()
    with torch.no_grad():                      # outside a PreTrainedModel nothing initialises the experts
        for p in reference.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, config.initializer_range)
    _perturb_(reference, seed + 1)
    weights = load_file(tmp / "model.safetensors")
    weights.update({f"mtp.{name}": t.contiguous() for name, t in reference.state_dict().items()
                    if not name.startswith("rotary.")})
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    return hf, reference


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> tuple[Qwen3NextForCausalLM, ReferenceMTP, Path]:
    path = tmp_path_factory.mktemp("qwen3next_mtp")
    hf, reference = _save_with_mtp(path, seed=0)
    return hf, reference, path


@torch.no_grad()
def _reference_logits(hf: Qwen3NextForCausalLM, reference: ReferenceMTP, ids: torch.Tensor) -> torch.Tensor:
    """MTP logits of rows p = 0..n-2 of ``ids`` (each predicts ids[p + 2])."""
    hidden = hf.model(ids[None]).last_hidden_state                 # final normed hidden states
    embeds = hf.model.embed_tokens(ids[None, 1:])
    return hf.lm_head(reference(hidden[:, :-1], embeds))[0]


@torch.no_grad()
def _our_logits(model: HybridCausalLM, ids: torch.Tensor, pieces: list[int]) -> torch.Tensor:
    """Main model then MTP head, fed in consecutive ``pieces`` (the MTP lags one row: it needs token p+1)."""
    arena = StateArena(core_meta_specs() + model.state_specs(MAX_CONTEXT) + model.mtp_state_specs(MAX_CONTEXT))
    hidden, start = [], 0
    for n in pieces:
        hidden.append(model.hidden_states(ids[start:start + n], torch.arange(start, start + n), arena))
        start += n
    hidden = torch.cat(hidden)
    rows, outs = len(ids) - 1, []
    for begin in range(0, rows, 7):              # the head itself in pieces of 7 rows, over its own KV cache
        end = min(begin + 7, rows)
        positions = torch.arange(begin, end)
        outs.append(model.logits(model.mtp_hidden(hidden[begin:end], ids[begin + 1:end + 1], positions, arena)))
    return torch.cat(outs)


def test_mtp_head_matches_the_published_architecture(dense) -> None:
    hf, reference, path = dense
    ours = load_hybrid_checkpoint(path, torch.float32, "cpu", mtp=True, gdn_chunk_size=16)
    ids = torch.randint(0, 256, (SEQ,), generator=torch.Generator().manual_seed(1))
    expected = _reference_logits(hf, reference, ids)
    got = _our_logits(ours, ids, [SEQ])
    assert got.shape == expected.shape == (SEQ - 1, 256)
    assert _rel(got, expected) <= REL_TOL
    stepwise = _our_logits(ours, ids, [1] * SEQ)     # token by token: the same rows
    assert _rel(stepwise, expected) <= REL_TOL


def test_mtp_head_with_a_moe_layer_matches(tmp_path: Path) -> None:
    """Qwen3-Next's released MTP layer is MoE (layer 0's rule: every layer sparse, none MLP-only)."""
    hf, reference = _save_with_mtp(tmp_path, seed=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=48)
    ours = load_hybrid_checkpoint(tmp_path, torch.float32, "cpu", mtp=True, gdn_chunk_size=16)
    assert type(ours.mtp.layers[0].mlp).__name__ == "SparseMoE"
    ids = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(4))
    assert _rel(_our_logits(ours, ids, [8, 12]), _reference_logits(hf, reference, ids)) <= REL_TOL


def test_loader_takes_mtp_weights_only_when_asked_and_refuses_a_missing_or_deeper_head(dense, tmp_path) -> None:
    _, _, path = dense
    plain = load_hybrid_checkpoint(path)
    assert plain.mtp is None and not any(n.startswith("mtp.") for n, _ in plain.named_parameters())
    assert "mtp_layers" not in plain.config_dict()
    assert load_hybrid_checkpoint(path, mtp=True).config_dict()["mtp_layers"] == 1
    weights = load_file(path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_file({k: v for k, v in weights.items() if not k.startswith("mtp.")}, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="no multi-token-prediction head"):
        load_hybrid_checkpoint(tmp_path, mtp=True)
    save_file({**weights, "mtp.layers.1.input_layernorm.weight": torch.zeros(64)}, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="more than one layer"):
        load_hybrid_checkpoint(tmp_path, mtp=True)
    save_file({**weights, "mtp.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="does not use"):
        load_hybrid_checkpoint(tmp_path, mtp=True)
