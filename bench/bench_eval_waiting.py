"""Waiting in the Evaluation tab (issue 13): the time from "Run evaluation" to the first plotted
point, for the first run of a process and for later runs, and how long Cancel takes in each phase.

The main window (offscreen Qt) evaluates a real index (the 287 paintings, built once into
``--index``) with a real query set (qsd2_w3: 30 photos of gallery walls) and the default pipeline
(query regions, geometric verification), as a user would: ``run_evaluation()``, ``cancel()``,
``run_sweep()``, with the GUI event loop pumped every millisecond.

* first point: from ``run_evaluation()`` to the first point in the running-means buffer; the
  network's ONNX export is on disk (a restart of the app), so the first run of the process also
  loads the network;
* cancel latency: from ``cancel()`` to the end of the job (Run enabled again), cancelled 0.3 s
  after the status names the phase: loading the network cold (no export on disk: exported from
  torch, as on a new machine), describing the query photos, answering them (search + geometric
  verification), and a sweep's describing and answering.

The same script runs on the code before issue 13 (``PYTHONPATH=<old tree> ... --label before``):
there the status said "Loading the network…" until the first batch of 8 was answered, and the
phases of a batch cannot be told apart (describing and answering happen in one call), so those
are cancelled 0.3 s after the first point. Results: ``bench/results/eval_waiting.json`` (one
entry per label). Timing numbers live here, not in the tests (the machine is shared).

Usage: QT_QPA_PLATFORM=offscreen python bench/bench_eval_waiting.py [--index DIR] [--label after]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data" / "paintings")
    ap.add_argument("--index", type=Path, default=Path(tempfile.gettempdir()) / "museum-search-bench-paintings")
    ap.add_argument("--query-set", default="qsd2_w3")
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "eval_waiting.json")
    ap.add_argument("--skip-cold", action="store_true", help="skip cancelling a cold network load (an export)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-eval-waiting-"))
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")

    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from museum_search.core.inference import _backbones as backbones
    from museum_search.core.inference import _engines as engines
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run
    from museum_search.gui import workers
    from museum_search.gui.main_window import MainWindow

    if not (args.index / "manifest.json").is_file():
        print("indexing", args.data / "references", flush=True)
        run(build_index(args.data / "references", args.index))

    _app = QApplication([])  # kept alive for the benchmark
    # PySide6 6.12's static void functions (QApplication.processEvents, QThread.msleep, QTest.qWait)
    # return None without a reference: thousands of calls free None and crash Python. An event
    # loop object's processEvents() is safe.
    loop = QEventLoop()
    win = MainWindow()
    win.resize(1280, 820)
    win.show()

    def pump(timeout: float, until) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            loop.processEvents()
            if until():
                break
            time.sleep(0.001)
        return time.perf_counter() - t0

    assert win.open_index(args.index), "cannot open the index"
    pump(2, lambda: False)
    tab = win.evaluation_tab
    win.tabs.setCurrentWidget(tab)
    assert tab.load_queryset_path(args.data / "queries" / args.query_set)
    tab.set_rerank([], verify=True)
    new = hasattr(tab, "sweep_page")  # the code of issue 13
    out: dict = {"label": args.label, "machine": f"{platform.node()}, {os.cpu_count()} cores (shared)",
                 "engine": engines.resolve(win.state.engine), "queries": len(tab.queryset.queries), "query_set": args.query_set,
                 "references": len(win.state.index)}

    def stage() -> str:
        p = getattr(tab, "_last_progress", None)
        return p.stage if p is not None else ""

    def timed_run(name: str) -> dict:
        timeline: list[tuple[float, str]] = []
        t0 = time.perf_counter()
        assert tab.run_evaluation()
        first = None
        while tab.is_running():
            loop.processEvents()
            now = time.perf_counter() - t0
            text = tab.status_text()
            head = text.split(":")[0].split("…")[0].split(" — ")[0][:60]
            if not timeline or timeline[-1][1] != head:
                timeline.append((round(now, 3), head))
            if first is None and len(tab.plots.buffer) >= 1:
                first = now
            time.sleep(0.001)
        total = time.perf_counter() - t0
        res = {"first_point_s": round(first, 3) if first is not None else None, "total_s": round(total, 2),
               "status_timeline": timeline[:12]}
        print(name, json.dumps(res)[:400], flush=True)
        return res

    # ---- time to the first plotted point: the first run of the process, then later runs
    out["first_run"] = timed_run("first run")
    out["second_run"] = timed_run("second run")
    out["third_run"] = timed_run("third run")

    # ---- cancel latency per phase
    def cancel_in(name: str, start, in_phase, delay: float = 0.3, timeout: float = 900) -> dict:
        t0 = time.perf_counter()
        assert start()
        pump(timeout, lambda: in_phase() or not tab.is_running())
        if not tab.is_running():
            print(name, "ended before the phase was seen", flush=True)
            return {"phase_seen": False}
        reached = time.perf_counter() - t0
        said = tab.status_text()
        pump(delay, lambda: not tab.is_running())
        if not tab.is_running():
            return {"phase_seen": True, "ended_before_cancel": True}
        t1 = time.perf_counter()
        tab.cancel()
        pump(timeout, lambda: not tab.is_running())
        latency = time.perf_counter() - t1
        res = {"latency_s": round(latency, 3), "phase_reached_after_s": round(reached, 2),
               "status_when_cancelled": said[:120], "status_after": tab.status_text()[:120]}
        print(name, json.dumps(res), flush=True)
        pump(1.0, lambda: False)
        return res

    def run_sweep():
        return tab.run_sweep("k", "1:3")

    cancels: dict = {}
    if new:
        from museum_search.core.evaluation._runner import DESCRIBING, SEARCHING, VERIFYING

        cancels["describing the query photos"] = cancel_in(
            "cancel describing", tab.run_evaluation, lambda: stage() == DESCRIBING and len(tab.plots.buffer) >= 1)
        cancels["answering (search + verification)"] = cancel_in(
            "cancel answering", tab.run_evaluation, lambda: stage() in (VERIFYING, SEARCHING))
        cancels["sweep: describing"] = cancel_in("cancel sweep describing", run_sweep,
                                                 lambda: stage() == DESCRIBING)
        cancels["sweep: answering at a value"] = cancel_in("cancel sweep answering", run_sweep,
                                                           lambda: stage().startswith("answering at"))
    else:
        cancels["describing or answering (one batch call)"] = cancel_in(
            "cancel evaluating", tab.run_evaluation, lambda: len(tab.plots.buffer) >= 1)
        cancels["sweep: describing"] = cancel_in("cancel sweep describing", run_sweep,
                                                 lambda: tab.progress.format().startswith("describing"))
        cancels["sweep: answering at a value"] = cancel_in("cancel sweep answering", run_sweep,
                                                           lambda: tab.progress.format().startswith("values"))

    if not args.skip_cold:
        # a cold load: no export on disk and none in memory (the first start on a new machine)
        os.environ["MUSEUM_SEARCH_CACHE"] = str(tmp / "cold-cache")
        engines._sessions.clear()
        backbones._CACHE.clear()
        cold_t0 = time.perf_counter()
        cancels["loading the network (cold: exported from torch)"] = cancel_in(
            "cancel loading", tab.run_evaluation, lambda: tab.status_text().startswith("Loading the network"))
        if new:  # the load goes on in the background, for the next run: wait for it to end
            from museum_search.core import progress

            pump(900, lambda: not progress._shared)
            cancels["loading the network (cold: exported from torch)"]["background_load_ended_after_s"] = round(
                time.perf_counter() - cold_t0, 1)
    out["cancel"] = cancels

    workers.wait_all()
    win.close()
    doc = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    doc[args.label] = out
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print("wrote", args.out, flush=True)
    os._exit(0)  # skip interpreter teardown (pyqtgraph items at exit)


if __name__ == "__main__":
    raise SystemExit(main())
