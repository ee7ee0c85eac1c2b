"""A long session of the desktop app, and its memory: does the process keep growing?

Drives the real MainWindow (offscreen Qt) as a user would, on a copy of the bundled sample
collection (resources/sample): build the index in the Collection tab, then ``--searches`` photo
searches in the Search tab (the sample queries in turn, with and without ICFRR and verification,
k changed now and then, a result opened large every ``--dialog-every`` searches, as a double-click
does), then ``--evaluations`` runs in the Evaluation tab (verification and ICFRR on and off, a few
queries of each run looked at in the per-query table), the last ones started after a verdict
re-calibration was stored (the index is reloaded, as the app does).

The process's resident memory (VmRSS from /proc/self/status, after ``gc.collect()``) is sampled
after each step; VmHWM is the peak. The growth is the least-squares slope over the second half of
each phase (the first half includes warm-up: the network loaded, caches filled), per 100 searches
and per evaluation. Bounded memory shows as a slope near zero. ``--trace`` also records
tracemalloc snapshots and prints the allocation sites that grew most between the middle and the
end of each phase (slower; for finding what grows, not for the numbers).

Usage: QT_QPA_PLATFORM=offscreen python bench/bench_session.py [--searches 200] [--evaluations 10]
       [--out bench/results/session.json] [--trace]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "resources" / "sample"
MB = 1024 * 1024


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, … (per step)."""
    if len(ys) < 2:
        return float("nan")
    return float(np.polyfit(np.arange(len(ys), dtype=float), np.asarray(ys, float), 1)[0])


