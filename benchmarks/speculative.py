"""``python -m benchmarks.speculative``: batch-1 decode with speculative decoding vs plain decoding, one run.

For each context length (the prompt prefilled once per engine, the first token
drawn, a capsule taken; every repetition restores it) and each draft count k:
- **plain**: ``speculative_tokens = 0``: tokens/s, and the decode step against
  the weight-read floor (every main-model weight read once per token);
- **oracle drafter at a controlled acceptance rate** (labelled ``oracle``: no
  model drafts, this measures what speculation buys at that rate): the drafts are
  the plain run's own continuation with wrong (so rejected) tokens placed so
  that accepted / drafted equals the rate (``--rate-kind drafted``, the rate vLLM
  reports; a schedule over the steps, exact because greedy verification of the
  plain continuation is deterministic), or each draft wrong independently with
  probability 1 - rate (``--rate-kind position``: the per-draft acceptance
  probability of the speculative-sampling papers; accepted / drafted is then
  lower, 51 % at 70 % with k = 3). The measured accepted / drafted is reported
  beside what the wrong positions imply, and the tokens are checked against the
  plain run;
- **the model's MTP head** as drafter: random weights here unless ``--checkpoint``
  names a Qwen3-Next checkpoint with ``mtp.*`` weights, so its acceptance is ~0
  and the row measures the cost of drafting with the head;
- the in-step rollback alone (``VerifyScratch.keep_prefix``: the accepted
  prefix's recurrent and conv state copied back) against a decode step.
Writes ``speculative_<card>.md`` and ``.json`` into ``--out``.

    python -m benchmarks.speculative                                   # GPU defaults (0.81B hybrid, bf16)
    python -m benchmarks.speculative --quick --device cpu --out /tmp/s # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.models import seeded_weights_, weight_read_bytes
from benchmarks.provenance import provenance
from benchmarks.timing import copy_bandwidth, graph_ms
from flashrt_ros.engine import LLMEngine
from flashrt_ros.engine.drafters import OracleDrafter
from flashrt_ros.models.hybrid import HybridCausalLM, bench_0p8b_config, load_hybrid_checkpoint, random_hybrid_config
from flashrt_ros.models.hybrid.mtp import MultiTokenPredictor
from flashrt_ros.models.tokenizer import ByteTokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg: str) -> None:
    print(f"[benchmarks.speculative] {msg}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speculative", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="default 2048 16384 (--quick: 32 64)")
    p.add_argument("--tokens", type=int, nargs="+", default=None, help="draft counts k (default 3; --quick 2)")
    p.add_argument("--rates", type=float, nargs="+", default=[1.0, 0.7, 0.4],
                   help="oracle acceptance rates (default 1.0 0.7 0.4)")
    p.add_argument("--rate-kind", choices=("drafted", "position"), default="drafted",
                   help="drafted: accepted / drafted = rate (default); position: each draft right with "
                        "probability rate, independently")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per measured generation (default 256; --quick 12)")
    p.add_argument("--reps", type=int, default=None, help="measured generations per row, median (default 3; --quick 1)")
    p.add_argument("--prefill-chunk", type=int, default=None, help="default 2048 (--quick 16)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a Qwen3-Next checkpoint directory with mtp.* weights (default: the 0.81B shape, random)")
    p.add_argument("--no-mtp", action="store_true", help="skip the MTP-head rows")
    p.add_argument("--readout", choices=("permutation", "random"), default="permutation",
                   help="random weights' read-out: permutation (clear greedy margins, see permutation_readout_; "
                        "default) or random (flat logits: bf16 near-ties flip between verify and step)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run steps eagerly")
    p.add_argument("--bandwidth-mib", type=int, default=None, help="copy probe size (default 1024 on CUDA, 64 on CPU)")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--quick", action="store_true", help="tiny model, short contexts (CPU smoke test)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    args.dtype = args.dtype or ("bfloat16" if args.device.type == "cuda" else "float32")
    args.contexts = args.contexts or ([32, 64] if args.quick else [2048, 16384])
    args.tokens = args.tokens or ([2] if args.quick else [3])
    args.new_tokens = args.new_tokens or (12 if args.quick else 256)
    args.reps = args.reps or (1 if args.quick else 3)
    args.prefill_chunk = args.prefill_chunk or (16 if args.quick else 2048)
    args.bandwidth_mib = args.bandwidth_mib or (1024 if args.device.type == "cuda" else 64)
    if min(args.contexts) < 2 or min(args.tokens) < 1 or args.new_tokens < 2 or args.reps < 1:
        p.error("contexts >= 2, tokens >= 1, new tokens >= 2, reps >= 1")
    if any(not 0.0 <= r <= 1.0 for r in args.rates):
        p.error("rates must be in [0, 1]")
    return args


def card(device: torch.device) -> str:
    """A short name of the device for file names: h100, h200, a100, ..., cpu."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return match.group(1).lower() if match else "cuda"


