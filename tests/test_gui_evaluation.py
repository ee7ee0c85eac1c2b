"""The Evaluation tab, driven offscreen: a run end to end, a second run compared, a sweep, cancel."""

from __future__ import annotations

import csv
import html
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QMessageBox

from museum_search.core.evaluation.querysets import load_queryset
from museum_search.core.evaluation.runner import precision_recall_curve
from museum_search.core.evaluation.stats import paired_bootstrap_test
from museum_search.core.rerank import RerankOptions
from museum_search.gui import workers
from museum_search.gui.evaluation_tab import SORT_ROLE, VALUE_ROLE, EvaluationTab, stars
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.plots import HIST_BINS, RunningBuffer

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
TIMEOUT = 300_000  # ms: describing the queries takes a few seconds, much more on a loaded machine
N_QUERIES = 8  # queries of the subset evaluated (keeps the test lean)
SCREENSHOT = Path("/tmp/evaluation_tab.png")


def _read_truth(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _query_subset(src: Path, out: Path, n: int) -> Path:
    """The first ``n`` queries of ``src`` (with their ground truth rows) in ``out``."""
    rows = _read_truth(src / "ground_truth.csv")
    names = list(dict.fromkeys(r["query"] for r in rows))[:n]
    out.mkdir(parents=True)
    for q in names:
        shutil.copy(src / q, out / q)
    with open(out / "ground_truth.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["query", "instance"])
        w.writerows([r["query"], r.get("instance") or ""] for r in rows if r["query"] in names)
    return out


@pytest.fixture(scope="module")
def data(request, tmp_path_factory) -> SimpleNamespace:
    """An index and a folder of labelled queries (a subset of the sample's, open-set included)."""
    index = request.getfixturevalue("sample_index")
    qdir = _query_subset(SAMPLE / "queries", tmp_path_factory.mktemp("eval-queries") / "queries", N_QUERIES)
    return SimpleNamespace(index=index, queries=qdir)


@pytest.fixture
def tab(qtbot, data, tmp_path):
    state = AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))
    state.set_index(data.index)
    w = EvaluationTab(state)
    qtbot.addWidget(w)
    w.resize(1500, 950)
    w.show()
    yield w
    w.shutdown()
    qtbot.waitUntil(lambda: not w.is_running(), timeout=TIMEOUT)
    assert workers.wait_all(TIMEOUT)
    qtbot.waitUntil(lambda: not workers._ACTIVE, timeout=10_000)


def _evaluate(qtbot, tab):
    done = []
    tab.run_finished.connect(done.append)
    try:
        with qtbot.waitSignal(tab.job_finished, timeout=TIMEOUT):
            assert tab.run_evaluation()
            assert tab.plots.timer.isActive() and tab.is_running()
    finally:
        tab.run_finished.disconnect(done.append)
    assert done, f"no run finished: {tab.status_label.text()}"
    return done[0]


def _error_dialogs(widget) -> list[QMessageBox]:
    return [b for b in widget.findChildren(QMessageBox, "errorDialog") if b.isVisible()]


