#!/usr/bin/env bash
# Runs the whole test suite after an idempotent set-up. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/install_lerobot_reference.sh"   # test-only LeRobot reference (parity tests)
cd "$ROOT"
set +e
"$ROOT/.venv/bin/python" -m pytest test "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: treating as failure" >&2; exit 1; fi
exit "$rc"
