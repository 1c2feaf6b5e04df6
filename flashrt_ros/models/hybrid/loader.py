"""Load a transformers ``Qwen3NextForCausalLM`` checkpoint (config.json + *.safetensors).

The fused matrices of our layers are assembled here, once: transformers groups
the linear layer's q/k/v/z and b/a rows per key head and interleaves query and
gate rows per attention head; we reorder them into contiguous blocks so the
forward only splits. Tensors are read lazily, one at a time, with safetensors
(never pickle), and every checkpoint tensor must be consumed so a mismatched
layout fails loudly. The multi-token-prediction head (``mtp.*``) is loaded into
``model.mtp`` when the model has one (``mtp=True``), else left unread.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import safe_open

from flashrt_ros.models.hybrid.attention import GatedAttention
from flashrt_ros.models.hybrid.block import HybridBlock
from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.models.hybrid.gated_deltanet import GatedDeltaNet
from flashrt_ros.models.hybrid.mlp import SparseMoE, SwiGLU
from flashrt_ros.models.hybrid.model import HybridCausalLM
from flashrt_ros.runtime.errors import InvalidArgument

_IGNORED_PREFIXES = ("mtp.",)


def load_hybrid_checkpoint(path: Path, dtype: torch.dtype = torch.float32,
                           device: torch.device | str = "cpu", *, mtp: bool = False,
                           **config_overrides) -> HybridCausalLM:
    """Build a :class:`HybridCausalLM` from a checkpoint directory written by ``save_pretrained``.

    ``mtp``: also load the multi-token-prediction head (``mtp.*``; InvalidArgument
    if the checkpoint has none).
    """
    path = Path(path)
    config_file = path / "config.json"
    files = sorted(path.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise InvalidArgument(f"{path} needs config.json and *.safetensors")
    cfg = HybridConfig.from_hf_dict(json.loads(config_file.read_text()), **config_overrides)
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    index = {key: h for h in handles for key in h.keys()}
    if mtp:
        check_mtp_layers(index)
    with torch.device(device):
        model = HybridCausalLM(cfg, mtp=mtp)
    model.to(dtype)
    load_hf_state_dict(model, _LazyTensors(index))
    return model.eval()


class _LazyTensors(Mapping[str, torch.Tensor]):
    """A read-on-demand view of the checkpoint's tensors."""

    def __init__(self, index: dict) -> None:
        self._index = index

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._index[key].get_tensor(key)

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


@torch.no_grad()
def load_hf_state_dict(model: HybridCausalLM, sd: Mapping[str, torch.Tensor]) -> None:
    """Copy transformers-named weights into ``model`` (names with or without the ``model.`` prefix)."""
    names = {k.removeprefix("model."): k for k in sd}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in names:
            raise InvalidArgument(f"checkpoint lacks weight {name}")
        used.add(name)
        return sd[names[name]]

    def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise InvalidArgument(f"{name}: checkpoint shape {tuple(value.shape)} != model {tuple(param.shape)}")
        param.copy_(value.to(param.dtype))

    cfg = model.config
    put(model.embed_tokens.weight, take("embed_tokens.weight"), "embed_tokens.weight")
    put(model.norm.weight, take("norm.weight"), "norm.weight")
    if not cfg.tie_word_embeddings:
        put(model.lm_head.weight, take("lm_head.weight"), "lm_head.weight")
    elif "lm_head.weight" in names:
        used.add("lm_head.weight")  # a tied copy saved anyway: same tensor
    for i, block in enumerate(model.layers):
        _load_block(block, f"layers.{i}.", names, take, put, cfg)
    if model.mtp is not None:
        if "mtp.fc.weight" not in names:
            raise InvalidArgument("checkpoint has no multi-token-prediction head (no mtp.* weights): "
                                  "load it without mtp (speculative decoding with the MTP drafter needs them)")
        mtp = model.mtp
        for part in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm"):
            put(getattr(mtp, part).weight, take(f"mtp.{part}.weight"), f"mtp.{part}.weight")
        for i, block in enumerate(mtp.layers):
            _load_block(block, f"mtp.layers.{i}.", names, take, put, cfg)
    ignored = () if model.mtp is not None else _IGNORED_PREFIXES
    left = [n for n in names if n not in used and not n.startswith(ignored)]
    if left:
        raise InvalidArgument(f"checkpoint has weights the model does not use: {sorted(left)[:8]}")


def check_mtp_layers(names: Mapping[str, object]) -> None:
    """Refuse an MTP head of more than one layer (Qwen3-Next ships one; more are not supported)."""
    deeper = sorted(n for n in names if n.startswith("mtp.layers.") and not n.startswith("mtp.layers.0."))
    if deeper:
        raise InvalidArgument(f"MTP heads of more than one layer are not supported (found {deeper[0]})")


Take = Callable[[str], torch.Tensor]
Put = Callable[[torch.Tensor, torch.Tensor, str], None]


