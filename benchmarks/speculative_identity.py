"""``python -m benchmarks.speculative_identity``: greedy speculation against plain decoding on the trained hybrid.

Issue #57, item 1 on the device: the small hybrid trained by ``tools/train_tiny_hybrid.py``
(``test/data/tiny_hybrid_trained``: real margins, a head that drafts what the model accepts), run through
the engine's captured graphs in bfloat16 and float32, k = 1..8, on prompts cut from docstrings outside its
corpus. For every (dtype, k, prompt): the speculative tokens against the plain ones. Where they part, the
plain run's margin (top-1 minus top-2 logit, from a forward over its transcript in the same dtype) at that
token decides: under ``NEAR_TIE[dtype]`` a (k+1)-token verification may legitimately round the other way (a
near-tie, counted and listed); above it the row fails. The head's acceptance is measured per k.

Power, in the same run: the rollback broken on purpose (the recurrent and conv state kept after every
verified token, rejected ones too) must make rows fail, or the run exits 1.

Writes ``speculative_identity_<card>.json`` and ``.md`` into ``--out``; exit 0 only if every row passed and
the broken rollback was caught.

    python -m benchmarks.speculative_identity                    # CUDA: bfloat16 and float32, graphs
    python -m benchmarks.speculative_identity --device cpu --dtypes float32 --max-k 2 --prompts 2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.provenance import provenance
from benchmarks.speculative import card
from flashrt_ros.engine import LLMEngine
from flashrt_ros.models.hybrid import load_hybrid_checkpoint
from flashrt_ros.models.hybrid import verification
from flashrt_ros.models.tokenizer import ByteTokenizer
from flashrt_ros.runtime.arena import StateArena, core_meta_specs

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[1] / "test" / "data" / "tiny_hybrid_trained"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: a plain token whose logit leads the runner-up by less than this is a near-tie (declared before any run:
#: bf16 keeps 8 significant bits, so logits of magnitude 8-16 are spaced 0.0625 apart)
NEAR_TIE = {"bfloat16": 0.25, "float32": 1e-3}
#: modules whose docstrings are not in the training corpus (tools/train_tiny_hybrid.CORPUS_MODULES)
PROMPT_MODULES = ("plistlib", "gzip", "bz2", "netrc", "mailbox", "getopt", "optparse", "gettext", "locale",
                  "imaplib", "ftplib", "smtplib", "poplib", "cmd", "code", "dis")
PROMPT_BYTES = 40


def log(msg: str) -> None:
    print(f"[speculative_identity] {msg}", file=sys.stderr, flush=True)


def prompts(count: int) -> list[str]:
    """The first sentence-ish slice of each held-out module's docstring (ASCII, whitespace folded)."""
    import importlib
    out = []
    for name in PROMPT_MODULES[:count]:
        doc = " ".join((importlib.import_module(name).__doc__ or name).split())
        out.append(doc.encode("ascii", "ignore").decode()[:PROMPT_BYTES])
    return out


def margins(model, ids: list[int], device: torch.device) -> torch.Tensor:
    """Top-1 minus top-2 logit after every prefix of ``ids`` (one forward, the model's dtype)."""
    arena = StateArena(core_meta_specs() + model.state_specs(len(ids) + 1), device=device)
    with torch.no_grad():
        logits = model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device), arena)
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).cpu()


class BrokenRollback:
    """The mutation: ``VerifyScratch.keep_prefix`` keeps the state after the last verified token, always."""

    def __enter__(self) -> None:
        self.real = real = verification.VerifyScratch.keep_prefix

        def keep_everything(scratch, arena, last):
            return real(scratch, arena, torch.full_like(last, scratch.tokens - 1))
        verification.VerifyScratch.keep_prefix = keep_everything

    def __exit__(self, *exc: object) -> None:
        verification.VerifyScratch.keep_prefix = self.real


