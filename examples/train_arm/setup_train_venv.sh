#!/usr/bin/env bash
# Builds the training venv (.venv-train/ at the repository root, ignored by git) from the exact pins in
# requirements-train.txt, without dependency resolution (LeRobot 0.4.4's own pins — torch < 2.11 and a
# heavy tree — conflict with the versions we use; the training path needs only these).
# Idempotent: skipped when requirements-train.txt has not changed since the last success.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${TRAIN_VENV:-$ROOT/.venv-train}"
REQ="$HERE/requirements-train.txt"
key="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ "$(cat "$VENV/.train-deps" 2>/dev/null)" = "$key" ]; then exit 0; fi
echo "[train] building $VENV from $REQ" >&2
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$REQ" \
  2> >(grep -v "is ignored: it is neither" >&2)
"$VENV/bin/python" "$HERE/lerobot_compat.py"      # checks that LeRobot's training path imports
echo "$key" > "$VENV/.train-deps"
