"""Where a batch-1 decode step's wall time goes: the captured graph vs the engine around it.

Builds the hybrid 0.81B benchmark model (random weights, bf16), prefills 2048
tokens, then times (medians of 50):
  - ``decode_step``: the engine's whole step, as ``benchmarks.llm`` column (d);
  - the decode graph's replay alone (CUDA events: device time of the step's kernels);
  - replay plus the host read of the token (what any engine must do per token).
The differences are the engine's host work per step (gate, ring record, commit)
and the launch gaps inside the graph. Run on a GPU:
``python -m benchmarks.kernel_decode_overhead``.
"""
from __future__ import annotations

import statistics

import torch

from benchmarks.gpu_args import gpu_benchmark_args
from benchmarks.models import build_hybrid
from benchmarks.timing import median_event_ms, wall_ms
from benchmarks.measure import prompt_ids
from flashrt_ros.engine.llm_engine import LLMEngine
from flashrt_ros.engine.state import PENDING
from flashrt_ros.models.tokenizer import ByteTokenizer

REPS = 50
CUDA = torch.device("cuda")



def main() -> None:
    gpu_benchmark_args(__doc__, "python -m benchmarks.kernel_decode_overhead")
    pair = build_hybrid(CUDA, torch.bfloat16, 0, quick=False)
    eng = LLMEngine(pair.ours, ByteTokenizer(), max_context=2048 + 3 * REPS + 64, device="cuda",
                    prefill_chunk=2048, cuda_graphs=True)
    eng.prefill(prompt_ids(pair.ours.vocab_size, 2048, 0, torch.device("cpu")).tolist())
    for _ in range(3):
        eng.decode_step(greedy=True)
    step = statistics.median(wall_ms(lambda: eng.decode_step(greedy=True), CUDA)[0] for _ in range(REPS))
    graph = eng.runner.decode_runners[("decode", True)].graph   # the captured decode step (benchmark-only access)
    replay = median_event_ms(graph.replay, REPS, CUDA)
    with_read = statistics.median(wall_ms(lambda: (graph.replay(), int(eng.arena[PENDING].item())), CUDA)[0]
                                  for _ in range(REPS))
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; hybrid-0.81B bf16 at position ~2100")
    print("| what | ms | share of decode_step |")
    print("|---|---|---|")
    for name, ms in (("decode_step (engine, column d)", step), ("graph replay, device time", replay),
                     ("graph replay + token read, wall", with_read)):
        print(f"| {name} | {ms:.3f} | {ms / step:.0%} |")
    print(f"| engine host work per step (d - replay+read) | {step - with_read:.3f} | {(step - with_read) / step:.0%} |")


if __name__ == "__main__":
    main()