def build_model(args: argparse.Namespace) -> tuple[HybridCausalLM, str, int]:
    """``(model with its MTP head, description, weight-read bytes of a plain decode step)``."""
    dtype = DTYPES[args.dtype]
    if args.checkpoint is not None:
        model = load_hybrid_checkpoint(args.checkpoint, dtype, args.device, mtp=not args.no_mtp)
        head, model.mtp = model.mtp, None
        floor_bytes = weight_read_bytes(model)
        model.mtp = head
        return model.eval().requires_grad_(False), f"checkpoint {args.checkpoint}", floor_bytes
    cfg = random_hybrid_config(vocab_size=ByteTokenizer().vocab_size) if args.quick else bench_0p8b_config()
    with torch.device(args.device):
        model = HybridCausalLM(cfg)
    seeded_weights_(model, args.seed)
    if args.readout == "permutation":
        permutation_readout_(model, args.seed)
    floor_bytes = weight_read_bytes(model.to(dtype))
    with torch.device(args.device):
        head = MultiTokenPredictor(cfg)
    seeded_weights_(head, args.seed + 1)
    model.mtp = head.to(dtype)
    name = "hybrid-tiny" if args.quick else "hybrid-0.81B"
    readout = ("; permutation read-out (next token = a fixed permutation of the current one, clear margins)"
               if args.readout == "permutation" else "")
    return model.eval().requires_grad_(False), \
        f"{name}, seeded random weights and MTP head (seed {args.seed}){readout}", floor_bytes


#: how far the token embedding outweighs what the layers add to the residual stream (``permutation_readout_``)
EMBEDDING_GAIN = 1000.0


def permutation_readout_(model: HybridCausalLM, seed: int) -> None:
    """Give seeded random weights clear greedy margins: next token = a fixed random permutation of the current one.

    Random weights give nearly flat logits, so a (k+1)-token verification, which rounds
    differently from a one-token step in bf16, flips near-ties and the speculative run
    leaves the plain run's tokens (then the oracle's script no longer matches). Here the
    embedding is scaled so the residual stream carries the current token past the
    layers' (random, still computed) contributions, and the lm_head rows are the
    embedding rows permuted: the winning logit leads the rest by ~25 standard
    deviations. Speed does not depend on weight values; every kernel runs as before.
    """
    emb = model.embed_tokens.weight
    if model.lm_head.weight.data_ptr() == emb.data_ptr():
        raise ValueError("permutation read-out needs an untied lm_head (use --readout random)")
    gen = torch.Generator().manual_seed(seed + 7)
    perm = torch.randperm(emb.shape[0], generator=gen).to(emb.device)
    with torch.no_grad():
        model.lm_head.weight.copy_(emb[perm.argsort()])   # row perm[t] = embedding of t: argmax after t is perm[t]
        emb.mul_(EMBEDDING_GAIN)


def wrong_positions(start: int, end: int, rate: float, seed: int) -> list[int]:
    """Positions in ``[start, end)`` whose draft the oracle gets wrong: each with probability 1 - rate."""
    rng = random.Random(seed)
    return [p for p in range(start, end) if rng.random() >= rate]


