"""The app's first start on a fresh account, and its peak memory (issue 35): ``--sample`` with an
empty home folder (no ONNX export, no settings, no sample index), until the sample collection is
indexed and open; then the process's VmHWM (peak resident memory) and that of the child processes
it waited for (the one-time ONNX export runs in one: ``core.inference``).

Usage: xvfb-run -a python bench/bench_first_start.py   (or QT_QPA_PLATFORM=offscreen)
The fresh home is a temporary folder (HOME, XDG_*); it is removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, resource, sys, time
from PySide6.QtCore import QTimer
from museum_search.gui.app import _application
from museum_search.gui.main_window import MainWindow
from museum_search.gui.state import AppState

def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) // 1024
    return out

app = _application()
t0 = time.monotonic()
w = MainWindow(AppState(), lazy=True)
w.show()
w.when_ready(lambda: w.collection_tab.open_sample_collection())
seen = []

peak = [0, ""]

def poll():
    line = w.statusBar().currentMessage()
    if line and (not seen or seen[-1] != line):
        seen.append(line)
    rss = status()["VmRSS"]
    if rss > peak[0]:
        try:
            where = w.collection_tab.progress.item_label.text()
        except Exception:
            where = line
        peak[:] = [rss, where or line]
    if w.state.index is not None and not w.collection_tab.running:
        s = status()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
        print("RESULT", json.dumps({"VmHWM_MB": s["VmHWM"], "VmRSS_MB": s["VmRSS"], "children_peak_MB": kids,
                         "seconds": round(time.monotonic() - t0, 1), "status_lines": seen[-12:], "peak_rss_sampled_MB": peak[0], "peak_during": peak[1], "torch_imported": "torch" in sys.modules}), flush=True)
        app.quit()

timer = QTimer(); timer.timeout.connect(poll); timer.start(100)
QTimer.singleShot(900_000, app.quit)
app.exec()
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="first_start_") as home:
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=f"{home}/.config", XDG_CACHE_HOME=f"{home}/.cache",
                   XDG_DATA_HOME=f"{home}/.local/share")
        env.pop("MUSEUM_SEARCH_CACHE", None)
        env.pop("MUSEUM_SEARCH_ONNX_DIR", None)
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True)
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                print(json.dumps(json.loads(line[7:]), indent=1))
                return
        print(out.stdout[-2000:], out.stderr[-4000:])
        raise SystemExit("the first start did not finish")


if __name__ == "__main__":
    main()
