#!/usr/bin/env bash
# One device command for issue #57's decode step (the floor goal, SmolLM2's 0.4 ms), ten minutes at most; needs only
# the GPU image (torch, triton). Usage: benchmarks/campaign_decode.sh OUT
#   1. the fused products' GPU tests (test_triton_gemv_fused: against the unfused kernels and torch;
#      test_models_cuda: a decode step takes them, logits within the bf16 band; test_triton_attention: the merged
#      split attention among the rest);
#   2. SmolLM2-135M and the hybrid 0.81B, decode step unfused, fused and fused with the merged attention, in one run
#      each, the logits checked against a bound declared before and a swapped-norm self-test that must fail it
#      (benchmarks.kernel_decode_fusion);
#   3. the GEMV launch-shape sweep and the fused work's cost (benchmarks.kernel_gemv).
# FLASHRT_CAMPAIGN_S (default 560) bounds the whole; the evidence is one tarball in OUT, rewritten after each step.
set -uo pipefail
OUT="${1:?output directory}"; mkdir -p "$OUT"
START=$(date +%s); LIMIT="${FLASHRT_CAMPAIGN_S:-560}"
left() { local l=$(( LIMIT - ($(date +%s) - START) )); echo $(( l > 5 ? l : 5 )); }
W=/tmp/campaign_decode; mkdir -p "$W"
save() { tar -czf "$OUT/campaign_decode.tar.gz" -C "$W" . 2>/dev/null; cp -f "$W"/*.txt "$OUT"/ 2>/dev/null; true; }
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit ${FLASHRT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; } 2>&1 | tee "$W/machine.txt"
timeout "$(( $(left) < 150 ? $(left) : 150 ))" python3 -m pytest -q -p no:cacheprovider -rs \
  test/test_triton_gemv_fused.py test/test_models_cuda.py test/test_triton_attention.py 2>&1 | tail -15 \
  | tee "$W/gpu_tests_decode.txt"; save
for model in smollm2 hybrid; do
  timeout "$(( $(left) < 120 ? $(left) : 120 ))" python3 -m benchmarks.kernel_decode_fusion --model "$model" \
    --json "$W/decode_fusion_$model.json" 2>&1 | tee "$W/decode_fusion_$model.txt"; save
done
timeout "$(left)" python3 -m benchmarks.kernel_gemv 2>&1 | tee "$W/kernel_gemv.txt"; save
