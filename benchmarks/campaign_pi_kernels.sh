#!/usr/bin/env bash
# One device command: what the π expert kernels do to a whole published-size replan, and their GPU checks.
# Needs only the GPU image (torch, triton, tokenizers); no LeRobot. Usage: benchmarks/campaign_pi_kernels.sh OUT
#   1. our replan at the published size (seeded random weights), forms baseline / split / rows, compared with each
#      other, stage times and kernel counts (benchmarks.pi0_replan --profile), π0 with 2 cameras;
#   2. the kernels' GPU tests in bf16 and fp32 (test_rows_matmul.py, test_fused_rows.py);
#   3. π0.5 with 3 cameras, baseline and rows; 4. the launch-shape sweep (benchmarks.kernel_expert), as time allows.
# FLASHRT_CAMPAIGN_S (default 540) bounds the whole; the evidence is one tarball in OUT, rewritten after each step.
set -uo pipefail
OUT="${1:?output directory}"; mkdir -p "$OUT"
START=$(date +%s); LIMIT="${FLASHRT_CAMPAIGN_S:-540}"
left() { local l=$(( LIMIT - ($(date +%s) - START) )); echo $(( l > 5 ? l : 5 )); }
W=/tmp/campaign_kernels; mkdir -p "$W"
save() { tar -czf "$OUT/campaign_kernels.tar.gz" -C "$W" . 2>/dev/null; true; }
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit ${FLASHRT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; } 2>&1 | tee "$W/machine.txt"
timeout "$(( $(left) < 170 ? $(left) : 170 ))" python3 -m benchmarks.pi0_replan --kind pi0 --cameras 2 --profile \
  --json "$W/pi0_replan.json" 2>&1 | tee "$W/pi0_replan.txt"; save
timeout "$(( $(left) < 110 ? $(left) : 110 ))" python3 -m pytest -q -p no:cacheprovider test/test_rows_matmul.py \
  test/test_fused_rows.py 2>&1 | tee "$W/gpu_tests.txt"; save
timeout "$(( $(left) < 110 ? $(left) : 110 ))" python3 -m benchmarks.pi0_replan --kind pi05 --cameras 3 \
  --forms baseline,rows --json "$W/pi05_replan.json" 2>&1 | tee "$W/pi05_replan.txt"; save
timeout "$(left)" python3 -m benchmarks.kernel_expert --json "$W/kernel_expert.json" 2>&1 | tee "$W/kernel_expert.txt"
save