def scheduled_wrong_positions(first: int, new_tokens: int, k: int, rate: float) -> list[int]:
    """Wrong positions that make accepted / drafted follow ``rate`` step by step (greedy, oracle script).

    Step ``s`` accepts ``round(rate * k * (s + 1))`` minus what was accepted so
    far (0 .. k), by putting a wrong draft right after that many.
    """
    wrong, position, emitted, accepted, step = [], first, 1, 0, 0
    while emitted < new_tokens + 1:
        run = max(0, min(k, round(rate * k * (step + 1)) - accepted))
        if run < k:
            wrong.append(position + 1 + run)
        last = min(run, new_tokens - emitted)
        accepted, step = accepted + last, step + 1
        position, emitted = position + last + 1, emitted + last + 1
    return wrong


def expected_acceptance(first: int, new_tokens: int, k: int, wrong: set[int]) -> float:
    """accepted / drafted that an oracle with these wrong positions must give (greedy, no stop)."""
    position, emitted, drafted, accepted = first, 1, 0, 0
    while emitted < new_tokens + 1:
        run = 0
        while run < k and position + 1 + run not in wrong:
            run += 1
        last = min(run, new_tokens + 1 - emitted - 1)
        drafted, accepted = drafted + k, accepted + last
        position, emitted = position + last + 1, emitted + last + 1
    return accepted / drafted if drafted else 0.0


class Context:
    """One engine with the prompt prefilled (capsule ``prompt``) and the first token drawn (capsule ``ctx``)."""

    def __init__(self, engine: LLMEngine, prompt: list[int]) -> None:
        self.engine = engine
        engine.prefill(prompt)
        engine.capsules.snapshot("prompt", overwrite=True)
        self.first = len(prompt)             # position of the pending first token
        self.redraw()

    def redraw(self) -> None:
        """Draw the first token again: its step drafts, and the drafts are state (in ``ctx``), so a
        drafter whose script changed must redraw before measuring."""
        self.engine.capsules.restore("prompt")
        self.engine.decode_step(greedy=True)
        self.engine.capsules.snapshot("ctx", overwrite=True)

    def measure(self, new_tokens: int, reps: int) -> dict[str, Any]:
        """Median tokens/s of ``reps`` greedy generations of ``new_tokens`` from ``ctx`` (one unmeasured first)."""
        engine = self.engine
        runs = []
        for rep in range(reps + 1):
            engine.capsules.restore("ctx")
            if rep == 1:
                engine.stats.clear()        # the first run captured the graphs
            t0 = time.perf_counter()
            result = engine.generate([], max_new_tokens=new_tokens, stop_ids=[])
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0, result))
        measured = runs[1:]
        seconds = statistics.median(s for s, _ in measured)
        result = measured[0][1]
        steps = engine.stats.summary()
        return {"tokens_per_s": new_tokens / seconds, "ms_per_token": 1e3 * seconds / new_tokens,
                "token_ids": result.token_ids, "drafted": result.drafted_tokens, "accepted": result.accepted_tokens,
                "acceptance": result.accepted_tokens / result.drafted_tokens if result.drafted_tokens else None,
                "tokens_per_step": new_tokens / max(1, steps.get("speculative", steps.get("decode", {})).get("count", 1)
                                                    / reps),
                "step_p50_ms": {kind: s["p50_ms"] for kind, s in steps.items()}}


