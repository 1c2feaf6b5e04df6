#!/usr/bin/env bash
# The π0 campaign on one lent GPU, in device commands on one warm machine (/tmp is kept between them):
#   benchmarks/campaign_pi0.sh 1 OUT   the kernels' GPU tests; the published-size checkpoint built; the race's
#                                      references (LeRobot eager float32 on the checkpoint's weights and on its bf16
#                                      weights with exact RoPE frequencies, cached); ours-fast bf16, checked and
#                                      profiled (benchmarks.pi0); ours-fast float32 and its zero-head self-test
#                                      against the float32 reference (bound 1e-3: the check with power)
#   benchmarks/campaign_pi0.sh 2 OUT   LeRobot compiled (reduce-overhead: ~340 s of compiling) into the same JSON,
#                                      checked against the cached references
#   benchmarks/campaign_pi0.sh 3 OUT   the bf16 self-tests, which must fail ours-fast's bf16 bound; ours-fp8; our
#                                      replan in three forms (benchmarks.pi0_replan, no LeRobot); the rounding
#                                      measured on this GPU on the race's checkpoint (benchmarks.check_power
#                                      --device cuda: to set beside the CPU's); the kernel sweep
#   benchmarks/campaign_pi0.sh f32 OUT the checkpoint built and part 1's float32 rows alone (a rerun after a fix)
#   benchmarks/campaign_pi0.sh kernels OUT   no LeRobot, a few minutes: the kernels' GPU tests, the launch-shape
#                                      sweep (benchmarks.kernel_expert --quick) and our replan in the forms rows and
#                                      merged (split-K o / down, attention merged in-kernel), profiled: whether the
#                                      merged form earns its place as the default before a race spends ten minutes
#   benchmarks/campaign_pi0.sh tests OUT    the VLAs' GPU tests (test_pi0_cuda: captured fast bodies, the bf16 cast
#                                      at the published size against LeRobot; test_smolvla_cuda: its few-row
#                                      kernels; test_groot_cuda) with the time they need (150 s cut test_pi0_cuda
#                                      short on 2026-12-07)
# On 2026-12-07 part 1 (then holding fp8 too) ran past its limit and part 2 was mostly compiling: hence three parts.
# FLASHRT_KIND=pi05 FLASHRT_CAMERAS=3 runs the same campaign for π0.5 with three cameras (its own checkpoint, JSON and
# references; default pi0, 2 cameras).
# Carry .whl (scripts/reference_wheels.sh 3.12, without av: benchmarks/device_stubs/av stands in) and .whl-pi
# (transformers 4.53.2, tokenizers 0.21.4, huggingface-hub 0.35.3). Every step is bounded so a command ends inside
# the device's 10 minutes; what finished is copied to OUT after each step.
set -uo pipefail
PART="${1:?part 1, f32, kernels, tests, 2 or 3}"; OUT="${2:?output directory}"; W=/tmp/campaign; TARBALL="campaign_part$PART.tar.gz"
source benchmarks/campaign_lib.sh
reference_wheels .whl-pi pi-reference /tmp/pi-ref
machine_note "${FLASHRT_KIND:-pi0} ${FLASHRT_CAMERAS:-2} cameras"
KIND="${FLASHRT_KIND:-pi0}"; CAMERAS="${FLASHRT_CAMERAS:-2}"; CASE="${KIND}_${CAMERAS}cam"
CKPT="/tmp/$CASE"; CACHE=/tmp/refcache
RACE=(python3 -m benchmarks.pi0 --checkpoint "$CKPT" --dtypes bfloat16 --attention kernel --episodes 3 --draws 3
      --reference-cache "$CACHE" --json "$W/$CASE.json" --out "$W/$CASE.md")
build() {
  [ -f "$CKPT/bench_case.json" ] || timeout "$(upto 0)" python3 -m benchmarks.pi0 --kind "$KIND" --cameras "$CAMERAS" \
    --build "$CKPT" 2>&1 | tail -3 | tee -a "$W/pi0_race_log.txt"
}
float32_rows() {
  timeout "$(upto 10)" "${RACE[@]/bfloat16/float32}" --sides ours-fast,selftest-zero-head 2>&1 \
    | tee -a "$W/pi0_race_log.txt"; echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/pi0_race_log.txt"; save
}
if [ "$PART" = 1 ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider test/test_rows_matmul.py test/test_fused_rows.py 2>&1 \
    | tee "$W/gpu_tests_kernels.txt"; save
  build
  timeout "$(upto 150)" "${RACE[@]}" --sides ours-fast --profile 2>&1 \
    | tee -a "$W/pi0_race_log.txt"; echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/pi0_race_log.txt"; save
  float32_rows
elif [ "$PART" = f32 ]; then
  build
  float32_rows
elif [ "$PART" = kernels ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider test/test_rows_matmul.py test/test_fused_rows.py 2>&1 \
    | tee "$W/gpu_tests_kernels.txt"; save
  timeout 200 python3 -m benchmarks.kernel_expert --quick --json "$W/kernel_expert.json" 2>&1 \
    | tee "$W/kernel_expert.txt"; save
  timeout "$(upto 5)" python3 -m benchmarks.pi0_replan --kind "$KIND" --cameras "$CAMERAS" --forms rows,merged \
    --profile --json "$W/${KIND}_replan_merged.json" 2>&1 | tee "$W/${KIND}_replan_merged.txt"; save
elif [ "$PART" = tests ]; then
  timeout "$(upto 10)" python3 -m pytest -q -p no:cacheprovider -rs test/test_pi0_cuda.py test/test_smolvla_cuda.py \
    test/test_groot_cuda.py 2>&1 | tail -30 | tee "$W/gpu_tests_vla.txt"; save
elif [ "$PART" = 2 ]; then
  timeout "$(upto 20)" "${RACE[@]}" --sides compiled 2>&1 | tee -a "$W/pi0_race_log.txt"
  echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/pi0_race_log.txt"; save
else
  timeout "$(( $(left) / 2 ))" "${RACE[@]}" --sides selftest-skip-layer,selftest-zero-head,ours-fp8 2>&1 \
    | tee -a "$W/pi0_race_log.txt"; echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/pi0_race_log.txt"; save
  timeout "$(( $(left) / 3 ))" python3 -m benchmarks.pi0_replan --kind "$KIND" --cameras "$CAMERAS" \
    --forms baseline,split,rows,merged --json "$W/${KIND}_replan.json" 2>&1 | tee "$W/${KIND}_replan.txt"; save
  timeout "$(upto 60)" python3 -m benchmarks.check_power --checkpoint "$CKPT" --references \
    --reference-cache "$CACHE" --device cuda --json "$W/check_power_${CASE}_gpu.json" 2>&1 \
    | tee "$W/check_power_$CASE.txt"; save
  timeout "$(upto 0)" python3 -m benchmarks.kernel_expert --quick --json "$W/kernel_expert.json" 2>&1 \
    | tee "$W/kernel_expert.txt"; save
fi
save
