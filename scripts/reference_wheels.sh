#!/usr/bin/env bash
# The LeRobot reference as wheels for a GPU machine without network access: the packages its image lacks,
# at the versions pinned in requirements-lerobot-reference.txt, for its Python (default 3.12), into .whl/
# (ignored by git; benchmarks/run_gpu_suite.sh installs .whl/*.whl into /tmp/site before it runs).
# Usage: scripts/reference_wheels.sh [PYTHON_VERSION] [SET]   e.g. 3.12 (the GPU image), 3.11 (this venv)
#   SET lerobot (default): the above, into .whl/
#   SET pi:    requirements-pi-reference.txt (transformers 4.53.2, tokenizers 0.21.4, huggingface-hub 0.35.3)
#              into .whl-pi/ (the π reference: benchmarks/campaign_pi0.sh installs it to /tmp/pi-ref)
#   SET groot: requirements-groot-reference.txt (transformers 4.57.6, tokenizers 0.22.2, huggingface-hub 0.36.0)
#              into .whl-groot/ (the GR00T reference: benchmarks/campaign_groot.sh installs it to /tmp/groot-ref)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYV="${1:-3.12}"
SET="${2:-lerobot}"
if [ "$SET" = pi ] || [ "$SET" = groot ]; then
  DEST="$ROOT/.whl-$SET"; mkdir -p "$DEST"
  "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --implementation cp -d "$DEST" -r "$ROOT/requirements-$SET-reference.txt"
  du -sh "$DEST" >&2
  exit 0
fi
[ "$SET" = lerobot ] || { echo "reference_wheels: unknown set $SET (lerobot, pi, groot)" >&2; exit 1; }
REQ="$ROOT/requirements-lerobot-reference.txt"
# What the GPU image (torch, torchvision, transformers, numpy, safetensors, huggingface_hub, pandas, pyarrow,
# einops ...) lacks: the set earlier device runs carried, plus num2words for SmolVLA's processor.
NEEDED=(lerobot draccus diffusers mergedeep pyyaml-include toml typing-inspect mypy-extensions importlib-metadata
        zipp datasets dill multiprocess xxhash av pyserial deepdiff orderly-set num2words)
pins=()
for name in "${NEEDED[@]}"; do
  pin="$(grep -E "^${name}==" "$REQ" || true)"
  [ -n "$pin" ] || { echo "reference_wheels: $name is not pinned in $REQ" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p "$ROOT/.whl"
"$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp -d "$ROOT/.whl" "${pins[@]}"
du -sh "$ROOT/.whl" >&2
