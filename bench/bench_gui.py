"""GUI responsiveness: the GUI thread's longest stall while indexing and while evaluating
(target < 50 ms), and the time from Capture to results shown as a ratio to the bare query time.

A 5 ms QTimer on the GUI thread records the gaps between its ticks; the longest gap minus the
interval is the longest stall (time the event loop could not run). Offscreen Qt; real data.
Usage: QT_QPA_PLATFORM=offscreen python bench/bench_gui.py [--data ../shared/data/paintings] [--n 60]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np

HERE = Path(__file__).resolve().parent


class StallMeter:
    def __init__(self, interval_ms: int = 5):
        from PySide6.QtCore import QTimer

        self.interval = interval_ms / 1000
        self.gaps: list[float] = []
        self._last = None
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.gaps.append(now - self._last)
        self._last = now

    def start(self) -> None:
        self.gaps.clear()
        self._last = None
        self.timer.start()

    def stop(self) -> dict:
        self.timer.stop()
        g = np.array(self.gaps) if self.gaps else np.zeros(1)
        return {"longest_stall_ms": float(max(0.0, g.max() - self.interval) * 1000),
                "p99_gap_ms": float(np.percentile(g, 99) * 1000), "ticks": len(self.gaps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data" / "paintings")
    ap.add_argument("--n", type=int, default=60, help="reference images to index")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-gui-"))
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")
    os.environ["XDG_DATA_HOME"] = str(tmp / "data")

    from PySide6.QtWidgets import QApplication

    from museum_search.core.answer._search import results_for, score_matrix
    from museum_search.core.capture import FileSequenceCamera
    from museum_search.core.images import load_image
    from museum_search.core.inference._extract import describe_query_image
    from museum_search.core.ranking import order
    from museum_search.gui import workers
    from museum_search.gui.main_window import MainWindow

    app = QApplication([])

    def pump(timeout: float, until) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            app.processEvents()
            if until():
                break
            time.sleep(0.001)
        return time.perf_counter() - t0

    coll = tmp / "collection"
    coll.mkdir()
    refs = sorted((args.data / "references").glob("*.jpg"))[: args.n]
    for p in refs:
        shutil.copy2(p, coll / p.name)
    queries = sorted((args.data / "queries" / "qsd1_w1").glob("*.jpg"))
    cam_frames = [q for q in queries][:3]
    win = MainWindow(camera_factory=lambda i: FileSequenceCamera(cam_frames, fps=15))
    win.show()
    meter = StallMeter()
    out: dict = {"references": len(refs)}

    # 1. indexing
    tab = win.collection_tab
    tab.set_collection(coll)
    tab.index_edit.setText(str(tmp / "index"))
    pump(5, lambda: False)
    meter.start()
    tab.start_build()
    t = pump(1800, lambda: not tab.running and win.state.index is not None)
    out["indexing"] = {**meter.stop(), "seconds": t}
    index = win.state.index
    assert index is not None and len(index) == len(refs), "indexing failed"

    # 2. evaluation (queries restricted to the indexed references are open-set otherwise)
    ev = win.evaluation_tab
    qdir = tmp / "queries"
    qdir.mkdir()
    lines = ["query,instance"]
    names = {p.stem for p in refs}
    gt = (args.data / "queries" / "qsd1_w1" / "ground_truth.csv").read_text().splitlines()[1:]
    for line in gt:
        q, inst = line.split(",")
        shutil.copy2(args.data / "queries" / "qsd1_w1" / q, qdir / q)
        lines.append(f"{q},{inst if inst in names else ''}")
    (qdir / "ground_truth.csv").write_text("\n".join(lines) + "\n")
    ev.load_queryset_path(qdir)
    meter.start()
    ev.run_evaluation()
    t = pump(1800, lambda: not ev.is_running())
    out["evaluation"] = {**meter.stop(), "seconds": t}

    # 3. capture → results shown, vs the bare query (describe + score + top-k) on the same frame
    st = win.search_tab
    win.tabs.setCurrentWidget(st)
    st.start_camera(0)
    pump(10, lambda: st.camera_view.latest_frame() is not None)
    st.search_file(str(queries[0]))  # warm up the extractor
    pump(120, lambda: bool(st.results()) and not st.is_busy())
    capture_times, bare_times = [], []
    for _ in range(5):
        before = st.results()
        t0 = time.perf_counter()
        assert st.capture()
        pump(120, lambda before=before: st.results() is not before and bool(st.results()) and not st.is_busy())
        capture_times.append(time.perf_counter() - t0)
    ext = st._extractor if getattr(st, "_extractor", None) is not None else None
    if ext is None:
        from museum_search.core.inference._engines import extractor_for_meta

        ext = extractor_for_meta(index.meta)
    frame = load_image(cam_frames[0])
    for _ in range(5):
        t0 = time.perf_counter()
        d = describe_query_image(frame, ext)
        s = score_matrix(index, d[None])[0]
        results_for(index, order(s, 8), s)
        bare_times.append(time.perf_counter() - t0)
    st.stop_camera()
    out["capture"] = {"capture_to_results_ms": 1000 * float(np.median(capture_times)),
                      "bare_query_ms": 1000 * float(np.median(bare_times)),
                      "ratio": float(np.median(capture_times) / np.median(bare_times))}
    workers.wait_all()
    win.close()
    print(json.dumps(out, indent=2))
    print(f"longest GUI stall: indexing {out['indexing']['longest_stall_ms']:.1f} ms, evaluating "
          f"{out['evaluation']['longest_stall_ms']:.1f} ms (target < 50 ms); capture→results "
          f"{out['capture']['capture_to_results_ms']:.0f} ms = {out['capture']['ratio']:.2f}× the bare query")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "gui.json").write_text(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
