"""Train the small hybrid model the speculative-decoding checks need, on this CPU, in a few minutes.

Why: speculative decoding is proven only on a model whose next token depends on its layers and whose MTP head
predicts something. Seeded random weights give neither (flat logits, whose bf16 near-ties flip between a 4-token
verify and a 1-token step; or, with the permutation read-out, a next token that ignores every layer, so a broken
rollback still matches plain decoding). This trains the Qwen3-Next layout at a tiny size (Gated DeltaNet and
full-attention layers, a sparse MoE with a shared expert in every layer, an untied head) together with its MTP
head (``test/hybrid_reference.ReferenceMTP``: transformers' own blocks) on bytes of text Python itself ships (the
docstrings of a fixed list of standard-library modules), and saves it as a Qwen3-Next checkpoint
(``config.json``, ``model.safetensors`` with the ``mtp.*`` tensors, ``training.json``) that
``flashrt_ros.models.hybrid.load_hybrid_checkpoint`` reads.

Loss: cross-entropy of the main model's next byte plus that of the MTP head's byte after it (the head sees the
main model's final hidden state at ``t`` and the embedding of byte ``t+1``, predicts ``t+2``).

    python tools/train_tiny_hybrid.py --out test/data/tiny_hybrid_trained [--steps 400]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))            # the MTP reference (transformers' blocks)

#: the standard-library modules whose docstrings (module, then its public classes and functions) are the corpus
CORPUS_MODULES = ("json", "re", "collections", "itertools", "functools", "pathlib", "argparse", "dataclasses",
                  "typing", "logging", "datetime", "decimal", "fractions", "statistics", "random", "string",
                  "textwrap", "difflib", "heapq", "bisect", "contextlib", "enum", "inspect", "csv", "shutil",
                  "tempfile", "glob", "fnmatch", "os", "io", "calendar", "operator", "copy", "pprint",
                  "traceback", "warnings", "weakref", "queue", "sched", "uuid", "hashlib", "base64", "struct",
                  "codecs", "shlex", "configparser", "doctest", "timeit", "ast", "tokenize", "platform",
                  "zipfile", "tarfile", "threading", "subprocess", "socket", "email.message", "http.client",
                  "urllib.parse", "xml.etree.ElementTree", "sqlite3", "unittest")
#: ids are ``flashrt_ros.models.tokenizer.ByteTokenizer``'s (3 control tokens, then the bytes): a checkpoint
#: directory without tokenizer files is served with it, so the node runs this model on text
OFFSET, VOCAB = 3, 259


def corpus(limit_bytes: int) -> bytes:
    """The docstrings, module by module, as UTF-8 bytes (deterministic for one Python version)."""
    parts: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                parts.append(f"{attr}: {doc}")
    return "\n\n".join(p for p in parts if p).encode("utf-8")[:limit_bytes]


def model_config():
    """The Qwen3-Next layout at a tiny size (4 layers: 3 Gated DeltaNet, 1 full attention; MoE everywhere)."""
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=96, num_hidden_layers=4, full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96,
        shared_expert_intermediate_size=96, intermediate_size=192, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=2048, tie_word_embeddings=False, norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})


def train(out: Path, steps: int, seconds: float, seed: int, batch: int, context: int, lr: float,
          corpus_bytes: int) -> dict:
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3NextForCausalLM

    from hybrid_reference import ReferenceMTP
    torch.manual_seed(seed)
    text = corpus(corpus_bytes)
    data = torch.tensor(list(text), dtype=torch.long) + OFFSET
    config = model_config()
    config._attn_implementation = "eager"
    model = Qwen3NextForCausalLM(config)
    mtp = ReferenceMTP(config)
    with torch.no_grad():                       # outside a PreTrainedModel nothing initialises the MTP's weights
        for p in mtp.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, config.initializer_range)
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses, t0, step = [], time.perf_counter(), 0
    model.train()
    mtp.train()
    while step < steps and time.perf_counter() - t0 < seconds:
        for group in opt.param_groups:               # cosine decay to a tenth over the planned steps
            group["lr"] = lr * (0.1 + 0.45 * (1 + torch.cos(torch.tensor(step / steps * 3.14159)).item()))
        starts = torch.randint(0, len(data) - context - 2, (batch,), generator=gen)
        ids = torch.stack([data[s:s + context + 2] for s in starts.tolist()])
        out_main = model.model(ids[:, :context])
        hidden = out_main.last_hidden_state                               # final normed, rows t = 0..C-1
        logits = model.lm_head(hidden)
        main_loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:context + 1].reshape(-1))
        embeds = model.model.embed_tokens(ids[:, 1:context + 1])           # byte t+1 for row t
        mtp_logits = model.lm_head(mtp(hidden, embeds))                   # predicts byte t+2
        mtp_loss = F.cross_entropy(mtp_logits.reshape(-1, VOCAB), ids[:, 2:context + 2].reshape(-1))
        loss = main_loss + mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == 1:
            losses.append({"step": step, "seconds": round(time.perf_counter() - t0, 1),
                           "main": round(main_loss.item(), 4), "mtp": round(mtp_loss.item(), 4)})
            print(f"step {step}: main {main_loss.item():.3f} mtp {mtp_loss.item():.3f} nats/byte "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    weights = load_file(str(out / "model.safetensors"))
    weights.update({f"mtp.{name}": t.detach().contiguous() for name, t in mtp.state_dict().items()
                    if not name.startswith("rotary.")})
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    record = {"steps": step, "seconds": round(time.perf_counter() - t0, 1), "batch": batch, "context": context,
              "lr": lr, "seed": seed, "losses": losses, "corpus": {
                  "modules": list(CORPUS_MODULES), "bytes": len(text), "sha256": hashlib.sha256(text).hexdigest(),
                  "python": sys.version.split()[0]},
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "parameters": sum(p.numel() for p in params)}
    (out / "training.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=400, help="optimiser steps")
    ap.add_argument("--seconds", type=float, default=1800.0, help="stop earlier if this much time passed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--corpus-bytes", type=int, default=400_000)
    args = ap.parse_args(argv)
    record = train(args.out, args.steps, args.seconds, args.seed, args.batch, args.context, args.lr,
                   args.corpus_bytes)
    print(json.dumps({k: v for k, v in record.items() if k != "losses"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
