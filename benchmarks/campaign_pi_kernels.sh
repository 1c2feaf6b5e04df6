#!/usr/bin/env bash
# One device command: the π expert kernels checked and timed, and what they do to a whole published-size replan.
# Needs only the GPU image (torch, triton, tokenizers); no LeRobot. Usage: benchmarks/campaign_pi_kernels.sh OUT
#   1. our replan at the published size (seeded random weights), forms baseline / split / rows, stage times and
#      kernel counts (benchmarks.pi0_replan --profile), π0 2 cameras, then π0.5 3 cameras;
#   2. the kernels' GPU tests in bf16 and fp32 (test_rows_matmul.py, test_fused_rows.py);
#   3. the kernel sweep at the expert's shapes (benchmarks.kernel_expert).
set -uo pipefail
OUT="${1:?output directory}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null || echo "commit: ${FLASHRT_COMMIT:-unknown}"; } 2>&1 | tee "$OUT/machine.txt"
timeout 170 python3 -m benchmarks.pi0_replan --kind pi0 --cameras 2 --profile --json "$OUT/pi0_replan.json" 2>&1 \
  | tee "$OUT/pi0_replan.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider test/test_rows_matmul.py test/test_fused_rows.py 2>&1 \
  | tee "$OUT/gpu_tests.txt"
timeout 200 python3 -m benchmarks.kernel_expert --json "$OUT/kernel_expert.json" 2>&1 | tee "$OUT/kernel_expert.txt"
timeout 100 python3 -m benchmarks.pi0_replan --kind pi05 --cameras 3 --forms baseline,rows \
  --json "$OUT/pi05_replan.json" 2>&1 | tee "$OUT/pi05_replan.txt"
