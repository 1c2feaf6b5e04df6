"""A batch-1 decode step with and without the fused products (``ops.linear.fused_decode``).

A layer's decode step is four products plus its mixer when each norm and residual add rides with a product
(``ops.triton.gemv.gemv_fused``); apart, each norm, add and gate is a launch of its own. Both forms run in one
process on one GPU, random weights (bf16) of SmolLM2-135M's shape or the hybrid 0.81B's (``--model``), 2048
tokens prefilled, CUDA graphs:
  - a third form with the attention's split slices merged by their own last program (no combine kernel:
    ``ops.triton.attention.merged_split_attention``, off by default), whose logits should be the fused form's bits;
  - the decode graph's replay (device time, median of 100) and the engine's whole step (wall, median of 100);
  - kernels in one eager forward (profiler) and the weight-read floor (weights / measured copy bandwidth);
  - the check, with bounds declared here before the run: the logits of the first decode forward (the token
    after the prompt fed back) within ``LOGITS_BOUND`` of the unfused form's (relative, max over the vocabulary;
    the same first token in both, it comes from the prefill), and the greedy tokens of 64 steps
    reported side by side (near-ties of random weights may flip; the count is reported, not asserted).
  - the check's power in the same run: the fused kernel with the two norms' roundings swapped (Llama's cast
    before the scale, Qwen3-Next's ``1 + w`` in float32) must leave the bound.
Exit status 1 when the check fails or has no power. Run on a GPU:
``python -m benchmarks.kernel_decode_fusion [--model smollm2|hybrid] [--json F]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from benchmarks.anatomy import forward_anatomy
from benchmarks.models import build_hybrid, build_smollm2, parameter_count
from benchmarks.measure import prompt_ids
from benchmarks.timing import copy_bandwidth, median_event_ms, wall_ms
from flashrt_ros.engine.llm_engine import LLMEngine
from flashrt_ros.engine.state import LOGITS
from flashrt_ros.models.tokenizer import ByteTokenizer
from flashrt_ros.ops.linear import fused_decode
from flashrt_ros.ops.triton import gemv as gemv_module
from flashrt_ros.ops.triton.attention import merged_split_attention

CONTEXT, TOKENS, REPS = 2048, 64, 100
CUDA = torch.device("cuda")
#: the fused form rounds where the unfused ops do; only the norm's sum of squares may be reduced in another
#: order (an ulp of rsqrt), which bf16 products carry to the logits as a few bf16 ulps: 2e-2 of the largest logit
LOGITS_BOUND = 2e-2
#: (name, fused products, the split attention merged by its own programs: ``merged_split_attention``)
FORMS = (("unfused", False, False), ("fused", True, False), ("fused+merged", True, True))


def rel(reference: torch.Tensor, other: torch.Tensor) -> float:
    """max |reference - other| over the largest |reference|: the check's measure."""
    return float((reference - other).abs().max() / reference.abs().max())


