#!/usr/bin/env bash
# Regenerates the arm's demonstrations and both trained checkpoints, reproducibly (pinned seeds):
#   1. the training venv (.venv-train/, setup_train_venv.sh: LeRobot 0.4.4 and exact pins),
#   2. 300 scripted-expert episodes as a LeRobotDataset on local disk (record.py, seeds 100000...),
#   3. ACT and Diffusion Policy trained by LeRobot's own entry point (lerobot_train_cpu.py = lerobot-train;
#      local root, no hub, no wandb, --seed 0, CPU, one thread),
#   4. export.py: the last checkpoint's pretrained_model/ with fp16 weights into
#      flashrt_ros/sim/checkpoints/arm_{act,diffusion}/, plus training_log.json (loss per logged step,
#      wall time, machine, versions, command line).
# Usage: examples/train_arm/train.sh [act|diffusion|all]   (WORK=/tmp/arm_train by default)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${WORK:-/tmp/arm_train}"
PY="$ROOT/.venv-train/bin/python"
WHICH="${1:-all}"
# One thread: on a shared 2-core machine torch's two OpenMP threads ran a 128x512 matmul 8x slower
# than one (18 ms vs 2.3 ms, measured 2026-12-03).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled

"$HERE/setup_train_venv.sh"
mkdir -p "$WORK"
if [ ! -f "$WORK/arm_reach/meta/info.json" ]; then
  "$PY" "$HERE/record.py" --root "$WORK/arm_reach" --episodes 300 --steps 150 --seed 0
fi

COMMON=(--dataset.repo_id=local/arm_reach "--dataset.root=$WORK/arm_reach" --policy.device=cpu
        --policy.push_to_hub=false --wandb.enable=false --seed=0 --num_workers=0 --log_freq=100)
ACT=(--policy.type=act --steps=3000 --batch_size=32 --save_freq=3000
     --policy.dim_model=64 --policy.dim_feedforward=256 --policy.n_heads=4 --policy.n_encoder_layers=2
     --policy.n_decoder_layers=1 --policy.use_vae=false --policy.chunk_size=20 --policy.n_action_steps=10
     --policy.optimizer_lr=1e-3 --policy.dropout=0.0
     '--policy.normalization_mapping={"VISUAL":"MEAN_STD","STATE":"MEAN_STD","ENV":"MEAN_STD","ACTION":"MEAN_STD"}')
DIFFUSION=(--policy.type=diffusion --steps=3000 --batch_size=32 --save_freq=3000
     --policy.n_obs_steps=2 --policy.horizon=16 --policy.n_action_steps=8 --policy.down_dims=[32,64,128]
     --policy.diffusion_step_embed_dim=32 --policy.noise_scheduler_type=DDIM --policy.num_train_timesteps=100
     --policy.num_inference_steps=10 --policy.optimizer_lr=1e-3 --policy.scheduler_warmup_steps=200
     '--policy.normalization_mapping={"VISUAL":"MEAN_STD","STATE":"MIN_MAX","ENV":"MIN_MAX","ACTION":"MIN_MAX"}')

train() {   # name, flags...
  local name="$1"; shift
  rm -rf "$WORK/$name"
  local t0; t0=$(date +%s.%N)
  "$PY" "$HERE/lerobot_train_cpu.py" "${COMMON[@]}" "$@" "--output_dir=$WORK/$name" 2>&1 | tee "$WORK/$name.log" \
    | grep --line-buffered -E "step:|End of training|Error" || true
  local t1; t1=$(date +%s.%N)
  "$PY" "$HERE/export.py" --run "$WORK/$name" --log "$WORK/$name.log" --wall-s "$(echo "$t1 - $t0" | bc)" \
    --out "$ROOT/flashrt_ros/sim/checkpoints/arm_$name" -- "${COMMON[@]}" "$@"
}
case "$WHICH" in
  act) train act "${ACT[@]}" ;;
  diffusion) train diffusion "${DIFFUSION[@]}" ;;
  all) train act "${ACT[@]}"; train diffusion "${DIFFUSION[@]}" ;;
  *) echo "usage: $0 [act|diffusion|all]" >&2; exit 2 ;;
esac
