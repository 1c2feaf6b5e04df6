#!/usr/bin/env bash
# The GR00T N1.5 race (benchmarks.groot) on one lent GPU, in device commands on one warm machine (/tmp is kept
# between them):
#   benchmarks/campaign_groot.sh 1 OUT   the GPU tests on the tiny checkpoint (test_groot_cuda: graphs vs eager,
#                                        capsules through the graphs, the GPU vs the CPU); the published-size
#                                        checkpoint built by LeRobot's classes (GR00T-N1.5-3B
#                                        shapes, seeded weights, CPU, ~19 GB written: base + checkpoint); the
#                                        float32 reference (LeRobot eager, TF32 off, cached); ours-fast checked; the
#                                        self-test (a DiT block skipped), which must fail the same bound; then
#                                        LeRobot eager timed if the part's time allows
#   benchmarks/campaign_groot.sh 2 OUT   LeRobot eager (if part 1 had no time for it), then LeRobot compiled
#                                        (torch.compile of the Eagle backbone and the DiT, reduce-overhead) into the
#                                        same JSON, checked against the cached reference
#   benchmarks/campaign_groot.sh 3 OUT   bf16 as LeRobot's use_bf16 runs it (autocast over float32 weights) on every
#                                        side: ours-fast, the self-test, LeRobot eager, then LeRobot compiled, in the
#                                        row groot|2|bfloat16 of the same JSON, against the same float32 reference
# Carry .whl (LeRobot 0.4.4's wheels: scripts/reference_wheels.sh 3.12, without av: benchmarks/device_stubs/av
# stands in) and .whl-groot (transformers 4.57.6, tokenizers 0.22.2, huggingface-hub 0.36.0, the pins of
# requirements-groot-reference.txt: scripts/reference_wheels.sh 3.12 groot), e.g. run(carry=[".whl", ".whl-groot"]).
# Nothing else: GR00T's Eagle assets are written by the harness (test/groot_reference/assets.py), peft and dm-tree
# are stubbed (test/groot_reference/env.py). Every step is bounded so a command ends inside the device's 10 minutes;
# what finished is copied to OUT after each step.
set -uo pipefail
PART="${1:?part 1, 2 or 3}"; OUT="${2:?output directory}"; W=/tmp/campaign_groot
TARBALL="campaign_groot_part$PART.tar.gz"
source benchmarks/campaign_lib.sh
reference_wheels .whl-groot groot-reference /tmp/groot-ref       # groot_reference.GROOT_REFERENCE_DIR
machine_note
ls /tmp/groot-ref | grep dist-info | tee -a "$W/machine.txt"
CKPT=/tmp/groot_2cam; CACHE=/tmp/refcache
RACE=(python3 -m benchmarks.groot --checkpoint "$CKPT" --episodes 3 --draws 3 --reference-cache "$CACHE"
      --json "$W/groot_2cam.json" --out "$W/groot_2cam.md")
if [ "$PART" = 1 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rs -s test/test_groot_cuda.py 2>&1 | tail -15 \
    | tee "$W/gpu_tests_groot.txt"; save
  [ -f "$CKPT/bench_case.json" ] || timeout "$(upto 0)" python3 -m benchmarks.groot --build "$CKPT" --threads 16 \
    2>&1 | tail -3 | tee -a "$W/groot_race_log.txt"
  du -sh "$CKPT" 2>&1 | tee -a "$W/groot_race_log.txt"; save
  timeout "$(upto 20)" "${RACE[@]}" --sides ours-fast,selftest-skip-dit-block 2>&1 \
    | tee -a "$W/groot_race_log.txt"; echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
  if [ "$(left)" -gt 150 ]; then
    timeout "$(upto 20)" "${RACE[@]}" --sides lerobot 2>&1 | tee -a "$W/groot_race_log.txt"
    echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
  fi
elif [ "$PART" = 3 ]; then
  timeout "$(( $(left) / 2 ))" "${RACE[@]}" --dtypes bfloat16 --sides ours-fast,selftest-skip-dit-block,lerobot 2>&1 \
    | tee -a "$W/groot_race_log.txt"; echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
  timeout "$(upto 20)" "${RACE[@]}" --dtypes bfloat16 --sides compiled 2>&1 | tee -a "$W/groot_race_log.txt"
  echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
else
  if ! grep -q '"lerobot"' "$W/groot_2cam.json" 2>/dev/null; then
    timeout "$(( $(left) / 3 ))" "${RACE[@]}" --sides lerobot 2>&1 | tee -a "$W/groot_race_log.txt"
    echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
  fi
  timeout "$(upto 20)" "${RACE[@]}" --sides compiled 2>&1 | tee -a "$W/groot_race_log.txt"
  echo "race rc ${PIPESTATUS[0]}" | tee -a "$W/groot_race_log.txt"; save
fi
save