def rollback_ms(engine: LLMEngine, reps: int) -> float:
    """The in-step rollback alone: copy the state after one verified token back (device time)."""
    spec = engine.speculation
    assert spec is not None
    last = torch.zeros((), dtype=torch.int64, device=engine.device)

    def keep() -> None:
        spec.scratch.keep_prefix(engine.arena, last)
    if engine.device.type == "cuda":
        return graph_ms(keep)
    keep()
    samples = []
    for _ in range(max(reps, 5)):
        t0 = time.perf_counter()
        keep()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, description, floor_bytes = build_model(args)
    tokenizer = ByteTokenizer()
    bandwidth = copy_bandwidth(args.bandwidth_mib << 20, args.device)
    floor_ms = floor_bytes / bandwidth * 1e3
    graphs = args.device.type == "cuda" and not args.no_cuda_graphs
    machine = {"device": str(args.device), "card": card(args.device), "dtype": args.dtype,
               "torch": torch.__version__, "steps": "CUDA-graph replay" if graphs else "eager",
               "copy bandwidth (read+write)": f"{bandwidth / 1e9:.1f} GB/s"}
    if args.device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(args.device)
    log(f"{description} on {machine.get('gpu', args.device)}; weight-read floor {floor_ms:.3f} ms per token")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    gen = torch.Generator().manual_seed(args.seed)
    for context in args.contexts:
        prompt = torch.randint(0, model.vocab_size, (context,), generator=gen).tolist()
        max_context = context + args.new_tokens + 2 * max(args.tokens) + 8

        def engine(k: int = 0, drafter=None) -> LLMEngine:
            return LLMEngine(model, tokenizer, max_context=max_context, device=args.device,
                             prefill_chunk=args.prefill_chunk, cuda_graphs=graphs, speculative_tokens=k,
                             drafter=drafter)

        log(f"context {context}: plain ...")
        plain_ctx = Context(engine(), prompt)
        plain = plain_ctx.measure(args.new_tokens, args.reps)
        step_ms = plain["step_p50_ms"].get("decode", float("nan"))
        rows.append({"context": context, "mode": "plain", "k": 0, "rate": None,
                     **{k: v for k, v in plain.items() if k != "token_ids"}, "speedup": 1.0,
                     "decode_step_ms": step_ms, "floor_ms": floor_ms, "step_over_floor": step_ms / floor_ms})
        script = plain_ctx.engine.transcript()
        first = plain_ctx.first
        del plain_ctx
        for k in args.tokens:
            oracle = OracleDrafter(model.vocab_size, max_context + k + 1, args.device)
            oracle.set_script(script)
            ctx = Context(engine(k, oracle), prompt)
            for rate in args.rates:
                wrong = (scheduled_wrong_positions(first, args.new_tokens, k, rate) if args.rate_kind == "drafted"
                         else wrong_positions(first + 1, max_context, rate, args.seed + k))
                oracle.set_script(script, wrong)
                ctx.redraw()
                log(f"context {context}: k {k}, oracle at {rate:.0%} ...")
                got = ctx.measure(args.new_tokens, args.reps)
                rows.append({"context": context, "mode": "oracle", "k": k, "rate": rate, "rate_kind": args.rate_kind,
                             "expected_acceptance": expected_acceptance(first, args.new_tokens, k, set(wrong)),
                             **{key: v for key, v in got.items() if key != "token_ids"},
                             "speedup": got["tokens_per_s"] / plain["tokens_per_s"],
                             "tokens_match_plain": got["token_ids"] == plain["token_ids"]})
            rows[-1]["rollback_ms"] = rollback_ms(ctx.engine, args.reps)
            del ctx
            if not args.no_mtp:
                log(f"context {context}: k {k}, MTP head ...")
                ctx = Context(engine(k), prompt)
                got = ctx.measure(args.new_tokens, args.reps)
                rows.append({"context": context, "mode": "mtp", "k": k, "rate": None,
                             **{key: v for key, v in got.items() if key != "token_ids"},
                             "speedup": got["tokens_per_s"] / plain["tokens_per_s"],
                             "tokens_match_plain": got["token_ids"] == plain["token_ids"]})
                del ctx
            if args.device.type == "cuda":
                torch.cuda.empty_cache()
        for row in rows[-(len(args.rates) + (0 if args.no_mtp else 1)) * len(args.tokens) - 1:]:
            log("  " + ", ".join(f"{key}={row[key]:.3f}" if isinstance(row[key], float) else f"{key}={row[key]}"
                                 for key in ("mode", "k", "rate", "tokens_per_s", "speedup", "acceptance")
                                 if key in row))
    if args.checkpoint is None and args.readout == "permutation":
        notes.append("timing only: the permutation read-out makes the next token a fixed function of the current "
                     "one, independent of every layer, so `tokens_match_plain` here would hold even with the "
                     "rollback broken; token identity and its power are checked on the trained model by "
                     "`python -m benchmarks.speculative_identity`")
    if args.checkpoint is None and not args.no_mtp:
        notes.append("the `mtp` rows draft with a seeded random head (acceptance ~0): they measure what drafting "
                     "costs, not what the head buys; `--checkpoint test/data/tiny_hybrid_trained` measures a "
                     "trained head's acceptance")
    if any(r.get("tokens_match_plain") is False for r in rows):
        notes.append("some speculative runs emitted other tokens than plain greedy decoding: a (k+1)-token "
                     "verification rounds differently from a one-token step, so a near-tie can go the other "
                     "way in low precision; after that point the oracle's script no longer matches and its "
                     "measured acceptance falls below the target")
    return {"command": " ".join(["python -m benchmarks.speculative", *sys.argv[1:]]), "machine": machine,
            "model": description, "weight_read_bytes": floor_bytes, "new_tokens": args.new_tokens,
            "rate_kind": args.rate_kind,
            "reps": args.reps, "rows": rows, "notes": notes}


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"# Speculative decoding at batch 1 ({m.get('gpu', m['device'])}, {m['dtype']})", "",
             f"Command: `{result['command']}`", "",
             f"Model: {result['model']}; {result['new_tokens']} greedy tokens per generation, median of "
             f"{result['reps']}; steps: {m['steps']}; copy bandwidth {m['copy bandwidth (read+write)']}.", "",
             "`oracle` rows: no model drafts; the drafts are the plain run's own continuation with wrong tokens "
             + ("placed so that accepted / drafted = rate" if result["rate_kind"] == "drafted" else
                "each wrong with probability 1 - rate (the per-draft acceptance probability)")
             + "; `acceptance` is the measured accepted / drafted, `expected` what the wrong positions imply. "
             "`mtp` rows: the model's MTP head drafts (with seeded random weights, when no checkpoint was "
             "given, its acceptance is ~0 and the row measures the cost of drafting).",
             "", "| context | mode | k | rate | tokens/s | speedup | acceptance | expected | tokens/step | "
             "step p50 ms | same tokens as plain |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(x: Any, fmt: str = "{:.2f}") -> str:
        return "n/a" if x is None else fmt.format(x)
    for r in result["rows"]:
        step = r["step_p50_ms"].get("speculative", r["step_p50_ms"].get("decode"))
        lines.append(f"| {r['context']} | {r['mode']} | {r['k']} | {f(r['rate'], '{:.0%}')} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {f(r.get('acceptance'), '{:.1%}')} | "
                     f"{f(r.get('expected_acceptance'), '{:.1%}')} | {r['tokens_per_step']:.2f} | {f(step, '{:.3f}')} | "
                     f"{'n/a' if 'tokens_match_plain' not in r else 'yes' if r['tokens_match_plain'] else 'NO'} |")
    lines += ["", "## Decode step vs the weight-read floor", "",
              "| context | plain decode step p50 ms | floor ms (weights / copy bandwidth) | ratio | "
              "rollback (keep_prefix) ms |", "| --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        if r["mode"] == "plain":
            rollbacks = [x["rollback_ms"] for x in result["rows"]
                         if x["context"] == r["context"] and "rollback_ms" in x]
            lines.append(f"| {r['context']} | {r['decode_step_ms']:.3f} | {r['floor_ms']:.3f} | "
                         f"{r['step_over_floor']:.2f}x | {', '.join(f'{x:.4f}' for x in rollbacks) or 'n/a'} |")
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"speculative_{result['machine']['card']}"
    markdown = render(result)
    (args.out / f"{stem}.md").write_text(markdown)
    (args.out / f"{stem}.json").write_text(json.dumps({**result, "provenance": provenance(str(args.device))},
                                                      indent=1, default=str))
    print(markdown, flush=True)
    log(f"wrote {args.out / stem}.md / .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
