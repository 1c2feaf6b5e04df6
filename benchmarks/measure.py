"""The measurements of one model at one context length: ours (engine) and transformers'.

The headline is a **follow-up turn**: a conversation whose first ``N`` tokens
are already in a capsule gets a new ``T``-token turn (``--turn-tokens``,
default 64) and must answer with a first token. Ours, through the public
``LLMEngine`` verbs only:
(f) cold: ``reset``, chunked ``prefill`` of all ``N + T`` ids, ``decode_step``
    -> first token (wall clock); capsule path: ``restore`` of the prefix
    capsule, ``prefill`` of the ``T`` new ids, ``decode_step`` -> first token;
(r) re-entry: ``restore`` -> first token from the logits stored in the capsule
    (no model forward), against a cold prefill of the ``N`` ids alone;
(d) decode: ``decode_step`` at batch 1 (CUDA-graph replay when enabled) vs the
    weight-read floor;
(e) ``snapshot`` / ``restore`` alone (CUDA events, median of >= 50) vs one flat
    copy of the capsule's bytes; the restore includes the rollback ring's
    seeding of the restored timeline, which the next step would otherwise pay.
Correctness: the follow-up tokens equal the cold run's, for a prefix that ends
on a boundary of the cold run's chunk cut ("aligned") and for one that does not;
the tokens after a re-entry equal the uninterrupted run.

transformers: one forward over the prompt (``logits_to_keep=1``); its cache
snapshotted with ``copy.deepcopy`` and restored either by ``copy.deepcopy``
or by ``clone()`` of every tensor put back into the cache object; then one
forward of the ``T`` new ids.
"""
from __future__ import annotations

import copy
import inspect
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from benchmarks.timing import copy_floor_ms, event_ms, median_event_ms, sync, wall_ms
from flashrt_ros.engine.config import StoreConfig
from flashrt_ros.engine.graphs import chunk_lengths
from flashrt_ros.engine.llm_engine import LLMEngine
from flashrt_ros.engine.state import LOGITS
from flashrt_ros.models.base import CausalLM, FingerprintInputs
from flashrt_ros.models.tokenizer import ByteTokenizer

CHECK_TOKENS = 4       # tokens compared between the capsule path and the cold / uninterrupted run
OTHER_TOKENS = 3       # "something else" decoded between snapshot and restore
DECODE_TOKENS = 32     # decode steps timed per context
UNALIGNED_SHIFT = 40   # the unaligned prefix: N - 40 tokens (N - N//4 for short N); its chunk cut differs


@dataclass
class RunSettings:
    device: torch.device
    reps: int                 # cold / warm TTFT repetitions (median)
    capsule_reps: int         # snapshot / restore repetitions (median, >= 50 by default)
    prefill_chunk: int
    cuda_graphs: bool
    seed: int
    turn: int = 64            # tokens of the follow-up turn


def prompt_ids(vocab_size: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen).to(device)


def cut_aligned(prefix: int, turn: int, chunk: int) -> bool:
    """Whether the cold run of ``prefix + turn`` ids is cut into the same chunks as ``prefix`` then ``turn``.

    Only then does the capsule path run the very same kernels on the very
    same token ranges as the cold run (chunked Gated DeltaNet rounds
    differently when chunks split elsewhere).
    """
    return chunk_lengths(prefix + turn, chunk) == chunk_lengths(prefix, chunk) + chunk_lengths(turn, chunk)


def _engine(model: CausalLM, context: int, s: RunSettings, fp: FingerprintInputs) -> LLMEngine:
    max_context = context + s.turn + OTHER_TOKENS + DECODE_TOKENS + 2 * CHECK_TOKENS + 8
    budget = 4 << 30
    return LLMEngine(model, ByteTokenizer(), max_context=max_context, device=s.device,
                     store_config=StoreConfig(device_budget_bytes=budget, host_budget_bytes=64 << 20,
                                              rollback_depth=1),
                     prefill_chunk=s.prefill_chunk, fingerprint_inputs=fp, cuda_graphs=s.cuda_graphs)


