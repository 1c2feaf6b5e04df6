"""The measurements of one model at one context length: ours (engine) and transformers'.

Ours, through the public ``LLMEngine`` verbs only:
(a) cold: ``reset``, chunked ``prefill``, ``decode_step`` -> first token (wall clock);
(b) warm: ``snapshot`` after the prefill, decode a few tokens (something else),
    ``restore``, ``decode_step`` -> first token (wall clock);
(d) decode: ``decode_step`` at batch 1 (CUDA-graph replay when enabled) vs the
    weight-read floor;
(e) ``snapshot`` / ``restore`` alone (CUDA events, median of >= 50) vs one flat
    copy of the capsule's bytes.
Correctness: the tokens after a restore equal the tokens of the uninterrupted run.

transformers: one forward over the prompt (``logits_to_keep=1``), its
``past_key_values`` snapshotted and restored with ``copy.deepcopy``. Both
capsules hold the last prompt token's logits (ours in ``meta.logits``; for
transformers we keep a clone beside the cache), so restore -> first token is
restore + sampling on both sides.
"""
from __future__ import annotations

import copy
import inspect
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from flashrt_ros.benchmarks.timing import copy_floor_ms, event_ms, median_event_ms, sync, wall_ms
from flashrt_ros.engine.config import StoreConfig
from flashrt_ros.engine.llm_engine import LLMEngine
from flashrt_ros.models.base import CausalLM, FingerprintInputs
from flashrt_ros.models.tokenizer import ByteTokenizer

CHECK_TOKENS = 4       # tokens compared between the restored and the uninterrupted run
OTHER_TOKENS = 3       # "something else" decoded between snapshot and restore
DECODE_TOKENS = 32     # decode steps timed per context


@dataclass
class RunSettings:
    device: torch.device
    reps: int                 # cold / warm TTFT repetitions (median)
    capsule_reps: int         # snapshot / restore repetitions (median, >= 50 by default)
    prefill_chunk: int
    cuda_graphs: bool
    seed: int


def prompt_ids(vocab_size: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen).to(device)


def _engine(model: CausalLM, context: int, s: RunSettings, fp: FingerprintInputs) -> LLMEngine:
    max_context = context + OTHER_TOKENS + DECODE_TOKENS + 2 * CHECK_TOKENS + 8
    budget = 4 << 30
    return LLMEngine(model, ByteTokenizer(), max_context=max_context, device=s.device,
                     store_config=StoreConfig(device_budget_bytes=budget, host_budget_bytes=64 << 20,
                                              rollback_depth=1),
                     prefill_chunk=s.prefill_chunk, fingerprint_inputs=fp, cuda_graphs=s.cuda_graphs)


