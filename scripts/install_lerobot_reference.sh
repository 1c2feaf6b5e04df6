#!/usr/bin/env bash
# Installs the LeRobot test reference (requirements-lerobot-reference.txt) into .venv/lerobot-reference
# without dependency resolution; only the LeRobot parity tests put that folder on sys.path.
# Idempotent: skipped when the requirements file has not changed since the last success.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/requirements-lerobot-reference.txt"
TARGET="$ROOT/.venv/lerobot-reference"
key="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ "$(cat "$TARGET/.flashrt-reference" 2>/dev/null)" = "$key" ]; then exit 0; fi
echo "[setup] installing the LeRobot test reference into $TARGET" >&2
rm -rf "$TARGET"
"$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --no-compile \
  --target "$TARGET" -r "$REQ" 2> >(grep -v "is ignored: it is neither" >&2)
echo "$key" > "$TARGET/.flashrt-reference"