def _tokens(eng: LLMEngine, first: int) -> list[int]:
    """``first`` and the next ``CHECK_TOKENS - 1`` greedy tokens."""
    return [first] + [eng.decode_step(greedy=True) for _ in range(CHECK_TOKENS - 1)]


def _timed(fn: Callable[[], int], reps: int, dev: torch.device) -> tuple[float, list[int]]:
    """Median wall milliseconds of ``reps`` calls and the tokens they returned."""
    times, tokens = [], []
    for _ in range(reps):
        ms, token = wall_ms(fn, dev)
        times.append(ms)
        tokens.append(token)
    return statistics.median(times), tokens


def measure_ours(model: CausalLM, context: int, s: RunSettings, fp: FingerprintInputs) -> dict[str, Any]:
    """Rows (f), (r), (d), (e) and the token-identity checks for one context."""
    eng = _engine(model, context, s, fp)
    ids = prompt_ids(model.vocab_size, context + s.turn, s.seed, torch.device("cpu")).tolist()
    prefix, turn = ids[:context], ids[context:]
    dev = s.device

    def cold(seq: Sequence[int]) -> Callable[[], int]:
        def run() -> int:
            eng.capsules.reset()
            eng.prefill(seq)
            return eng.decode_step(greedy=True)
        return run

    warmup_s = wall_ms(cold(ids), dev)[0] / 1e3     # warm-up: compile, autotune, capture graphs
    cold(prefix)()
    cold_turn_ms, cold_turn_firsts = _timed(cold(ids), s.reps, dev)
    cold_turn_logits = eng.arena[LOGITS].clone()
    cold_turn_tokens = _tokens(eng, cold_turn_firsts[-1])
    cold_ms, firsts = _timed(cold(prefix), s.reps, dev)
    uninterrupted = _tokens(eng, firsts[-1])

    eng.capsules.reset()
    eng.prefill(prefix)
    info = eng.capsules.snapshot("bench_prefix", overwrite=True)
    for _ in range(OTHER_TOKENS):                  # graph capture of "decode" happens here
        eng.decode_step(greedy=True)

    def followup() -> int:
        eng.capsules.restore("bench_prefix")
        eng.prefill(turn)
        return eng.decode_step(greedy=True)

    followup()                                     # untimed: the turn's own graphs, if new
    followup_ms, followup_firsts = _timed(followup, s.reps, dev)
    followup_logits = eng.arena[LOGITS].clone()
    followup_tokens = _tokens(eng, followup_firsts[-1])

    def reentry() -> int:
        eng.capsules.restore("bench_prefix")
        return eng.decode_step(greedy=True)

    reentry_times = []
    for _ in range(s.reps):
        ms, _ = wall_ms(reentry, dev)
        reentry_times.append(ms)
        for _ in range(OTHER_TOKENS):
            eng.decode_step(greedy=True)
    eng.capsules.restore("bench_prefix")
    restored = [eng.decode_step(greedy=True) for _ in range(CHECK_TOKENS)]

    decode_ms = [wall_ms(lambda: eng.decode_step(greedy=True), dev)[0] for _ in range(DECODE_TOKENS)]

    snap_ms = median_event_ms(lambda: eng.capsules.snapshot("bench_probe", overwrite=True), s.capsule_reps, dev)

    def restore_and_seed() -> None:
        eng.capsules.restore("bench_prefix")
        eng.store.ring.before_step()              # the ring's deferred copy of the restored timeline's start

    restore_ms = median_event_ms(restore_and_seed, s.capsule_reps, dev)
    floor_ms = copy_floor_ms(info.nbytes, dev, s.capsule_reps)
    unaligned = _unaligned_check(eng, ids, context, s)
    out = {
        "turn_tokens": s.turn,
        "cold_turn_ttft_ms": cold_turn_ms,
        "followup_ttft_ms": followup_ms,
        "followup_aligned": cut_aligned(context, s.turn, s.prefill_chunk),
        "followup_token_match": followup_tokens == cold_turn_tokens and len(set(cold_turn_firsts)) == 1,
        "followup_logits_max_diff": (followup_logits - cold_turn_logits).abs().max().item(),
        **unaligned,
        "cold_ttft_ms": cold_ms,
        "reentry_ttft_ms": statistics.median(reentry_times),
        "decode_ms": statistics.median(decode_ms),
        "capsule_bytes": info.nbytes,
        "snapshot_ms": snap_ms,
        "restore_ms": restore_ms,
        "copy_floor_ms": floor_ms,
        "first_token_match": restored[0] == uninterrupted[0] and len(set(firsts)) == 1,
        "continuation_match": restored == uninterrupted,
        "first_token": cold_turn_tokens[0],
        "warmup_s": warmup_s,
    }
    del eng
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _unaligned_check(eng: LLMEngine, ids: list[int], context: int, s: RunSettings) -> dict[str, Any]:
    """The follow-up check for a prefix of ``N - UNALIGNED_SHIFT`` ids, whose chunk cut differs from the cold run's."""
    n = context - min(UNALIGNED_SHIFT, context // 4)
    if n < 1 or cut_aligned(n, s.turn, s.prefill_chunk):
        return {}
    whole, prefix = ids[:n + s.turn], ids[:n]
    eng.capsules.reset()
    eng.prefill(whole)
    first = eng.decode_step(greedy=True)
    cold_logits = eng.arena[LOGITS].clone()      # the draw leaves the prefill's logits in place
    cold = _tokens(eng, first)
    eng.capsules.reset()
    eng.prefill(prefix)
    eng.capsules.snapshot("bench_unaligned", overwrite=True)
    eng.decode_step(greedy=True)
    eng.capsules.restore("bench_unaligned")
    eng.prefill(whole[n:])
    first = eng.decode_step(greedy=True)
    diff = (eng.arena[LOGITS] - cold_logits).abs().max().item()
    warm = _tokens(eng, first)
    eng.capsules.drop("bench_unaligned")
    return {"unaligned_prefix": n, "unaligned_token_match": warm == cold, "unaligned_logits_max_diff": diff}


def _cache_kwarg(hf: torch.nn.Module) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in 5.x; use whichever this version has."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def _hf_step(hf: torch.nn.Module, ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
    """One transformers forward; returns (last logits [vocab], cache)."""
    out = hf(input_ids=ids.view(1, -1), use_cache=True, logits_to_keep=1, **{_cache_kwarg(hf): cache})
    cache = getattr(out, "cache", None)            # transformers >= 5 names the field ``cache``
    return out.logits[0, -1], cache if cache is not None else out.past_key_values


_SCALARS = (bool, int, float, str, type(None))


def _leaves(obj: Any, found: list[tuple[Any, Any]] | None = None) -> list[tuple[Any, Any]]:
    """``(container, key)`` of every tensor and scalar inside a transformers cache (lists, dicts, cache objects)."""
    found = [] if found is None else found
    if isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, dict):
        items = obj.items()
    elif type(obj).__module__.startswith("transformers.") and hasattr(obj, "__dict__") \
            and "Config" not in type(obj).__name__:
        items = vars(obj).items()
    else:
        return found
    for key, value in list(items):
        if isinstance(value, (torch.Tensor, *_SCALARS)):
            found.append((obj, key))
        else:
            _leaves(value, found)
    return found