def measure(model, fused: bool, merged: bool = False, timed: bool = True) -> dict:
    """One form: a fresh engine (its graphs captured with the switches as given), prefill, tokens; with
    ``timed`` the step's timings and kernels too (the self-test needs only its logits)."""
    with fused_decode(fused), merged_split_attention(merged):
        eng = LLMEngine(model, ByteTokenizer(), max_context=CONTEXT + TOKENS + 3 * REPS + 64, device="cuda",
                        prefill_chunk=CONTEXT, cuda_graphs=True)
        eng.prefill(prompt_ids(model.vocab_size, CONTEXT, 0, torch.device("cpu")).tolist())
        tokens = [eng.decode_step(greedy=True) for _ in range(2)]   # the 2nd runs a decode forward (1st: prefill's)
        logits = eng.arena[LOGITS].clone()
        tokens += [eng.decode_step(greedy=True) for _ in range(TOKENS - 2)]
        if not timed:
            return {"tokens": tokens, "first_logits": logits}
        step = statistics.median(wall_ms(lambda: eng.decode_step(greedy=True), CUDA)[0] for _ in range(REPS))
        graph = eng.runner.decode_runners[("decode", True)].graph      # benchmark-only access
        replay = median_event_ms(graph.replay, REPS, CUDA)
        anatomy = forward_anatomy(model, CONTEXT, CUDA, 1)
    return {"decode_step_ms": step, "graph_replay_ms": replay, "kernels": anatomy.get("kernels"),
            "anatomy": anatomy, "tokens": tokens, "first_logits": logits}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("smollm2", "hybrid"), default="smollm2")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    pair = (build_smollm2(CUDA, torch.bfloat16, 0, quick=False, force_random=True) if args.model == "smollm2"
            else build_hybrid(CUDA, torch.bfloat16, 0, quick=False))
    model = pair.ours
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(1 << 30, CUDA)
    floor = weight_bytes / bandwidth * 1e3
    forms = {name: measure(model, fused, merged) for name, fused, merged in FORMS}
    a, b = forms["unfused"]["first_logits"], forms["fused"]["first_logits"]
    logits_error = rel(a, b)
    merged_error = rel(a, forms["fused+merged"]["first_logits"])
    merged_same_bits = torch.equal(b, forms["fused+merged"]["first_logits"])
    # the check's power, in the same run: the fused kernel with the two norms' roundings swapped must leave the
    # bound
    norms = dict(gemv_module.NORMS)
    gemv_module.NORMS.update(llama=norms["offset"], offset=norms["llama"])
    try:
        broken = measure(model, True, timed=False)["first_logits"]
    finally:
        gemv_module.NORMS.update(norms)
    broken_error = rel(a, broken)
    same_tokens = sum(x == y for x, y in zip(forms["unfused"]["tokens"], forms["fused"]["tokens"]))
    merged_tokens = sum(x == y for x, y in zip(forms["fused"]["tokens"], forms["fused+merged"]["tokens"]))
    passed = logits_error <= LOGITS_BOUND and merged_error <= LOGITS_BOUND and broken_error > LOGITS_BOUND
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; {pair.name} shape, random weights, "
          f"{parameter_count(model) / 1e6:.1f} M parameters, bf16, position {CONTEXT}")
    print(f"weight read {weight_bytes / 2**20:.1f} MiB, copy bandwidth {bandwidth / 1e9:.0f} GB/s: "
          f"floor {floor:.3f} ms")
    print("| form | decode step ms (wall) | graph replay ms | / floor | kernels (eager forward) |")
    print("|---|---|---|---|---|")
    for name, r in forms.items():
        print(f"| {name} | {r['decode_step_ms']:.3f} | {r['graph_replay_ms']:.3f} | "
              f"{r['graph_replay_ms'] / floor:.2f}x | {r['kernels']} |")
    print(f"check: first decode forward's logits {logits_error:.2e} of the largest (bound {LOGITS_BOUND:.0e}): "
          f"{'PASS' if logits_error <= LOGITS_BOUND else 'FAIL'}; greedy tokens equal in {same_tokens} of {TOKENS} "
          f"steps; fused+merged {merged_error:.2e} (the fused form's bits: {merged_same_bits}; its tokens in "
          f"{merged_tokens} of {TOKENS}); self-test (the norms' roundings swapped in the fused kernel) "
          f"{broken_error:.2e}: "
          f"{'fails the bound, as it must' if broken_error > LOGITS_BOUND else 'PASSES: the check has no power'}")
    if args.json:
        out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": pair.name,
               "commit": os.environ.get("FLASHRT_COMMIT", "unknown"), "context": CONTEXT,
               "weight_bytes": weight_bytes, "copy_bandwidth_bytes_s": bandwidth, "floor_ms": floor,
               "logits_error": logits_error, "logits_bound": LOGITS_BOUND, "selftest_error": broken_error,
               "merged_error": merged_error, "merged_same_bits": merged_same_bits, "merged_tokens": merged_tokens,
               "passed": passed,
               "same_tokens": same_tokens, "tokens": TOKENS,
               "forms": {n: {k: v for k, v in r.items() if k != "first_logits"} for n, r in forms.items()}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