def measure_ours(model: CausalLM, context: int, s: RunSettings, fp: FingerprintInputs) -> dict[str, Any]:
    """Rows (a), (b), (d), (e) and the restore correctness check for one context."""
    eng = _engine(model, context, s, fp)
    ids = prompt_ids(model.vocab_size, context, s.seed, torch.device("cpu")).tolist()
    dev = s.device

    def cold() -> int:
        eng.capsules.reset()
        eng.prefill(ids)
        return eng.decode_step(greedy=True)

    warmup_s = wall_ms(cold, dev)[0] / 1e3         # warm-up: compile, autotune, capture prefill/draw graphs
    cold_ms, firsts = [], []
    for _ in range(s.reps):
        ms, token = wall_ms(cold, dev)
        cold_ms.append(ms)
        firsts.append(token)
    uninterrupted = [firsts[-1]] + [eng.decode_step(greedy=True) for _ in range(CHECK_TOKENS - 1)]

    eng.capsules.reset()
    eng.prefill(ids)
    info = eng.capsules.snapshot("bench_prompt", overwrite=True)
    for _ in range(OTHER_TOKENS):                  # graph capture of "decode" happens here
        eng.decode_step(greedy=True)

    def warm() -> int:
        eng.capsules.restore("bench_prompt")
        return eng.decode_step(greedy=True)

    warm_ms = []
    for _ in range(s.reps):
        ms, _ = wall_ms(warm, dev)
        warm_ms.append(ms)
        for _ in range(OTHER_TOKENS):
            eng.decode_step(greedy=True)
    eng.capsules.restore("bench_prompt")
    restored = [eng.decode_step(greedy=True) for _ in range(CHECK_TOKENS)]

    decode_ms = [wall_ms(lambda: eng.decode_step(greedy=True), dev)[0] for _ in range(DECODE_TOKENS)]

    snap_ms = median_event_ms(lambda: eng.capsules.snapshot("bench_probe", overwrite=True), s.capsule_reps, dev)
    restore_ms = median_event_ms(lambda: eng.capsules.restore("bench_prompt"), s.capsule_reps, dev)
    floor_ms = copy_floor_ms(info.nbytes, dev, s.capsule_reps)
    out = {
        "cold_ttft_ms": statistics.median(cold_ms),
        "restore_ttft_ms": statistics.median(warm_ms),
        "decode_ms": statistics.median(decode_ms),
        "capsule_bytes": info.nbytes,
        "snapshot_ms": snap_ms,
        "restore_ms": restore_ms,
        "copy_floor_ms": floor_ms,
        "first_token_match": restored[0] == uninterrupted[0] and len(set(firsts)) == 1,
        "continuation_match": restored == uninterrupted,
        "first_token": uninterrupted[0],
        "warmup_s": warmup_s,
    }
    del eng
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _cache_kwarg(hf: torch.nn.Module) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in 5.x; use whichever this version has."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def _hf_step(hf: torch.nn.Module, ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
    """One transformers forward; returns (last logits [vocab], cache)."""
    out = hf(input_ids=ids.view(1, -1), use_cache=True, logits_to_keep=1, **{_cache_kwarg(hf): cache})
    cache = getattr(out, "cache", None)            # transformers >= 5 names the field ``cache``
    return out.logits[0, -1], cache if cache is not None else out.past_key_values


def measure_hf(hf: torch.nn.Module, vocab_size: int, context: int, s: RunSettings) -> dict[str, Any]:
    """(c): cold prefill -> first token, deepcopy snapshot, deepcopy restore -> first token."""
    dev = s.device
    ids = prompt_ids(vocab_size, context, s.seed, dev)

    def cold() -> tuple[int, torch.Tensor, Any]:
        logits, cache = _hf_step(hf, ids, None)
        return int(logits.argmax().item()), logits, cache

    with torch.no_grad():
        warmup_s = wall_ms(cold, dev)[0] / 1e3     # warm-up (kernel compilation / autotune)
        cold_ms = []
        for _ in range(s.reps):
            ms, (first, logits, cache) = wall_ms(cold, dev)
            cold_ms.append(ms)
        saved_logits = logits.clone()
        snapshot = copy.deepcopy(cache)
        second, _ = _hf_step(hf, torch.tensor([first], device=dev), cache)
        second = int(second.argmax().item())
        snap_ms = statistics.median(event_ms(lambda: copy.deepcopy(snapshot), dev)
                                    for _ in range(max(5, min(s.capsule_reps, 20))))

        def warm() -> tuple[int, Any]:
            live = copy.deepcopy(snapshot)
            return int(saved_logits.argmax().item()), live

        warm_ms = []
        for _ in range(s.reps):
            ms, (token, live) = wall_ms(warm, dev)
            warm_ms.append(ms)
        next_logits, _ = _hf_step(hf, torch.tensor([token], device=dev), live)
        restored = [token, int(next_logits.argmax().item())]
    sync(dev)
    del cache, snapshot, live
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "hf_cold_ttft_ms": statistics.median(cold_ms),
        "hf_snapshot_ms": snap_ms,
        "hf_restore_ttft_ms": statistics.median(warm_ms),
        "hf_continuation_match": restored == [first, second],
        "hf_first_token": first,
        "hf_warmup_s": warmup_s,
    }
