#!/usr/bin/env bash
# What the robot sees on a lent GPU (issue 56, item 6): the policy node at its topics, sensor_msgs/Image cameras and a
# JointState published from another process at the control rate, commands counted from a third
# (benchmarks.robot_rate: rate, largest gap, stale flips, the causes of every gap over 1.5 periods). One device
# command a part, on one warm machine (/tmp is kept between them):
#   benchmarks/campaign_topics.sh build-pi0 OUT  π0's published-size checkpoint into /tmp/ck/pi0 (no ROS: carry .whl
#                                                and .whl-pi; with the ROS part the carry would pass 64 MiB)
#   benchmarks/campaign_topics.sh pi0 OUT        π0, published size, 2 cameras 224x224, bf16, 30 Hz, 120 s (carry
#                                                .ros312/part-aa alone: the checkpoint and wheels are on the machine)
#   benchmarks/campaign_topics.sh smolvla OUT    SmolVLA, published size, 3 cameras 256x256, bf16, 30 Hz, 120 s
#   benchmarks/campaign_topics.sh act OUT        ACT (ALOHA) and Diffusion (PushT), 50 Hz, 90 s each
# Goals (issue 56): >= 99.9 % of the rate, largest gap <= 1.5 periods. Every node runs its defaults (replan auto).
# Carry .ros312/part-aa (benchmarks/device_ros_env.sh pack: the ROS 2 runtime and our interfaces for the device's
# Python 3.12, 41 MB) and .whl (LeRobot's wheels, to build the checkpoints, 7 MB); π0 in two commands (above).
set -uo pipefail
PART="${1:?build-pi0, pi0, smolvla or act}"; OUT="${2:?output directory}"; W=/tmp/campaign_topics; TARBALL="campaign_topics_$PART.tar.gz"
source benchmarks/campaign_lib.sh
reference_wheels .whl-pi pi-reference /tmp/pi-ref
machine_note "topics"
mkdir -p /tmp/ck
if [ "$PART" = build-pi0 ]; then
  [ -f /tmp/ck/pi0/bench_case.json ] || timeout "$(upto 0)" python3 -c \
    "from pathlib import Path; from benchmarks.pi0 import build; build(Path('/tmp/ck/pi0'), 'pi0', 2, smoke=False)" \
    2>&1 | tail -3 | tee -a "$W/topics_log.txt"
  ls /tmp/ck/pi0 | tee -a "$W/topics_log.txt"; save; exit 0
fi
source benchmarks/device_ros_env.sh use || { echo "no ROS runtime: carry .ros312/part-aa"; exit 1; }
SECONDS_RUN="${FLASHRT_TOPIC_SECONDS:-120}"
rate() {  # rate POLICY HZ [ARGS...]: one robot_rate run, its JSON and table into W
  local policy="$1" hz="$2"; shift 2
  timeout "$(upto 5)" python3 -m benchmarks.robot_rate --policy "$policy" --device cuda --rate "$hz" \
    --seconds "$SECONDS_RUN" --timeline --driver-priority 50 --checkpoint "/tmp/ck/$policy" "$@" \
    --json "$W/robot_rate_${policy}_${hz}hz.json" > "$W/robot_rate_${policy}_${hz}hz.md" 2>&1
  echo "robot_rate $policy $hz Hz rc $?" | tee -a "$W/topics_log.txt"; tail -25 "$W/robot_rate_${policy}_${hz}hz.md"
  save
}
case "$PART" in
  pi0) rate pi0 30 --dtype bfloat16 --instruction "pick up the red cube and put it in the box" ;;   # benchmarks.pi0.TASK
  smolvla) rate smolvla 30 --dtype bfloat16 ;;
  act) SECONDS_RUN="${FLASHRT_TOPIC_SECONDS:-90}"; rate act 50; rate diffusion 50 ;;   # two in one command
  *) echo "unknown part $PART: pi0, smolvla or act"; exit 2 ;;
esac
save