def _get(container: Any, key: Any) -> Any:
    return container[key] if isinstance(container, (list, tuple, dict)) else getattr(container, key)


def _set(container: Any, key: Any, value: Any) -> None:
    if isinstance(container, (list, dict)):
        container[key] = value
    else:
        setattr(container, key, value)


class CloneRestore:
    """The ``clone()``-of-every-tensor baseline: put fresh clones of the snapshot's tensors into a live cache.

    The leaves are found once (untimed); a restore is one ``clone()`` per
    tensor (scalars such as lengths and flags are set back too), without the
    Python object-graph walk that ``copy.deepcopy`` spends its time on.
    """

    def __init__(self, snapshot: Any) -> None:
        self.live = copy.deepcopy(snapshot)
        self.slots = _leaves(self.live)
        self.sources = [_get(c, k) for c, k in _leaves(snapshot)]
        if len(self.sources) != len(self.slots) or any(isinstance(c, tuple) for c, _ in self.slots):
            raise RuntimeError("cache layout not supported by the clone baseline")

    def __call__(self) -> Any:
        for (container, key), src in zip(self.slots, self.sources):
            _set(container, key, src.clone() if isinstance(src, torch.Tensor) else src)
        return self.live


def measure_hf(hf: torch.nn.Module, vocab_size: int, context: int, s: RunSettings) -> dict[str, Any]:
    """transformers: cold prefill of N and of N + T, deepcopy snapshot, re-entry and follow-up turns."""
    dev = s.device
    ids = prompt_ids(vocab_size, context + s.turn, s.seed, dev)
    prefix, turn = ids[:context], ids[context:]

    def cold(seq: torch.Tensor) -> Callable[[], tuple[int, torch.Tensor, Any]]:
        def run() -> tuple[int, torch.Tensor, Any]:
            logits, cache = _hf_step(hf, seq, None)
            return int(logits.argmax().item()), logits, cache
        return run

    with torch.no_grad():
        warmup_s = wall_ms(cold(ids), dev)[0] / 1e3     # warm-up (kernel compilation / autotune)
        cold_turn_ms = []
        for _ in range(s.reps):
            ms, (turn_first, _, cache) = wall_ms(cold(ids), dev)
            cold_turn_ms.append(ms)
        del cache
        cold_ms = []
        for _ in range(s.reps):
            ms, (first, logits, cache) = wall_ms(cold(prefix), dev)
            cold_ms.append(ms)
        saved_logits = logits.clone()
        snapshot = copy.deepcopy(cache)
        second, _ = _hf_step(hf, torch.tensor([first], device=dev), cache)
        second = int(second.argmax().item())
        snap_ms = statistics.median(event_ms(lambda: copy.deepcopy(snapshot), dev)
                                    for _ in range(max(5, min(s.capsule_reps, 20))))

        def reentry() -> tuple[int, Any]:
            live = copy.deepcopy(snapshot)
            return int(saved_logits.argmax().item()), live

        reentry_ms = []
        for _ in range(s.reps):
            ms, (token, live) = wall_ms(reentry, dev)
            reentry_ms.append(ms)
        next_logits, _ = _hf_step(hf, torch.tensor([token], device=dev), live)
        restored = [token, int(next_logits.argmax().item())]
        del live

        def followup(restore: Callable[[], Any]) -> Callable[[], int]:
            def run() -> int:
                logits, _ = _hf_step(hf, turn, restore())
                return int(logits.argmax().item())
            return run

        out: dict[str, Any] = {}
        deep = followup(lambda: copy.deepcopy(snapshot))
        deep()
        out["hf_followup_deepcopy_ms"], deep_tokens = _timed(deep, s.reps, dev)
        try:
            clone = followup(CloneRestore(snapshot))
            clone()
            out["hf_followup_clone_ms"], clone_tokens = _timed(clone, s.reps, dev)
            out["hf_clone_token_match"] = set(clone_tokens) == {turn_first}
        except RuntimeError as exc:
            out["hf_clone_note"] = str(exc)
    sync(dev)
    del cache, snapshot
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "hf_cold_turn_ttft_ms": statistics.median(cold_turn_ms),
        **out,
        "hf_followup_token_match": set(deep_tokens) == {turn_first},
        "hf_cold_ttft_ms": statistics.median(cold_ms),
        "hf_snapshot_ms": snap_ms,
        "hf_reentry_ttft_ms": statistics.median(reentry_ms),
        "hf_continuation_match": restored == [first, second],
        "hf_first_token": turn_first,
        "hf_warmup_s": warmup_s,
    }
