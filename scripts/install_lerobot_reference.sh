#!/usr/bin/env bash
# Installs the test-time references without dependency resolution; only the parity tests put them on sys.path:
#   requirements-lerobot-reference.txt -> .venv/lerobot-reference (LeRobot 0.4.4 and what its policies import)
#   requirements-pi-reference.txt      -> .venv/pi-reference (transformers 4.53.2 for the π0 / π0.5 reference)
#   requirements-groot-reference.txt   -> .venv/groot-reference (transformers 4.57.6 for the GR00T N1.5 reference)
# Idempotent: each is skipped when its requirements file has not changed since its last success.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
install_reference() {
  local req="$ROOT/$1" target="$ROOT/.venv/$2" key
  key="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ "$(cat "$target/.flashrt-reference" 2>/dev/null)" = "$key" ]; then return 0; fi
  echo "[setup] installing the test reference $1 into $target" >&2
  rm -rf "$target"
  "$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --no-compile \
    --target "$target" -r "$req" 2> >(grep -v "is ignored: it is neither" >&2)
  echo "$key" > "$target/.flashrt-reference"
}
install_reference requirements-lerobot-reference.txt lerobot-reference
install_reference requirements-pi-reference.txt pi-reference
install_reference requirements-groot-reference.txt groot-reference
