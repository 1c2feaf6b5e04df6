#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go: the GPU tests, kernel and capsule benchmarks, the LLM benchmark,
# and the policy races against LeRobot.
# Usage (from the repository root):
#   benchmarks/run_gpu_suite.sh OUT_DIR [TIME_BUDGET_S] [PHASES] [-- extra args of python -m benchmarks.llm]
#   PHASES: comma-separated subset of tests,kernels,capsules,race,smolvla,smolvla-tests,realtime,pi0,sessions,llm,
#           speculative
#           (default: tests,capsules,llm; "policies" is the old name of "race")
#   race: ACT + Diffusion Policy, fp32 + bf16, ours vs LeRobot eager / autocast / compiled (benchmarks.policies),
#         bounded by FLASHRT_RACE_BUDGET_S (default 400 s: compiled LeRobot modes that would not fit are skipped
#         and named in the report); about 7-8 minutes on an H100 / H200
#   smolvla: the same race for SmolVLA (benchmarks.smolvla), bounded the same way; smolvla-tests: its GPU tests
#   Both need the LeRobot reference wheels (num2words included for SmolVLA) in .whl/.
#   realtime: planning beside the loop: its GPU tests, then benchmarks.realtime loop (SmolVLA published size, bf16;
#             Diffusion and ACT at their benchmark sizes) at 30 and 50 Hz (FLASHRT_REALTIME_S seconds per run, 20)
#   pi0: the π0 / π0.5 GPU tests that need no reference process (captured bodies, re-instruct, fast vs exact) and
#        the fused row kernels' tests
#   pi-race: benchmarks.pi0 at the published size (FLASHRT_PI_KIND pi0|pi05, FLASHRT_PI_CAMERAS, FLASHRT_PI_DTYPES,
#        FLASHRT_PI_SIDES, FLASHRT_PI_TIMEOUT_S per LeRobot process, FLASHRT_PI_ATTENTION sdpa|kernel): ours fast / exact with the kernel profile,
#        LeRobot eager and compiled, every side checked against LeRobot eager float32. Needs the LeRobot reference
#        wheels in .whl/ (scripts/reference_wheels.sh, without av: .stub/av stands in), transformers 4.53.2 with
#        tokenizers 0.21.4 and huggingface-hub 0.35.3 in .whl-pi/ (installed to /tmp/pi-ref = .venv/pi-reference)
#   speculative: the speculative-decoding tests (CUDA graphs of the verify step, the T-token Gated DeltaNet kernel,
#        MTP parity, verdicts, the engine's exactness tests) and benchmarks.speculative (0.81B hybrid, bf16, contexts
#        2k and 16k, k = 3: plain vs oracle drafter at 100 / 70 / 40 % vs the MTP head) into OUT
#   FLASHRT_PHASE_TIMEOUT_S (default 600) bounds each phase, so one slow phase cannot eat the others'.
#   FLASHRT_COMMIT / FLASHRT_DIRTY name the code in every JSON when the copy has no .git (benchmarks/provenance.py).
# Wheels the GPU image lacks (fla) may be given in .whl/ (installed to /tmp/site).
set -uo pipefail
PT="${FLASHRT_PHASE_TIMEOUT_S:-600}"
OUT="${1:?output directory}"; BUDGET="${2:-300}"; PHASES="${3:-tests,capsules,llm}"
shift $(( $# < 3 ? $# : 3 )); [ "${1:-}" = "--" ] && shift
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
if ls .whl-pi/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pi-ref \
    .whl-pi/*.whl && mkdir -p .venv && ln -sfn /tmp/pi-ref .venv/pi-reference
fi
[ -d .stub ] && export PYTHONPATH="$PYTHONPATH:$PWD/.stub"     # stand-ins for wheels too large to carry (av)
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" || echo "fla not importable"; } 2>&1 | tee "$OUT/machine.txt"
case ",$PHASES," in *,tests,*)
  workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${FLASHRT_TEST_WORKERS:-8}" || echo "")
  timeout "$PT" python3 -m pytest -q -p no:cacheprovider $workers --durations=12 \
    test/test_lerobot_cuda_graph.py test/test_triton_attention.py test/test_triton_gated_deltanet.py test/test_triton_fused_ops.py \
    test/test_models_cuda.py test/test_runtime_cuda.py test/test_hybrid_cuda.py \
    test/test_engine_cuda_graphs.py test/test_policy_cuda_graph.py test/test_lerobot_precision.py \
    test/test_triton_group_norm.py test/test_async_replan_cuda.py 2>&1 | tee "$OUT/gpu_tests.txt" ;;
esac
case ",$PHASES," in *,kernels,*)
  python3 -m benchmarks.kernel_attention --short 2>&1 | tee "$OUT/kernel_attention_short.txt" ;;
esac
case ",$PHASES," in *,capsules,*)
  timeout "$PT" python3 -m benchmarks.capsules --out "$OUT/capsules.md" 2>&1 ;;
esac
RB="${FLASHRT_RACE_BUDGET_S:-400}"
case ",$PHASES," in *,race,*|*,policies,*)
  timeout "$PT" python3 -m benchmarks.policies --time-budget-s "$RB" --out "$OUT/lerobot_policies_race.md" \
    --png "$OUT/lerobot_policies_race.png" --json "$OUT/lerobot_policies_race.json" 2>&1 | tee "$OUT/race_log.txt" ;;
esac
case ",$PHASES," in *,smolvla-tests,*)
  timeout "$PT" python3 -m pytest -q -p no:cacheprovider -s test/test_smolvla_cuda.py 2>&1 | tee "$OUT/smolvla_gpu_tests.txt" ;;
esac
case ",$PHASES," in *,smolvla,*)
  timeout "$PT" python3 -m benchmarks.smolvla --time-budget-s "$RB" --out "$OUT/smolvla_race.md" \
    --json "$OUT/smolvla_race.json" 2>&1 | tee "$OUT/smolvla_log.txt" ;;
esac
case ",$PHASES," in *,realtime,*)
  RS="${FLASHRT_REALTIME_S:-20}"
  timeout "$PT" python3 -m pytest -q -p no:cacheprovider test/test_async_replan_cuda.py 2>&1 | tee "$OUT/realtime_gpu_tests.txt"
  timeout "$PT" python3 -m benchmarks.realtime loop --policy smolvla --size full --device cuda --dtype bfloat16 \
    --rates 30 50 --seconds "$RS" --json "$OUT/realtime_smolvla.json" --md "$OUT/realtime_smolvla.md" 2>&1 | tee "$OUT/realtime_log.txt"
  for policy in diffusion act; do
    timeout "$PT" python3 -m benchmarks.realtime loop --policy "$policy" --size full --device cuda --dtype bfloat16 \
      --rates 50 --modes sync async blend --seconds "$RS" --json "$OUT/realtime_$policy.json" \
      --md "$OUT/realtime_$policy.md" 2>&1 | tee -a "$OUT/realtime_log.txt"
  done ;;
esac
case ",$PHASES," in *,pi0,*)
  timeout "$PT" python3 -m pytest -q -p no:cacheprovider -s test/test_fused_rows.py test/test_pi0_cuda.py \
    -k "not published" 2>&1 | tee "$OUT/pi0_gpu_tests.txt" ;;
esac
case ",$PHASES," in *,pi-race,*)
  kind="${FLASHRT_PI_KIND:-pi0}"; cams="${FLASHRT_PI_CAMERAS:-2}"; ckpt="/tmp/${kind}_${cams}cam"
  [ -f "$ckpt/bench_case.json" ] || timeout "$PT" python3 -m benchmarks.pi0 --kind "$kind" --cameras "$cams" \
    --build "$ckpt" 2>&1 | tail -5
  timeout "$PT" python3 -m benchmarks.pi0 --checkpoint "$ckpt" --dtypes "${FLASHRT_PI_DTYPES:-bfloat16}" \
    --sides "${FLASHRT_PI_SIDES:-ours-fast,ours-exact,lerobot,compiled}" --profile --episodes 3 --draws 5 \
    --attention "${FLASHRT_PI_ATTENTION:-sdpa}" \
    --timeout "${FLASHRT_PI_TIMEOUT_S:-600}" --json "$OUT/${kind}_${cams}cam.json" --out "$OUT/${kind}_${cams}cam.md" \
    2>&1 | tee "$OUT/${kind}_race_log.txt" ;;
esac
case ",$PHASES," in *,sessions,*)
  for model in random-hybrid-tiny random-llama-tiny; do
    timeout "$PT" python3 -m benchmarks.sessions --model "$model" --positions 16 128 512 --reps 200 2>&1
  done | tee "$OUT/sessions_h200.md" ;;
esac
case ",$PHASES," in *,speculative,*)
  timeout "$PT" python3 -m pytest -q -p no:cacheprovider --durations=8 test/test_engine_cuda_graphs.py \
    test/test_triton_gated_deltanet.py test/test_hybrid_mtp.py test/test_speculation_verdict.py \
    test/test_engine_speculative.py 2>&1 | tee "$OUT/speculative_gpu_tests.txt"
  timeout "$PT" python3 -m benchmarks.speculative --device cuda --out "$OUT" 2>&1 | tee "$OUT/speculative_log.txt" ;;
esac
case ",$PHASES," in *,llm,*)
  timeout "$PT" python3 -m benchmarks.llm --device cuda --smollm2-random --time-budget-s "$BUDGET" --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/llm_log.txt" ;;
esac
