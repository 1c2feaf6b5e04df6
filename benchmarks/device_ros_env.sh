#!/usr/bin/env bash
# What the topic-level GPU benchmark (benchmarks.robot_rate --device cuda) needs on the device machine, which has
# Python 3.12, torch and CUDA but no ROS: the ROS 2 runtime (rclpy, Fast DDS, the message packages) for CPython
# 3.12 and this package's interfaces (msg/ srv/ action/) built for it. Built here, where PyPI and cmake are, into
# one prefix, then packed in parts of < 60 MiB (the device tool carries 64 MiB a call; ignored files left on a
# warm machine stay between calls).
#
#   benchmarks/device_ros_env.sh pack [python3.12]   # here: builds .ros312/prefix, writes .ros312/part-*
#   source benchmarks/device_ros_env.sh use          # there: unpacks the parts into /tmp/ros312, sets the paths
#
# The prefix holds no torch, numpy or LeRobot: the device's own are used.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.ros312"
say() { printf '[device_ros_env] %s\n' "$*" >&2; }

pack() (
  set -euo pipefail
  local py="${1:-python3.12}" venv="$OUT/venv"
  mkdir -p "$OUT"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # the ROS pins of requirements-lock.txt, their Python build dependencies, numpy for the rosidl build only
  grep -E '^(ros-|catkin-pkg|empy|lark-parser|numpy|packaging|pyparsing|python-dateutil|PyYAML|setuptools|six|docutils)' \
    "$ROOT/requirements-lock.txt" > "$OUT/requirements.txt"
  say "installing $(wc -l < "$OUT/requirements.txt") pinned packages for $("$venv/bin/python" -V)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$OUT/requirements.txt"
  "$venv/bin/python" "$ROOT/tools/fix_wheel_cmake_paths.py" "$venv" >/dev/null
  local build="$OUT/build"
  say "building the interfaces (msg/ srv/ action/) for it"
  PATH="$venv/bin:$PATH" cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$venv" \
    -DCMAKE_PREFIX_PATH="$venv" -DPython3_EXECUTABLE="$venv/bin/python" -DFLASHRT_INSTALL_LIBRARY=OFF \
    -DBUILD_TESTING=OFF > "$build.log" 2>&1 || { tail -30 "$build.log" >&2; exit 1; }
  PATH="$venv/bin:$PATH" cmake --build "$build" -j"$(nproc)" >> "$build.log" 2>&1 || { tail -30 "$build.log" >&2; exit 1; }
  cmake --install "$build" >> "$build.log" 2>&1
  PYTHONPATH="$ROOT" "$venv/bin/python" -c "import rclpy; from flashrt_ros.msg import EngineStatus" \
    || { say "the 3.12 prefix does not import rclpy and the interfaces"; exit 1; }
  # pack site-packages (without numpy and pip) and the shared libraries and ament index
  local site; site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -f "$OUT"/part-*
  (cd "$venv" && tar --exclude='numpy' --exclude='numpy-*' --exclude='numpy.libs' --exclude='pip' --exclude='pip-*' \
    --exclude='setuptools' --exclude='__pycache__' -czf - "lib/${site#"$venv/lib/"}" lib/*.so* lib/foonathan_memory share) \
    | split -b 60m - "$OUT/part-"
  say "packed: $(du -ch "$OUT"/part-* | tail -1 | cut -f1) in $(ls "$OUT"/part-* | wc -l) part(s): carry .ros312/part-aa, ..."
)

use() {
  local prefix=/tmp/ros312
  if [ ! -d "$prefix/lib" ]; then
    mkdir -p "$prefix" && cat "$OUT"/part-* | tar -C "$prefix" -xzf -
  fi
  local site; site="$(ls -d "$prefix"/lib/python3*/site-packages | head -1)"
  export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
  # what the wheels' bootstrapper (a .pth file: not read from PYTHONPATH) would set: the prefix's libraries
  # and every wheel's bundled ones
  local libs; libs="$(ls -d "$site"/ros_*.libs | tr '\n' ':')"
  export LD_LIBRARY_PATH="$prefix/lib:$libs${LD_LIBRARY_PATH:-}"
  export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
  export AMENT_PREFIX_PATH="$prefix"
  export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
  python3 -c "import rclpy; from flashrt_ros.msg import EngineStatus" && say "rclpy and the interfaces import"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  use) use ;;
  *) say "usage: $0 pack [python3.12] | source $0 use"; return 2 2>/dev/null || exit 2 ;;
esac
