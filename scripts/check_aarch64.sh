#!/usr/bin/env bash
# CI: do our runtime requirements install on a Jetson Thor (JetPack 7: Ubuntu 24.04, aarch64,
# Python 3.12)? Checked here, on any machine, from the package registry, without installing:
#   1. every runtime requirement (requirements.txt; requirements-model.txt without its
#      dependencies, as it is installed) resolves to WHEELS for manylinux_2_28_aarch64 / cp312:
#      `uv pip compile --only-binary :all: --python-platform aarch64-manylinux_2_28`. Why uv and
#      not `pip download --platform`: pip evaluates environment markers (platform_machine == ...)
#      for the machine it runs on, not the target, and downloads every wheel whole (torch and its
#      CUDA libraries: ~3 GB a run); uv evaluates them for aarch64 and reads only the wheels'
#      metadata (about 15 MB of cache). A requirement with no aarch64 wheel fails the step.
#   2. behaviortreepy (BehaviorTree.CPP trees) has wheels for x86_64 only. Its sdist is checked:
#      if it carries the binding's C++ source, it is built here from source (cmake, g++,
#      libzmq3-dev for Groot2), as pip would on a Thor, and the built module is imported; if
#      not (0.1.3 and 0.1.4 omit src/behavior_tree_wrapper.cpp: their .gitignore lists /src/
#      and scikit-build-core's sdist honours it), requirements.txt must keep its x86_64-only
#      marker, or `pip install -r requirements.txt` would fail on every aarch64 machine.
# docs/jetson.md gives the install lines this checks. Usage: scripts/check_aarch64.sh
# Env: FLASHRT_INDEX_URL (default https://pypi.org/simple), FLASHRT_AARCH64_DIR (work dir,
# default build/aarch64-check; its uv cache and built wheel make a re-run take seconds).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${FLASHRT_AARCH64_DIR:-$ROOT/build/aarch64-check}"
INDEX="${FLASHRT_INDEX_URL:-https://pypi.org/simple}"
UV_VERSION="0.13.9"
PLATFORM="aarch64-manylinux_2_28"
PYTHON_VERSION="3.12"
say() { printf '[check_aarch64] %s\n' "$*" >&2; }
mkdir -p "$WORK"
export UV_CACHE_DIR="$WORK/uv-cache"

# --- the resolver, pinned, in a venv of its own (never in .venv: nothing of ours changes) --------
if [ "$("$WORK/venv/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  say "installing uv $UV_VERSION into $WORK/venv"
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/python" -m pip install --disable-pip-version-check -q "uv==$UV_VERSION" \
    2> >(grep -v "is ignored: it is neither" >&2)
fi
UV="$WORK/venv/bin/uv"
compile() {   # compile OUT ARGS...: resolve for the Thor, wheels only
  local out="$1"; shift
  "$UV" pip compile --quiet --no-header --only-binary :all: --python-platform "$PLATFORM" \
    --python-version "$PYTHON_VERSION" --index-url "$INDEX" -o "$out" "$@"
}

# --- 1. every runtime requirement, wheels only -------------------------------------------------
say "resolving requirements.txt for $PLATFORM / cp${PYTHON_VERSION/./} (wheels only) from $INDEX"
if ! compile "$WORK/requirements.aarch64.txt" "$ROOT/requirements.txt"; then
  say "FAILED: a runtime requirement has no $PLATFORM / cp${PYTHON_VERSION/./} wheel (above); a Thor install would"
  say "build it from source or fail. Fix requirements.txt (a range with wheels, or a marker) and docs/jetson.md."
  exit 1
fi
compile "$WORK/requirements-model.aarch64.txt" --no-deps "$ROOT/requirements-model.txt" \
  || { say "FAILED: requirements-model.txt has no wheel for $PLATFORM"; exit 1; }
say "resolved $(grep -c '==' "$WORK/requirements.aarch64.txt") packages: $(grep -E '^(torch|triton|numpy|transformers|nvidia-cudnn-cu1[0-9])==' \
  "$WORK/requirements.aarch64.txt" | tr '\n' ' ')"

# --- 2. behaviortreepy on aarch64: from its sdist, if the sdist can build -----------------------
BT_REQ="$(grep -E '^behaviortreepy' "$ROOT/requirements.txt" | cut -d';' -f1 | tr -d ' ')"
[ -n "$BT_REQ" ] || { say "FAILED: requirements.txt has no behaviortreepy line"; exit 1; }
if compile "$WORK/behaviortreepy.aarch64.txt" --no-deps <(echo "$BT_REQ") 2>/dev/null; then
  say "behaviortreepy now has an aarch64 wheel ($(cat "$WORK/behaviortreepy.aarch64.txt")): drop its"
  say "platform_machine marker in requirements.txt and update docs/jetson.md"
  exit 1
fi
rm -rf "$WORK/sdist" && mkdir -p "$WORK/sdist"
python3 -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: --index-url "$INDEX" \
  -d "$WORK/sdist" "$BT_REQ" 2> >(grep -v "is ignored: it is neither" >&2)
SDIST="$(ls "$WORK"/sdist/behaviortreepy-*.tar.gz)"
if ! tar tzf "$SDIST" | grep -q '/src/behavior_tree_wrapper.cpp$'; then
  say "$(basename "$SDIST") has no aarch64 wheel, and its sdist lacks the binding's source"
  say "(src/behavior_tree_wrapper.cpp): it cannot be built on a Thor from PyPI (docs/jetson.md says how)."
  if grep -E '^behaviortreepy' "$ROOT/requirements.txt" | grep -q 'platform_machine == "x86_64"'; then
    say "requirements.txt keeps behaviortreepy x86_64-only, so a Thor install succeeds without it: OK"
    exit 0
  fi
  say "FAILED: requirements.txt asks for behaviortreepy on aarch64, where pip would fail on this sdist"
  exit 1
fi
say "building $(basename "$SDIST") from source (BehaviorTree.CPP and the binding: cmake, g++)"
[ -f /usr/include/zmq.h ] || say "no libzmq3-dev here: the build will say so (Groot2 needs ZeroMQ)"
KEY="$(sha256sum "$SDIST" | cut -c1-16)-$(g++ -dumpfullversion)"
WHEELS="$WORK/wheels/$KEY"
if ! ls "$WHEELS"/behaviortreepy-*.whl >/dev/null 2>&1; then
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" python3 -m pip wheel --disable-pip-version-check \
    -q --no-deps --index-url "$INDEX" -w "$WHEELS" "$SDIST" 2> >(grep -v "is ignored: it is neither" >&2) \
    || { say "FAILED: $(basename "$SDIST") does not build from source"; exit 1; }
fi
rm -rf "$WORK/bt-import" && python3 -m pip install --disable-pip-version-check -q --no-deps \
  --target "$WORK/bt-import" "$WHEELS"/behaviortreepy-*.whl 2> >(grep -v "is ignored" >&2)
PYTHONPATH="$WORK/bt-import" python3 -c "import behaviortreepy as bt; bt.BehaviorTreeFactory()" \
  || { say "FAILED: the behaviortreepy built from source does not import"; exit 1; }
say "behaviortreepy built from its sdist and imports: drop its x86_64 marker in requirements.txt"
