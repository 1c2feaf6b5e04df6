#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go: the GPU tests, then the capsule and LLM
# benchmarks. Usage: benchmarks/run_gpu_suite.sh OUT_DIR [TIME_BUDGET_S]
# Wheels the GPU image lacks (fla, gguf) may be given in .whl/ (installed to /tmp/site).
set -uo pipefail
OUT="${1:?output directory}"; BUDGET="${2:-300}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" || echo "fla not importable"; } 2>&1 | tee "$OUT/machine.txt"
python3 -m pytest -q -p no:cacheprovider test/test_runtime_cuda.py test/test_hybrid_cuda.py \
  test/test_engine_cuda_graphs.py test/test_policy_cuda_graph.py 2>&1 | tee "$OUT/gpu_tests.txt"
python3 benchmarks/bench_capsules.py --out "$OUT/capsules.md" 2>&1 | tee "$OUT/capsules_log.txt"
python3 -m flashrt_ros.bench --device cuda --smollm2-random --time-budget-s "$BUDGET" --out "$OUT" 2>&1 \
  | tee "$OUT/llm_log.txt"
