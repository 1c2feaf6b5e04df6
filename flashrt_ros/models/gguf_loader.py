"""Load a Llama-architecture GGUF (llama.cpp format) into our Llama model.

Why these steps:
- every tensor is dequantised to float32 with ``gguf.quants.dequantize`` (Q4_1,
  Q8_0, ... ; F32/F16 pass through), then cast once to the requested dtype;
- llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so its
  interleaved-pair RoPE matches HF's rotate-half RoPE; we undo that permutation
  so the weights are in HF layout and our rotate-half RoPE (and transformers,
  our parity reference) apply unchanged;
- no cache of the dequantised weights: reading + dequantising SmolLM2-135M takes
  a few seconds on two cores, well under the load budget, and a cache would be
  one more thing that can go stale.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flashrt_ros.models.llama import Llama, LlamaConfig, build_llama
from flashrt_ros.models.tokenizer import HFTokenizer, tokenizer_from_gguf_metadata

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass
class GGUFContents:
    """What one GGUF file holds, in our terms."""

    path: str
    metadata: dict[str, Any]
    state_dict: dict[str, torch.Tensor]      # HF LlamaForCausalLM names, float32, HF rope layout
    tensor_types: dict[str, str] = field(default_factory=dict)   # gguf name -> ggml type name


def file_sha256(path: str, chunk: int = 1 << 24) -> str:
    """Content hash of the file: the weight identity used in capsule fingerprints."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Invert llama.cpp's Q/K row permutation (interleaved pairs -> rotate-half halves).

    llama.cpp stores, per head, rows ``(pair j, half h)`` in order ``j*2 + h``;
    HF stores ``h*half + j``. Reshape to ``[heads, half, 2, in]`` and swap axes.
    """
    out_dim = w.shape[0]
    half = out_dim // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Sequential little-endian reads over the file's bytes.

    Why our own: ``gguf.GGUFReader`` wraps every array element of the metadata
    (~100k vocabulary strings and merges here) in a numpy memmap, which took ~9 s
    of a load; plain ``struct`` reads of the same bytes take a fraction of that.
    """

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                width = struct.calcsize(fmt)
                values = list(struct.unpack_from(f"<{n}{fmt[1]}", self.buf, self.pos))
                self.pos += n * width
                return values
            return [self.value(etype) for _ in range(n)]
        return self.scalar(_SCALARS[vtype])


def read_gguf(path: str) -> GGUFContents:
    """Read metadata and every tensor (dequantised to float32) of a llama-architecture GGUF."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(raw))
    if bytes(raw[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
        infos.append((name, dims, GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q")))
    align = int(metadata.get("general.alignment", 32))
    data_start = (cur.pos + align - 1) // align * align

    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    n_heads = int(metadata["llama.attention.head_count"])
    n_kv_heads = int(metadata.get("llama.attention.head_count_kv", n_heads))
    sd: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    for name, dims, qtype, offset in infos:
        types[name] = qtype.name
        block, type_size = GGML_QUANT_SIZES[qtype]
        row_bytes = dims[0] // block * type_size
        rows = [int(d) for d in reversed(dims[1:])]
        start = data_start + offset
        data = raw[start:start + row_bytes * math.prod(rows)].reshape(*rows, row_bytes)
        values = dequantize(data, qtype)
        if values.dtype != np.float32 or not values.flags.writeable or not values.flags.c_contiguous:
            values = np.array(values, dtype=np.float32)  # F32 tensors come back as views of the file
        tensor = torch.from_numpy(values)
        base, _, suffix = name.rpartition(".")
        if base.startswith("blk."):
            _, layer, kind = base.split(".", 2)
            if kind not in _LAYER_TENSORS:
                continue  # e.g. rope_freqs: not used by the architectures we support
            if kind == "attn_q":
                tensor = unpermute_rope_rows(tensor, n_heads)
            elif kind == "attn_k":
                tensor = unpermute_rope_rows(tensor, n_kv_heads)
            sd[f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.{suffix}"] = tensor
        elif base in _GLOBAL_TENSORS:
            sd[f"{_GLOBAL_TENSORS[base]}.{suffix}"] = tensor
    return GGUFContents(path=path, metadata=metadata, state_dict=sd, tensor_types=types)


def llama_config_from_gguf(meta: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> LlamaConfig:
    """Map ``llama.*`` metadata onto LlamaConfig (defaults follow llama.cpp)."""
    if meta.get("llama.rope.scaling.type") not in (None, "none"):
        raise NotImplementedError("rope scaling is not supported")
    n_heads = int(meta["llama.attention.head_count"])
    dim = int(meta["llama.embedding_length"])
    vocab = int(meta.get("llama.vocab_size", state_dict["model.embed_tokens.weight"].shape[0]))
    return LlamaConfig(
        vocab_size=vocab,
        dim=dim,
        n_layers=int(meta["llama.block_count"]),
        n_heads=n_heads,
        n_kv_heads=int(meta.get("llama.attention.head_count_kv", n_heads)),
        intermediate_size=int(meta["llama.feed_forward_length"]),
        head_dim=int(meta.get("llama.attention.key_length", dim // n_heads)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="lm_head.weight" not in state_dict,
        max_position_embeddings=int(meta.get("llama.context_length", 2048)),
    )


def load_gguf_llama(path: str | os.PathLike, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[Llama, HFTokenizer, GGUFContents]:
    """Model (eval mode, on ``device`` in ``dtype``), tokenizer and the raw file contents."""
    contents = read_gguf(os.fspath(path))
    cfg = llama_config_from_gguf(contents.metadata, contents.state_dict)
    model = build_llama(cfg, device=device, dtype=dtype, hf_state_dict=contents.state_dict)
    tokenizer = tokenizer_from_gguf_metadata(contents.metadata)
    return model, tokenizer, contents