def test_evaluate_compare_and_export(qtbot, tab, data, tmp_path):
    index = data.index
    assert tab.index is index  # follows the application's index

    # query set: detected layout shown
    assert tab.load_queryset_path(data.queries)
    qs = load_queryset(data.queries)
    assert tab.detected_label.text().startswith("Detected: ")
    assert html.escape(qs.describe()) in tab.detected_label.text()
    n = len(qs.queries)

    # ---- first run: no re-ranking ----------------------------------------------------------
    run1 = _evaluate(qtbot, tab)
    report = run1.report
    summary = report.summary
    assert tab.progress.maximum() == n and tab.progress.value() == n
    assert not tab.plots.timer.isActive()
    assert len(report.records) == n  # nothing skipped
    for metric in ("mp@1", "map", "amnro"):
        x, y = tab.plots.running_curves[metric].getData()
        np.testing.assert_array_equal(x, np.arange(1, n + 1))
        assert y[-1] == pytest.approx(summary[metric])
    for key in ("ap", "mnro"):
        counts = tab.plots.histogram_counts(key)
        assert counts.sum() == summary["queries"]
        expected, _ = np.histogram(report.per_query_values(key), bins=HIST_BINS)
        np.testing.assert_array_equal(counts, expected)
    rx, py = tab.plots.pr_curve.getData()
    recall, precision = precision_recall_curve(report)
    np.testing.assert_allclose(rx, recall)
    np.testing.assert_allclose(py, precision)

    # per-query table: one row per query, sortable
    assert tab.proxy.rowCount() == n
    tab.table.sortByColumn(3, Qt.SortOrder.DescendingOrder)  # AP
    aps = [tab.proxy.index(r, 3).data(SORT_ROLE) for r in range(n)]
    assert aps == sorted(aps, reverse=True)
    tab.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)  # query name
    names = [tab.proxy.index(r, 0).data() for r in range(n)]
    assert names == sorted(names)
    tab.table.sortByColumn(5, Qt.SortOrder.AscendingOrder)  # top-1 instance
    tops = [tab.proxy.index(r, 5).data(SORT_ROLE) for r in range(n)]
    assert tops == sorted(tops)

    # selecting a row shows the query's top results, correct ones marked
    tab.table.sortByColumn(4, Qt.SortOrder.DescendingOrder)  # worst MNRO first: a query with misses
    tab.select_query_row(0)
    rec = tab.table_model.record(tab.proxy.mapToSource(tab.proxy.index(0, 0)).row())
    k = min(tab.state.settings.top_k, len(index))
    results = tab.result_grid.results()
    assert [r.row for r in results] == [int(i) for i in rec.ranking[:k]]
    assert [r.rank for r in results] == list(range(1, k + 1))
    assert tab.result_grid.correct() == [bool(c) for c in rec.relevance[:k]]
    assert [c.mark for c in tab.result_grid.cards()] == ["correct" if c else "incorrect" for c in rec.relevance[:k]]
    assert Path(rec.query).name in tab.query_info.text()

    # ---- second run: ICFRR, compared with the first ------------------------------------------
    tab.set_rerank(["icfrr"], RerankOptions(k_q=2, k_g=2, beta=0.5, iterations=5))
    assert tab.rerank_names() == ["icfrr"]
    run2 = _evaluate(qtbot, tab)
    assert run2.name.startswith("icfrr") and run1.name.startswith("none")
    assert [r.key for r in tab.compared_runs()] == [run1.key, run2.key]
    assert tab.selected_run() is run2
    # the other ticked run is overlaid
    x, _ = tab.plots.running_overlays[run1.key]["map"].getData()
    np.testing.assert_array_equal(x, np.arange(1, n + 1))
    assert run1.key in tab.plots.pr_overlays

    assert tab.baseline_run() is run1  # the first run by default
    assert tab.summary_table.rowCount() == 2 and len(tab.comparison) == 2
    for row, run in zip(tab.comparison, (run1, run2)):
        assert row["key"] == run.key
        for metric in ("mp@1", "map", "amnro"):
            mean, lo, hi = row["ci"][metric]
            assert mean == pytest.approx(run.report.summary[metric])
            assert lo - 1e-12 <= mean <= hi + 1e-12
    base_row, other = tab.comparison
    assert base_row["baseline"] and all(p is None for p in base_row["p"].values())
    for metric, key, higher in (("mp@1", "p@1", True), ("map", "ap", True), ("amnro", "mnro", False)):
        p = other["p"][metric]
        assert p is not None and 0.0 < p <= 1.0
        assert other["stars"][metric] == stars(p)
        direct = paired_bootstrap_test(run2.report.per_query_values(key), run1.report.per_query_values(key),
                                       higher_is_better=higher)
        assert p == pytest.approx(direct.p_value)
    assert tab.summary_table.item(1, 6).data(VALUE_ROLE) == other["p"]["map"]
    assert tab.summary_table.item(0, 6).text() == "baseline"

    # the baseline can be changed; an unticked run leaves the comparison
    tab.set_baseline(run2)
    assert tab.comparison[0]["p"]["map"] is not None and tab.comparison[1]["baseline"]
    tab.set_baseline(run1)
    tab.set_run_checked(run1, False)
    assert [r["key"] for r in tab.comparison] == [run2.key] and not tab.plots.running_overlays
    tab.set_run_checked(run1, True)
    assert len(tab.comparison) == 2

    # ---- export the selected run ------------------------------------------------------------
    jpath = tab.export_json(tmp_path / "run.json")
    cpath = tab.export_csv(tmp_path / "run.csv")
    doc = json.loads(Path(jpath).read_text(encoding="utf-8"))
    assert doc["summary"]["map"] == pytest.approx(run2.report.summary["map"], abs=1e-6)
    assert doc["summary"]["rerank"] == "icfrr" and len(doc["queries"]) == n
    with open(cpath, newline="", encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == n

    # ---- screenshot: the selected query of the second run, thumbnails loaded ---------------
    tab.table.sortByColumn(4, Qt.SortOrder.DescendingOrder)
    tab.select_query_row(0)
    qtbot.waitUntil(lambda: all(c.has_thumbnail() for c in tab.result_grid.cards())
                    and tab.query_image.pixmap() is not None and not tab.query_image.pixmap().isNull(),
                    timeout=60_000)
    qtbot.wait(200)
    assert tab.grab().save(str(SCREENSHOT))
    assert not _error_dialogs(tab)


def test_sweep_plots_one_point_per_value(qtbot, tab, data):
    assert tab.load_queryset_path(data.queries)
    tab.set_rerank([], RerankOptions(beta=0.5, iterations=5))
    with qtbot.waitSignal(tab.sweep_finished, timeout=TIMEOUT) as blocker:
        assert tab.run_sweep("k", [1, 2])
    qtbot.waitUntil(lambda: not tab.is_running(), timeout=TIMEOUT)
    points = blocker.args[0]
    assert [p.value for p in points] == [1.0, 2.0] and tab.sweep_points == points
    assert [(p.options.k_q, p.options.k_g, p.options.beta) for p in points] == [(1, 1, 0.5), (2, 2, 0.5)]
    for metric in ("map", "mp@1"):
        x, y = tab.sweep_plot.sweep_curves[metric].getData()
        np.testing.assert_array_equal(x, [1.0, 2.0])
        np.testing.assert_allclose(y, [p.summary[metric] for p in points])
    assert tab.sweep_table.rowCount() == 2
    assert not tab.runs  # a sweep does not add runs
    assert not _error_dialogs(tab)


def test_cancel_stops_a_run(qtbot, tab, data):
    assert tab.load_queryset_path(data.queries)
    n = len(tab.queryset.queries)
    tab.batch_size = 2  # several batches, so there is something left to cancel
    assert tab.run_evaluation()
    assert tab.cancel_button.isEnabled() and not tab.run_button.isEnabled()
    qtbot.waitUntil(lambda: len(tab.plots.buffer) >= 1, timeout=TIMEOUT)
    tab.cancel()
    qtbot.waitUntil(lambda: not tab.is_running(), timeout=TIMEOUT)
    assert tab.runs == []  # a cancelled run is not kept
    assert 1 <= tab.progress.value() < n
    assert "cancelled" in tab.status_label.text()
    assert tab.run_button.isEnabled() and not tab.cancel_button.isEnabled()
    assert not tab.plots.timer.isActive()


def test_index_choice_and_errors_are_dialogs(qtbot, tab, data, tmp_path):
    # the tab follows the application's index, or evaluates another index folder
    tab.state.set_index(None)
    assert tab.index is None
    assert tab.open_index(data.index.path)
    assert tab.index is not data.index and len(tab.index) == len(data.index)
    tab.state.set_index(data.index)
    assert tab.index is data.index

    assert not tab.run_button.isEnabled()  # no query set yet
    assert not tab.run_evaluation()
    assert len(_error_dialogs(tab)) == 1
    (tmp_path / "empty").mkdir()
    assert not tab.load_queryset_path(tmp_path / "empty")
    assert tab.queryset is None and tab.detected_label.text() == "No query set."
    assert not tab.open_index(tmp_path / "empty")
    assert tab.export_json(tmp_path / "x.json") is None  # nothing to export
    assert not tab.run_sweep("k", "0")  # no query set: refused before any work
    assert len(_error_dialogs(tab)) == 5 and not tab.is_running()


def test_live_plots_redraw_on_the_timer_not_per_record(qtbot):
    """The progress callback only appends; the curves change when the 10 Hz timer refreshes them."""
    from museum_search.core.evaluation.runner import EvalStep, QueryRecord
    from museum_search.gui.widgets.plots import EvaluationPlots

    plots = EvaluationPlots()
    qtbot.addWidget(plots)
    n = 300
    plots.start_live(n)
    assert plots.timer.isActive() and plots.timer.interval() == 100
    calls = []
    curve = plots.running_curves["map"]
    original = curve.setData
    curve.setData = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    rng = np.random.default_rng(0)
    aps = rng.random(n)
    for i in range(n):
        rec = QueryRecord(i, f"q{i}.jpg", ["a"], {"p@1": 1.0, "ap": float(aps[i]), "mnro": 0.1},
                          np.arange(3), np.zeros(3, np.float32), np.array([True, False, False]), 1)
        plots.add_step(EvalStep(i + 1, n, rec, {"mp@1": 1.0, "map": float(aps[: i + 1].mean()), "amnro": 0.1}))
    assert calls == []  # nothing drawn from the progress callback
    qtbot.waitUntil(lambda: len(calls) >= 1, timeout=2000)  # the timer's refresh
    x, y = curve.getData()
    np.testing.assert_array_equal(x, np.arange(1, n + 1))
    assert y[-1] == pytest.approx(aps.mean())
    assert plots.histogram_counts("ap").sum() == n
    refreshes = len(calls)
    qtbot.wait(350)
    assert len(calls) == refreshes  # nothing new: no redraw
    plots.stop_live()
    assert not plots.timer.isActive()

    # buffers grow past their capacity (appends are amortized O(1))
    buf = RunningBuffer(capacity=2)
    for i in range(5):
        buf.append(i + 1, {"mp@1": 0.5, "map": i / 10, "amnro": 0.2}, float("nan") if i == 2 else i / 10, 0.3)
    np.testing.assert_array_equal(buf.x, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(buf.series("map"), [0, 0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(buf.ap, [0, 0.1, 0.3, 0.4])  # NaN (open-set) dropped
