# What the VLA campaigns (campaign_pi0.sh, campaign_groot.sh) do before their steps, sourced once PART, OUT, W (the
# work folder, kept in the device's /tmp between commands) and TARBALL (the evidence's name in OUT) are set:
# the clock (left, upto), save, the LeRobot wheels installed once, PYTHONPATH, the commit.
# Why one place: a fix to one campaign's clock or set-up (a negative timeout when a part runs short) reaches both.
mkdir -p "$OUT" "$W"
START=$(date +%s); LIMIT="${FLASHRT_CAMPAIGN_S:-570}"
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
upto() { local l=$(( $(left) - $1 )); echo $(( l > 5 ? l : 5 )); }      # what is left less $1 s, at least 5 s
save() { tar -czf "$OUT/$TARBALL" -C "$W" . 2>/dev/null; cp -f "$W"/*.md "$OUT"/ 2>/dev/null; true; }
# wheels DIR TARGET: DIR's wheels installed into TARGET once (carried in; the device reaches no index)
wheels() {
  if [ ! -d "$2" ] && ls "$1"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$2" "$1"/*.whl
  fi
}
# reference_env NAME TARGET: .venv/NAME points at TARGET (the device's fresh copy has no .venv); a machine with a
# real .venv/NAME keeps it
reference_env() {
  [ -d ".venv/$1" ] && [ ! -L ".venv/$1" ] || { mkdir -p .venv && ln -sfn "$2" ".venv/$1"; }
}
# reference_wheels DIR NAME TARGET: a reference environment's wheels (DIR) installed into TARGET once and
# .venv/NAME pointing at it (π0's transformers 4.53 in pi-reference, GR00T's 4.57 in groot-reference)
reference_wheels() { wheels "$1" "$3"; reference_env "$2" "$3"; }
wheels .whl /tmp/site                # LeRobot 0.4.4's wheels (scripts/reference_wheels.sh 3.12)
export PYTHONPATH="/tmp/site:$PWD:$PWD/benchmarks/device_stubs" PYTHONUNBUFFERED=1
export FLASHRT_COMMIT="${FLASHRT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
# machine_note WORDS...: the card, its driver and clocks, torch and triton, the commit, the part and WORDS
machine_note() {
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    echo "commit $FLASHRT_COMMIT part $PART $*"; } 2>&1 | tee -a "$W/machine.txt"
}
