#!/usr/bin/env bash
# The main job: set up, start the node on SmolLM2-135M (CPU) and run a scripted
# capsule session through the ROS services. Extra arguments go to `flashrt demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/flashrt" demo "$@"
