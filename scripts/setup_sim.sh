#!/usr/bin/env bash
# Simulation extras (MuJoCo arm demo and its tests), called by scripts/setup.sh: Mesa's
# headless GL from Debian (EGL, with OSMesa as the fallback) when missing. The Python
# packages (requirements-sim.txt) are pinned in requirements-lock.txt, which setup.sh installs.
# Idempotent; a machine without apt (or without root) only gets a warning: the sim
# then runs state-only (render:=false) and the rendering tests skip with the reason.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf '[setup-sim] %s\n' "$*" >&2; }

if ! ldconfig -p 2>/dev/null | grep -q "libEGL_mesa.so.0" || ! ldconfig -p 2>/dev/null | grep -q "libOSMesa.so"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Mesa EGL/OSMesa (headless MuJoCo rendering)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libegl-mesa0 libgl1-mesa-dri libosmesa6 >/dev/null \
      || say "apt-get failed: MuJoCo rendering may be unavailable (the sim still runs with render:=false)"
  else
    say "no root/apt: install libegl-mesa0 libgl1-mesa-dri libosmesa6 for headless MuJoCo rendering"
  fi
fi