def check_dtype(args: argparse.Namespace, dtype_name: str, texts: list[str]) -> dict[str, Any]:
    dtype = DTYPES[dtype_name]
    model = load_hybrid_checkpoint(args.checkpoint, dtype, args.device, mtp=True).eval().requires_grad_(False)
    tokenizer = ByteTokenizer()
    graphs = args.device.type == "cuda"
    max_context = PROMPT_BYTES + args.new_tokens + args.max_k + 8

    def engine(k: int) -> LLMEngine:
        return LLMEngine(model, tokenizer, max_context=max_context, device=args.device, prefill_chunk=16,
                         cuda_graphs=graphs, speculative_tokens=k)

    plain = engine(0)
    wants, tie_margins = {}, {}
    for text in texts:
        plain.capsules.reset()
        wants[text] = plain.generate(text, max_new_tokens=args.new_tokens, stop_ids=[]).token_ids
        transcript = plain.transcript()
        tie_margins[text] = margins(model, transcript[:-1], args.device)[-args.new_tokens:]
    del plain
    rows = []
    for k in range(1, args.max_k + 1):
        spec = engine(k)
        drafted = accepted = 0
        for text in texts:
            spec.capsules.reset()
            t0 = time.perf_counter()
            got = spec.generate(text, max_new_tokens=args.new_tokens, stop_ids=[])
            seconds = time.perf_counter() - t0
            drafted, accepted = drafted + got.drafted_tokens, accepted + got.accepted_tokens
            want = wants[text]
            first = next((i for i, (a, b) in enumerate(zip(got.token_ids, want)) if a != b), None)
            if first is None and len(got.token_ids) != len(want):
                first = min(len(got.token_ids), len(want))
            margin = None if first is None else float(tie_margins[text][first])
            verdict = ("identical" if first is None else
                       "near-tie" if margin < NEAR_TIE[dtype_name] else "MISMATCH")
            rows.append({"dtype": dtype_name, "k": k, "prompt": text, "verdict": verdict, "first_difference": first,
                         "plain_margin_there": margin, "seconds": round(seconds, 4)})
        rows.append({"dtype": dtype_name, "k": k, "acceptance": accepted / max(drafted, 1), "drafted": drafted,
                     "accepted": accepted})
        log(f"{dtype_name} k={k}: acceptance {accepted / max(drafted, 1):.3f}, "
            f"{sum(r.get('verdict') == 'identical' for r in rows if r['k'] == k and r['dtype'] == dtype_name)}"
            f"/{len(texts)} identical")
        del spec
    with BrokenRollback():
        spec = engine(3)
        broken = 0
        for text in texts:
            spec.capsules.reset()
            broken += spec.generate(text, max_new_tokens=args.new_tokens, stop_ids=[]).token_ids != wants[text]
        del spec
    all_margins = torch.cat(list(tie_margins.values()))
    return {"dtype": dtype_name, "near_tie_bound": NEAR_TIE[dtype_name], "rows": rows,
            "plain_tokens_under_near_tie_bound": int((all_margins < NEAR_TIE[dtype_name]).sum()),
            "plain_tokens": int(all_margins.numel()), "smallest_plain_margin": float(all_margins.min()),
            "broken_rollback_prompts_changed": broken, "prompts": len(texts)}


def render(result: dict[str, Any]) -> str:
    lines = [f"# Greedy speculation = plain decoding, trained hybrid ({result['machine']['card']})", "",
             f"`{result['command']}`; {result['machine']}; checkpoint `{result['checkpoint']}`; "
             f"{result['new_tokens']} new tokens per prompt, {len(result['prompts'])} prompts.", "",
             "| dtype | k | acceptance | identical | near-tie | MISMATCH |", "| --- | --- | --- | --- | --- | --- |"]
    for part in result["dtypes"]:
        for k in sorted({r["k"] for r in part["rows"]}):
            rs = [r for r in part["rows"] if r["k"] == k and "verdict" in r]
            acc = next(r["acceptance"] for r in part["rows"] if r["k"] == k and "acceptance" in r)
            count = {v: sum(r["verdict"] == v for r in rs) for v in ("identical", "near-tie", "MISMATCH")}
            lines.append(f"| {part['dtype']} | {k} | {acc:.3f} | {count['identical']} | {count['near-tie']} | "
                         f"{count['MISMATCH']} |")
    lines.append("")
    for part in result["dtypes"]:
        lines.append(f"- {part['dtype']}: near-tie bound {part['near_tie_bound']}; plain tokens under it "
                     f"{part['plain_tokens_under_near_tie_bound']} of {part['plain_tokens']} (smallest margin "
                     f"{part['smallest_plain_margin']:.4f}); broken rollback changed "
                     f"{part['broken_rollback_prompts_changed']} of {part['prompts']} prompts.")
    lines.append(f"- verdict: **{result['verdict']}**")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=None,
                    help="default: bfloat16 float32 on CUDA, float32 on CPU")
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=len(PROMPT_MODULES))
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args(argv)
    args.device = torch.device(args.device)
    args.dtypes = args.dtypes or (["bfloat16", "float32"] if args.device.type == "cuda" else ["float32"])
    texts = prompts(args.prompts)
    parts = [check_dtype(args, name, texts) for name in args.dtypes]
    mismatches = sum(r.get("verdict") == "MISMATCH" for p in parts for r in p["rows"])
    uncaught = [p["dtype"] for p in parts if p["broken_rollback_prompts_changed"] < max(1, len(texts) // 2)]
    verdict = ("pass" if not mismatches and not uncaught else
               f"FAIL: {mismatches} mismatches" + (f"; broken rollback not caught in {uncaught}" if uncaught else ""))
    machine = {"device": str(args.device), "card": card(args.device), "torch": torch.__version__,
               "steps": "CUDA-graph replay" if args.device.type == "cuda" else "eager"}
    if args.device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(args.device)
    result = {"command": " ".join(["python -m benchmarks.speculative_identity", *(argv or sys.argv[1:])]),
              "machine": machine, "provenance": provenance(args.device), "checkpoint": str(args.checkpoint),
              "new_tokens": args.new_tokens, "prompts": texts, "dtypes": parts, "verdict": verdict}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"speculative_identity_{machine['card']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(render(result))
    print(render(result))
    return 0 if verdict == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
