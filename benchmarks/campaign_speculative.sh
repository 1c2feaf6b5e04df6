#!/usr/bin/env bash
# One device command for issue #57 (speculative decoding), ten minutes at most. Needs only the GPU image (torch).
# Usage: benchmarks/campaign_speculative.sh OUT
#   1. token identity on the trained hybrid (test/data/tiny_hybrid_trained) through captured graphs, bf16 and fp32,
#      k = 1..8, near-ties counted, the broken rollback caught in the same run (benchmarks.speculative_identity);
#   2. the trained head's acceptance and speed (benchmarks.speculative --checkpoint ..., k = 1..4);
#   3. real size (0.81B hybrid, bf16): plain vs oracle at 100 / 70 / 40 % acceptance, k = 1..4, 2k and 16k context,
#      the permutation read-out (timing only, labelled so in the JSON), the decode step against its floor.
# FLASHRT_CAMPAIGN_S (default 540) bounds the whole; the evidence is one tarball in OUT, rewritten after each step.
set -uo pipefail
OUT="${1:?output directory}"; mkdir -p "$OUT"
START=$(date +%s); LIMIT="${FLASHRT_CAMPAIGN_S:-540}"
left() { local l=$(( LIMIT - ($(date +%s) - START) )); echo $(( l > 5 ? l : 5 )); }
W=/tmp/campaign_speculative; mkdir -p "$W"
save() { tar -czf "$OUT/campaign_speculative.tar.gz" -C "$W" . 2>/dev/null; true; }
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
  echo "commit ${FLASHRT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; } 2>&1 | tee "$W/machine.txt"
timeout "$(( $(left) < 150 ? $(left) : 150 ))" python3 -m benchmarks.speculative_identity --out "$W" 2>&1 \
  | tee "$W/identity.txt"; save
timeout "$(( $(left) < 90 ? $(left) : 90 ))" python3 -m benchmarks.speculative \
  --checkpoint test/data/tiny_hybrid_trained --contexts 256 --tokens 1 2 3 4 --new-tokens 128 --prefill-chunk 256 \
  --out "$W/trained" 2>&1 | tee "$W/trained.txt"; save
timeout "$(left)" python3 -m benchmarks.speculative --tokens 1 2 3 4 --out "$W/real_size" 2>&1 \
  | tee "$W/real_size.txt"; save
# 4. as time allows: where the plain decode step's time goes (item 4: the floor), graph vs host, kernels by kind
timeout "$(( $(left) < 60 ? $(left) : 60 ))" python3 -m benchmarks.kernel_decode_overhead 2>&1 \
  | tee "$W/decode_overhead.txt"; save
timeout "$(left)" python3 - <<'PY' 2>&1 | tee "$W/decode_anatomy.txt"; save
import json, torch
from benchmarks.anatomy import forward_anatomy
from benchmarks.models import build_hybrid
pair = build_hybrid(torch.device("cuda"), torch.bfloat16, 0, quick=False)
print(json.dumps(forward_anatomy(pair.ours, 2048, torch.device("cuda"), 1), indent=1, default=str))
PY