def _load_block(block: HybridBlock, p: str, names: Mapping[str, str], take: Take, put: Put,
                cfg: HybridConfig) -> None:
    """One decoder block under prefix ``p`` (``layers.{i}.`` or the MTP head's ``mtp.layers.0.``)."""
    put(block.input_layernorm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm")
    put(block.post_attention_layernorm.weight, take(p + "post_attention_layernorm.weight"),
        p + "post_attention_layernorm")
    if isinstance(block.mixer, GatedAttention):
        _load_attention(block.mixer, lambda n: take(p + "self_attn." + n), put, cfg)
    else:
        _load_gated_deltanet(block.mixer, lambda n: take(p + "linear_attn." + n), put, cfg)
    if isinstance(block.mlp, SparseMoE):
        _load_moe(block.mlp, p + "mlp.", names, take, put, cfg)
    else:
        _load_swiglu(block.mlp, lambda n: take(p + "mlp." + n), put)


def _load_gated_deltanet(m: GatedDeltaNet, take: Take, put: Put, cfg: HybridConfig) -> None:
    nk, groups = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    # transformers: rows grouped per key head as [q dk | k dk | v groups*dv | z groups*dv] and [b groups | a groups]
    qkvz = take("in_proj_qkvz.weight")
    qkvz = qkvz.reshape(nk, 2 * dk + 2 * groups * dv, -1)
    q, k, v, z = qkvz.split([dk, dk, groups * dv, groups * dv], dim=1)
    b, a = take("in_proj_ba.weight").reshape(nk, 2 * groups, -1).split([groups, groups], dim=1)
    hidden = qkvz.shape[-1]
    fused = torch.cat([x.reshape(-1, hidden) for x in (q, k, v, z, b, a)], dim=0)
    put(m.in_proj.weight, fused, "in_proj")
    put(m.conv_weight, take("conv1d.weight").squeeze(1), "conv1d.weight")
    put(m.dt_bias, take("dt_bias"), "dt_bias")
    put(m.A_log, take("A_log"), "A_log")
    put(m.norm.weight, take("norm.weight"), "norm.weight")
    put(m.out_proj.weight, take("out_proj.weight"), "out_proj.weight")


def _load_attention(m: GatedAttention, take: Take, put: Put, cfg: HybridConfig) -> None:
    heads, hd = cfg.num_attention_heads, cfg.head_dim

    def fuse(kind: str) -> torch.Tensor:
        # transformers' q_proj rows per head: [query hd | gate hd]
        qg = take(f"q_proj.{kind}").reshape(heads, 2, hd, -1)
        query, gate = qg[:, 0].reshape(heads * hd, -1), qg[:, 1].reshape(heads * hd, -1)
        parts = [query, gate, take(f"k_proj.{kind}"), take(f"v_proj.{kind}")]
        out = torch.cat([x.reshape(x.shape[0], -1) for x in parts], dim=0)
        return out if kind == "weight" else out.squeeze(-1)

    put(m.wqkv.weight, fuse("weight"), "wqkv.weight")
    put(m.o_proj.weight, take("o_proj.weight"), "o_proj.weight")
    if cfg.attention_bias:
        put(m.wqkv.bias, fuse("bias"), "wqkv.bias")
        put(m.o_proj.bias, take("o_proj.bias"), "o_proj.bias")
    put(m.q_norm.weight, take("q_norm.weight"), "q_norm.weight")
    put(m.k_norm.weight, take("k_norm.weight"), "k_norm.weight")


def _load_swiglu(m: SwiGLU, take: Take, put: Put) -> None:
    put(m.w13.weight, torch.cat([take("gate_proj.weight"), take("up_proj.weight")], dim=0), "w13")
    put(m.w2.weight, take("down_proj.weight"), "down_proj.weight")


def _load_moe(m: SparseMoE, prefix: str, names: Mapping[str, str], take: Callable[[str], torch.Tensor],
              put: Put, cfg: HybridConfig) -> None:
    put(m.router.weight, take(prefix + "gate.weight"), prefix + "gate.weight")
    if prefix + "experts.gate_up_proj" in names:      # transformers >= 5 fused layout
        put(m.gate_up, take(prefix + "experts.gate_up_proj"), prefix + "experts.gate_up_proj")
        put(m.down, take(prefix + "experts.down_proj"), prefix + "experts.down_proj")
    else:                                              # per-expert layout of the released checkpoints
        e = prefix + "experts.{}."
        gate_up = [torch.cat([take(e.format(j) + "gate_proj.weight"), take(e.format(j) + "up_proj.weight")])
                   for j in range(cfg.num_experts)]
        put(m.gate_up, torch.stack(gate_up), prefix + "experts.*.gate/up_proj")
        put(m.down, torch.stack([take(e.format(j) + "down_proj.weight") for j in range(cfg.num_experts)]),
            prefix + "experts.*.down_proj")
    _load_swiglu(m.shared_expert, lambda n: take(prefix + "shared_expert." + n), put)
    put(m.shared_expert_gate.weight, take(prefix + "shared_expert_gate.weight"), prefix + "shared_expert_gate")