def second_half(ys: list[float]) -> list[float]:
    return ys[len(ys) // 2:]


class Sampler:
    def __init__(self, trace: bool):
        self.series: dict[str, list[float]] = {}
        self.trace = trace
        self.snapshots: dict[str, object] = {}
        self.t0 = time.perf_counter()

    def sample(self, phase: str) -> float:
        gc.collect()
        rss = proc_status()["VmRSS"] / MB
        self.series.setdefault(phase, []).append(round(rss, 1))
        return rss

    def snapshot(self, name: str) -> None:
        if self.trace:
            import tracemalloc

            gc.collect()
            self.snapshots[name] = tracemalloc.take_snapshot()

    def diff(self, a: str, b: str, top: int = 15) -> list[str]:
        if a not in self.snapshots or b not in self.snapshots:
            return []
        stats = self.snapshots[b].compare_to(self.snapshots[a], "traceback")
        lines = []
        for s in stats[:top]:
            frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(s.traceback)[:4])
            lines.append(f"{s.size_diff / 1024:+9.0f} KiB {s.count_diff:+7d} objs  {frames}")
        return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=200)
    ap.add_argument("--evaluations", type=int, default=10)
    ap.add_argument("--dialog-every", type=int, default=5, help="open a result large every N searches (0: never)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "session.json")
    ap.add_argument("--label", default="", help="a note stored in the JSON (e.g. 'before')")
    ap.add_argument("--trace", action="store_true", help="tracemalloc diffs of each phase (slower)")
    args = ap.parse_args()
    if args.trace:
        import tracemalloc

        tracemalloc.start(6)

    tmp = Path(tempfile.mkdtemp(prefix="bench-session-"))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME"):  # throw-away settings; the weights and ONNX caches stay
        os.environ[var] = str(tmp / var.lower())

    from PySide6.QtCore import QEventLoop, QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    from museum_search.core.answer._rerank import RerankOptions
    from museum_search.gui import workers
    from museum_search.gui.main_window import MainWindow
    from museum_search.gui.widgets.thumbnails import ThumbnailCache

    def quiet(mode, context, message: str) -> None:  # the offscreen platform's note on every dialog
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(quiet)
    _app = QApplication.instance() or QApplication([])  # kept alive for the benchmark
    sampler = Sampler(args.trace)

    def pump(until, timeout: float = 600.0, settle_ms: int = 0) -> float:
        """Run the event loop (deferred deletes included, as in the app) until ``until()``."""
        t0 = time.perf_counter()
        loop = QEventLoop()
        timer = QTimer()
        timer.setInterval(10)

        def check() -> None:
            if until() or time.perf_counter() - t0 > timeout:
                loop.quit()

        timer.timeout.connect(check)
        timer.start()
        if not until():
            loop.exec()
        timer.stop()
        if settle_ms:
            QTimer.singleShot(settle_ms, loop.quit)
            loop.exec()
        if not until():
            raise TimeoutError(f"still waiting after {timeout:.0f} s")
        return time.perf_counter() - t0

    coll = tmp / "sample" / "collection"
    shutil.copytree(SAMPLE / "collection", coll)
    shutil.copy2(SAMPLE / "catalogue.csv", coll.parent / "catalogue.csv")
    qdir = tmp / "sample" / "queries"
    shutil.copytree(SAMPLE / "queries", qdir)
    queries = sorted(qdir.glob("*.jpg"))

    start_rss = sampler.sample("start")
    win = MainWindow()
    win.resize(1280, 820)
    win.show()
    pump(lambda: True, settle_ms=200)
    out: dict = {"label": args.label, "searches": args.searches, "evaluations": args.evaluations,
                 "collection": "resources/sample (42 references, 21 queries)", "python": sys.version.split()[0]}

    # 1. index the collection in the Collection tab
    t0 = time.perf_counter()
    ct = win.collection_tab
    win.tabs.setCurrentWidget(ct)
    ct.set_collection(coll)
    pump(lambda: ct.detected_label.text().startswith("Detected:"), 120)
    ct.index_edit.setText(str(tmp / "index"))
    assert ct.start_build(), ct.progress.status_label.text()
    pump(lambda: not ct.running and win.state.index is not None, 1800, settle_ms=300)
    index = win.state.index
    assert index is not None and len(index) == 42, "indexing failed"
    out["index_seconds"] = round(time.perf_counter() - t0, 1)
    sampler.sample("index")
    print(f"indexed {len(index)} references in {out['index_seconds']} s; RSS {sampler.series['index'][-1]:.0f} MB",
          flush=True)

    # 2. searches in the Search tab
    st = win.search_tab
    win.tabs.setCurrentWidget(st)
    variants = [("", True), ("icfrr", True), ("", False), ("icfrr", False)]
    k_values = [8, 8, 12, 5]
    t0 = time.perf_counter()
    dialogs = 0
    for i in range(args.searches):
        rerank, verify = variants[(i // len(queries)) % len(variants)]
        if st.reranker() != rerank:
            st.set_reranker(rerank)
        if st.verify.isChecked() != verify:
            st.verify.setChecked(verify)
        k = k_values[(i // 7) % len(k_values)]
        if st.k_spin.value() != k:
            st.k_spin.setValue(k)
        assert st.search_file(queries[i % len(queries)])
        pump(lambda: st.is_up_to_date() and bool(st.results()), 300)
        if args.dialog_every and i % args.dialog_every == args.dialog_every - 1:
            dlg = st.show_result_dialog(st.results()[0])
            pump(lambda dlg=dlg: not dlg.is_busy(), 120, settle_ms=20)
            dlg.reject()
            dialogs += 1
        pump(lambda: True, settle_ms=5)
        sampler.sample("searches")
        if i == args.searches // 2:
            sampler.snapshot("searches-mid")
        if (i + 1) % 25 == 0:
            print(f"{i + 1} searches, {time.perf_counter() - t0:.0f} s; RSS {sampler.series['searches'][-1]:.0f} MB",
                  flush=True)
    sampler.snapshot("searches-end")
    out["search_seconds"] = round(time.perf_counter() - t0, 1)
    out["result_dialogs_opened"] = dialogs

    # 3. evaluations in the Evaluation tab
    ev = win.evaluation_tab
    win.tabs.setCurrentWidget(ev)
    assert ev.load_queryset_path(qdir), "query set"
    runs = [(["icfrr"], True), ([], True), ([], False), (["icfrr"], False)]
    t0 = time.perf_counter()
    for i in range(args.evaluations):
        names, verify = runs[i % len(runs)]
        ev.set_rerank(names, RerankOptions(k_q=2, k_g=2) if names else None, verify=verify)
        finished = []
        ev.run_finished.connect(finished.append)
        assert ev.run_evaluation(), ev.status_text()
        pump(lambda: not ev.is_running(), 1800, settle_ms=50)
        ev.run_finished.disconnect(finished.append)
        assert finished, f"evaluation {i + 1} did not finish: {ev.status_text()}"
        for row in range(0, ev.proxy.rowCount(), 5):  # look at a few queries of the run
            ev.select_query_row(row)
            pump(lambda: True, settle_ms=20)
        if i == args.evaluations // 2 and finished[0].report.can_recalibrate and verify:
            assert ev.store_verdict(0.1)  # the index is stored and loaded again, as in the app
            pump(lambda: not ev.is_running(), 300, settle_ms=100)
        sampler.sample("evaluations")
        if i == args.evaluations // 2:
            sampler.snapshot("evaluations-mid")
        print(f"{i + 1} evaluations, {time.perf_counter() - t0:.0f} s; RSS {sampler.series['evaluations'][-1]:.0f} MB "
              f"({len(ev.runs)} runs listed)", flush=True)
    sampler.snapshot("evaluations-end")
    out["evaluation_seconds"] = round(time.perf_counter() - t0, 1)

    status = proc_status()
    win.close()
    workers.wait_all()
    ThumbnailCache.instance().wait()
    pump(lambda: True, settle_ms=100)

    s, e = sampler.series.get("searches", []), sampler.series.get("evaluations", [])
    out["rss_mb"] = {"start": round(start_rss, 1), "after_index": sampler.series["index"][-1],
                     "after_searches": s[-1] if s else None, "end": e[-1] if e else (s[-1] if s else None)}
    out["peak_rss_mb"] = round(status["VmHWM"] / MB, 1)
    out["growth"] = {
        "mb_per_100_searches": round(100 * slope(second_half(s)), 2) if len(s) > 3 else None,
        "mb_per_evaluation": round(slope(second_half(e)), 2) if len(e) > 3 else None,
        "searches_second_half_mb": [min(second_half(s)), max(second_half(s))] if len(s) > 3 else None,
        "evaluations_second_half_mb": [min(second_half(e)), max(second_half(e))] if len(e) > 3 else None,
    }
    out["series_mb"] = {"searches": s, "evaluations": e}
    if args.trace:
        out["trace"] = {"searches": sampler.diff("searches-mid", "searches-end"),
                        "evaluations": sampler.diff("evaluations-mid", "evaluations-end")}
        for phase, lines in out["trace"].items():
            print(f"\ntracemalloc growth over the second half of the {phase}:")
            print("\n".join(lines))
    print(json.dumps({k: v for k, v in out.items() if k not in ("series_mb", "trace")}, indent=2))
    print(f"peak RSS {out['peak_rss_mb']:.0f} MB; growth {out['growth']['mb_per_100_searches']} MB per 100 searches, "
          f"{out['growth']['mb_per_evaluation']} MB per evaluation (second halves)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.flush()
    os._exit(0)  # the numbers are written: skip tearing down Qt and the thread pools at exit


if __name__ == "__main__":
    main()
