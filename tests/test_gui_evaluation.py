"""The Evaluation tab, driven offscreen: a run end to end, a second run compared, a sweep, cancel,
the verdict's figures and its re-calibration stored in the index."""

from __future__ import annotations

import csv
import html
import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QRect, QSettings, Qt
from PySide6.QtGui import QColor, QPainter, QPixmap
from PySide6.QtWidgets import QMessageBox, QScrollArea

from museum_search.cli import main
from museum_search.core.answer._rerank import RerankOptions, icfrr_advice
from museum_search.core.answer._verdict import Verdict, operating_points, recalibrated
from museum_search.core.evaluation._export import index_id, run_spec, same_numbers
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._reports import COMPARED
from museum_search.core.evaluation._runner import (
    DESCRIBING,
    LOADING,
    NEIGHBOURS,
    VERIFYING,
    precision_recall_curve,
    run_evaluation,
)
from museum_search.core.evaluation._stats import format_p, paired_bootstrap_test, paired_randomization_test, stars
from museum_search.core.index._store import Index, writer_lock
from museum_search.gui import workers
from museum_search.gui.evaluation_tab import EvaluationTab
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.comparison_table import (
    DIRECTION_COLOURS,
    P_COLUMN,
    VALUE_ROLE,
    VERDICT_COLUMN,
    VERDICT_FIGURES,
)
from museum_search.gui.widgets.plots import (
    HIST_BINS,
    METRIC_COLOURS,
    METRIC_LABELS,
    METRICS,
    VERDICT_CURVES,
    RunningBuffer,
)
from museum_search.gui.widgets.query_table import SORT_ROLE
from museum_search.gui.widgets.run_list import name_lines

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
TIMEOUT = 300_000  # ms: describing the queries takes a few seconds, much more on a loaded machine
N_QUERIES = 8  # queries of the subset evaluated (keeps the test lean)
SCREENSHOT = Path("/tmp/evaluation_tab.png")
VERDICT_SCREENSHOT = Path("/tmp/eval_tab.png")
P_MAP = P_COLUMN + 1  # column of the paired test of MAP in the comparison table


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
    assert done, f"no run finished: {tab.progress_panel.status_label.text()}"
    return done[0]


def _error_dialogs(widget) -> list[QMessageBox]:
    return [b for b in widget.findChildren(QMessageBox, "errorDialog") if b.isVisible()]


def test_evaluate_compare_and_export(qtbot, tab, data, tmp_path):
    index = data.index
    assert tab.index is index  # follows the application's index

    # query set: detected layout shown
    assert tab.load_queryset_path(data.queries)
    qs = load_queryset(data.queries)
    assert tab.queryset_box.detected_label.text().startswith("Detected: ")
    assert html.escape(qs.summary()) in tab.queryset_box.detected_label.text()
    n = len(qs.queries)

    # ---- first run: no re-ranking, verified (the defaults) -----------------------------------
    assert tab.rerank.verify_check.isChecked() and tab.rerank.names() == []
    assert "spatial" not in tab.rerank.rerank_checks
    run1 = _evaluate(qtbot, tab)
    report = run1.report
    summary = report.summary
    assert summary["verified"] and summary["query_regions"] and report.rerank == run1.settings.summary()
    assert tab.progress_panel.bar.maximum() == n and tab.progress_panel.bar.value() == n
    assert not tab.plots.timer.isActive()
    assert len(report.records) == n  # nothing skipped
    for metric in ("mp@1", "map", "amnro"):
        x, y = tab.plots.running_curves[metric].getData()
        np.testing.assert_array_equal(x, np.arange(1, n + 1))
        assert y[-1] == pytest.approx(summary[metric])
    for key in ("map", "amnro"):
        counts = tab.plots.histogram_counts(key)
        assert counts.sum() == summary["queries"]
        expected, _ = np.histogram(report.per_query_values(key), bins=HIST_BINS)
        np.testing.assert_array_equal(counts, expected)
    rx, py = tab.plots.pr_curve.getData()
    recall, precision = precision_recall_curve(report)
    np.testing.assert_allclose(rx, recall)
    np.testing.assert_allclose(py, precision)

    # per-query table: one row per query, sortable
    assert tab.queries.proxy.rowCount() == n
    tab.queries.table.sortByColumn(3, Qt.SortOrder.DescendingOrder)  # AP
    aps = [tab.queries.proxy.index(r, 3).data(SORT_ROLE) for r in range(n)]
    assert aps == sorted(aps, reverse=True)
    tab.queries.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)  # query name
    names = [tab.queries.proxy.index(r, 0).data() for r in range(n)]
    assert names == sorted(names)
    tab.queries.table.sortByColumn(5, Qt.SortOrder.AscendingOrder)  # top-1 instance
    tops = [tab.queries.proxy.index(r, 5).data(SORT_ROLE) for r in range(n)]
    assert tops == sorted(tops)

    # selecting a row shows the query's top results, correct ones marked
    tab.queries.table.sortByColumn(4, Qt.SortOrder.DescendingOrder)  # worst MNRO first: a query with misses
    tab.queries.select_row(0)
    rec = tab.queries.model.record(tab.queries.proxy.mapToSource(tab.queries.proxy.index(0, 0)).row())
    k = min(tab.state.settings.top_k, len(index))
    results = tab.queries.result_grid.results()
    assert [r.row for r in results] == [int(i) for i in rec.ranking[:k]]
    assert [r.rank for r in results] == list(range(1, k + 1))
    assert tab.queries.result_grid.correct() == [bool(c) for c in rec.relevance[:k]]
    assert [c.mark for c in tab.queries.result_grid.cards()] == ["correct" if c else "incorrect" for c in rec.relevance[:k]]
    assert Path(rec.query).name in tab.queries.query_info.text()

    # ---- second run: ICFRR, not verified, compared with the first ----------------------------
    tab.rerank.set_names(["icfrr"])
    tab.rerank.set_options(RerankOptions(k_q=2, k_g=2, beta=0.5, iterations=5))
    tab.rerank.set_verify(False)
    assert tab.rerank.names() == ["icfrr"] and not tab.rerank.verify_top_spin.isEnabled()
    settings = tab.query_settings()
    assert (settings.rerank, settings.verify, settings.options.k_q) == (("icfrr",), False, 2)
    run2 = _evaluate(qtbot, tab)
    # run names: the query set, what differs from the default settings, the time
    assert run1.name.startswith(f"{data.queries.name} · default · ")
    assert run2.name.startswith(f"{data.queries.name} · ICFRR K 2/2, not verified · ")
    assert [tab.run_list.list.item(i).text().removeprefix("⚠ ") for i in range(2)] == [name_lines(run1.name),
                                                                                      name_lines(run2.name)]
    assert run2.settings.label() in tab.run_list.list.item(1).toolTip()
    assert not run2.report.summary["verified"] and run2.report.summary["verdict"]["min_inliers"] is None
    assert all(r.top_inliers is None for r in run2.report.records)
    assert [r.key for r in tab.compared_runs()] == [run1.key, run2.key]
    assert tab.selected_run() is run2
    # the other ticked run is overlaid
    x, _ = tab.plots.running_overlays[run1.key]["map"].getData()
    np.testing.assert_array_equal(x, np.arange(1, n + 1))
    assert run1.key in tab.plots.pr_overlays

    assert tab.baseline_run() is run1  # the first run by default
    assert tab.compare.table.rowCount() == 2 and len(tab.comparison) == 2
    for row, run in zip(tab.comparison, (run1, run2)):
        assert row["key"] == run.key
        for metric in ("mp@1", "map", "amnro"):
            mean, lo, hi = row["ci"][metric]
            assert mean == pytest.approx(run.report.summary[metric])
            assert lo - 1e-6 <= mean <= hi + 1e-6  # the JSON report's intervals (6 decimals)
        assert row["verdict"] == {k: run.report.summary["verdict"][k] for k in VERDICT_FIGURES}
    base_row, other = tab.comparison
    assert base_row["baseline"] and all(p is None for p in base_row["p"].values())
    for metric, key, higher in (("mp@1", "mp@1", True), ("map", "map", True), ("amnro", "amnro", False)):
        p = other["p"][metric]
        assert p is not None and 0.0 < p <= 1.0
        assert other["stars"][metric] == stars(p)
        # the randomization test is the default; the bootstrap p and the differing queries are shown with it
        values = (run2.report.per_query_values(key), run1.report.per_query_values(key))
        direct = paired_randomization_test(*values, higher_is_better=higher)
        assert p == pytest.approx(direct.p_value)
        boot = paired_bootstrap_test(*values, higher_is_better=higher).p_value
        assert other["bootstrap_p"][metric] == pytest.approx(boot)
        differing = int(np.count_nonzero(np.nan_to_num(values[0] - values[1])))
        assert other["differing"][metric] == differing
        assert other["direction"][metric] == direct.direction
        item = tab.compare.table.item(1, P_MAP + ("mp@1", "map", "amnro").index(metric) - 1)
        cell = item.text()
        assert cell.startswith(f"{direct.direction}, p = {format_p(p)}")
        assert f"\n{differing} differ\nbootstrap {format_p(other['bootstrap_p'][metric])}" in cell
        if stars(p) and direct.direction in DIRECTION_COLOURS:
            assert item.foreground().color().name() == DIRECTION_COLOURS[direct.direction]
    assert tab.compare.table.item(1, P_MAP).data(VALUE_ROLE) == other["p"]["map"]
    assert tab.compare.table.item(0, P_MAP).text() == "baseline"

    # the baseline can be changed; an unticked run leaves the comparison
    tab.compare.set_baseline_key(run2.key)
    assert tab.comparison[0]["p"]["map"] is not None and tab.comparison[1]["baseline"]
    tab.compare.set_baseline_key(run1.key)
    tab.run_list.set_checked(run1.key, False)
    assert [r["key"] for r in tab.comparison] == [run2.key] and not tab.plots.running_overlays
    tab.run_list.set_checked(run1.key, True)
    assert len(tab.comparison) == 2

    # ---- export the selected run ------------------------------------------------------------
    jpath = tab.export_json(tmp_path / "run.json")
    cpath = tab.export_csv(tmp_path / "run.csv")
    doc = json.loads(Path(jpath).read_text(encoding="utf-8"))
    assert doc["summary"]["map"] == pytest.approx(run2.report.summary["map"], abs=1e-6)
    assert doc["summary"]["rerank"] == run2.settings.label() == "icfrr, not verified (K 2/2, β 0.50, 5 it)"
    assert len(doc["queries"]) == n
    # what runs it again: core's RunSpec of the run, as evaluate --json writes it
    spec = run_spec(run2.report, index, tab.queryset_source(), tab.queryset, name=run2.name, batch_size=tab.batch_size)
    assert doc["run"] == json.loads(json.dumps(spec.to_dict()))
    assert doc["run"]["settings"]["options"]["k_q"] == 2 and doc["run"]["settings"]["verify"] is False
    assert doc["run"]["index"]["id"] == index_id(index) and doc["run"]["query_set"]["queries"] == n
    with open(cpath, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n and all(r["run"] == run2.name and r["k_q"] == "2" and r["verify"] == "0" for r in rows)
    assert {r["in_collection"] for r in rows} <= {"0", "1"} and all(r["reason"] for r in rows)
    # evaluate --settings on the tab's export gives the same numbers
    assert main(["evaluate", "--settings", str(jpath), "--json", str(tmp_path / "again.json")]) == 0
    assert same_numbers(doc, json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))) == []

    # ---- screenshot: the selected query of the second run, thumbnails loaded ---------------
    tab.queries.table.sortByColumn(4, Qt.SortOrder.DescendingOrder)
    tab.queries.select_row(0)
    qtbot.waitUntil(lambda: all(c.has_thumbnail() for c in tab.queries.result_grid.cards())
                    and tab.queries.query_image.pixmap() is not None and not tab.queries.query_image.pixmap().isNull(),
                    timeout=60_000)
    qtbot.wait(200)
    assert tab.grab().save(str(SCREENSHOT))
    assert not _error_dialogs(tab)


def test_sweep_plots_one_point_per_value(qtbot, tab, data):
    assert tab.load_queryset_path(data.queries)
    tab.rerank.set_names([])
    tab.rerank.set_options(RerankOptions(beta=0.5, iterations=5))
    tab.rerank.set_verify(False)
    tab.queryset_box.regions_check.setChecked(False)
    # the sweep's controls are on its page
    for w in (tab.sweep.param_combo, tab.sweep.values_edit, tab.sweep.run_button, tab.sweep.cancel_button):
        assert tab.sweep.isAncestorOf(w)
    shown = []  # (stage of the last record, status shown then)
    set_status = tab._set_status
    tab._set_status = lambda text: (shown.append((getattr(tab._last_progress, "stage", None), text)),
                                    set_status(text))
    with qtbot.waitSignal(tab.sweep_finished, timeout=TIMEOUT) as blocker:
        assert tab.run_sweep("k", [1, 2])
        assert tab.pages.currentWidget() is tab.sweep and tab.sweep.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: not tab.is_running(), timeout=TIMEOUT)
    # the status says what is happening: describing while describing (the bug: "Ranking the
    # collection against itself" while the queries were described), then the value answered
    n = len(tab.queryset.queries)
    describing = [text for stage, text in shown if stage == DESCRIBING]
    assert describing and all(t.startswith("Describing the query photos: ") for t in describing)
    assert f"Describing the query photos: {n} of {n}" in " ".join(describing)
    assert not any(t.startswith("Ranking the collection") for stage, t in shown if stage != NEIGHBOURS)
    assert tab.sweep.status.text().startswith("Sweep done: best MAP")
    points = blocker.args[0]
    assert [p.value for p in points] == [1.0, 2.0] and tab.sweep_points == points
    assert [(p.options.k_q, p.options.k_g, p.options.beta) for p in points] == [(1, 1, 0.5), (2, 2, 0.5)]
    assert all(p.summary["query_regions"] is False for p in points)  # the tab's settings reach the sweep
    for metric in ("map", "mp@1"):
        x, y = tab.sweep.plot.sweep_curves[metric].getData()
        np.testing.assert_array_equal(x, [1.0, 2.0])
        np.testing.assert_allclose(y, [p.summary[metric] for p in points])
    assert tab.sweep.table.rowCount() == 2
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
    assert 1 <= tab.progress_panel.bar.value() < n
    assert "cancelled" in tab.progress_panel.status_label.text()
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
    assert tab.queryset is None and tab.queryset_box.detected_label.text() == "No query set."
    assert not tab.open_index(tmp_path / "empty")
    assert tab.export_json(tmp_path / "x.json") is None  # nothing to export
    assert not tab.run_sweep("k", "0")  # no query set: refused before any work
    assert len(_error_dialogs(tab)) == 5 and not tab.is_running()


def test_unknown_instances_are_shown_apart_from_open_set(qtbot, tab, data, tmp_path):
    """A ground-truth typo is not silently an open-set query: the tab says which names are missing."""
    rows = _read_truth(data.queries / "ground_truth.csv")
    typo_query = next(r["query"] for r in rows if r["instance"])
    qdir = tmp_path / "typo"
    qdir.mkdir()
    with open(qdir / "ground_truth.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["query", "instance"])
        for r in rows:
            shutil.copy(data.queries / r["query"], qdir / r["query"])
            w.writerow([r["query"], "harbor_lightz" if r["query"] == typo_query else r["instance"]])
    n_open = sum(1 for r in rows if not r["instance"])
    warning = ("1 query names 1 instance not in this index: harbor_lightz — check the ground truth or the index "
               "(not averaged: 1 query)")

    assert tab.load_queryset_path(qdir)
    tab.rerank.set_names([])  # what is checked here does not depend on verification
    tab.rerank.set_verify(False)
    assert html.escape(warning) in tab.queryset_box.detected_label.text()  # before the run
    assert "open-set queries" not in tab.queryset_box.detected_label.text()
    run = _evaluate(qtbot, tab)
    s = run.report.summary
    assert s["unknown_instance_queries"] == 1 and s["unknown_instances"] == ["harbor_lightz"]
    assert s["open_set_queries"] == n_open
    assert s["queries"] == len(rows) - n_open - 1
    assert warning in tab.status_text()  # after the run
    assert warning in tab.run_list.list.item(0).toolTip()

    row = next(r for r in range(tab.queries.proxy.rowCount()) if tab.queries.proxy.index(r, 0).data() == typo_query)
    assert tab.queries.proxy.index(row, 1).data() == "not in index: harbor_lightz"
    assert "check the ground truth" in tab.queries.proxy.index(row, 1).data(Qt.ItemDataRole.ToolTipRole)
    tab.queries.select_row(row)
    assert "not in this index: harbor_lightz" in tab.queries.query_info.text()
    assert "open-set" not in tab.queries.query_info.text()
    assert not _error_dialogs(tab)


def test_verdict_figures_operating_points_and_recalibration(qtbot, tab, data, tmp_path):
    """The tab shows the runner's verdict figures, plots them against the threshold, and stores a
    verdict re-calibrated on the labelled queries in the index (a copy of the session's)."""
    shutil.copytree(data.index.path, tmp_path / "index")
    index = Index.load(tmp_path / "index")
    tab.state.set_index(index)
    assert tab.index is index
    queryset = load_queryset(SAMPLE / "queries")
    assert sum(1 for q in queryset.queries if not q.relevant) == 3  # unknown objects
    assert tab.load_queryset_path(SAMPLE / "queries")
    run = _evaluate(qtbot, tab)
    report = run.report

    # the figures are the runner's, with the same (default) settings
    expected = run_evaluation(data.index, queryset).summary["verdict"]
    assert expected["unknown_queries"] == 3
    assert run.verdict_figures == expected
    assert tab.comparison[0]["verdict"] == {k: expected[k] for k in VERDICT_FIGURES}
    for c, key in enumerate(VERDICT_FIGURES, start=VERDICT_COLUMN):
        assert tab.compare.table.item(0, c).data(VALUE_ROLE) == expected[key]
        assert tab.compare.table.item(0, c).text() == f"{100 * expected[key]:.1f} %"
    assert f"{100 * expected['unknown_rejected']:.1f} %" in tab.verdict_page.label.text()
    assert f"Verdict: unknown rejected {100 * expected['unknown_rejected']:.1f} %" in tab.status_text()

    # the operating points: three curves, one point per threshold, a line at the threshold in use
    pts = operating_points(report.evidence, verified=True, verdict=report.verdict)
    assert set(tab.verdict_page.plot.verdict_curves) == set(VERDICT_CURVES) == {"unknown_rejected", "known_rejected",
                                                                          "accuracy"}
    for key, curve in tab.verdict_page.plot.verdict_curves.items():
        x, y = curve.getData()
        assert len(x) == len(y) == len(pts["threshold"])
        np.testing.assert_array_equal(x, pts["threshold"])
        np.testing.assert_allclose(y, pts[key])
    assert report.verdict.threshold(True) == expected["threshold"] and expected["rule"] == report.verdict.rule(True)
    if report.verdict.model(True) is not None:
        # a calibrated verdict: the curves are its model refitted on these queries, on another confidence
        # scale than the model in use, whose threshold is therefore not drawn (its figures are in words)
        assert "confidence" in tab.verdict_page.plot.getPlotItem().getAxis("bottom").labelText
        assert not tab.verdict_page.plot.threshold_line.isVisible()
    else:
        assert tab.verdict_page.plot.threshold_line.isVisible()
        assert tab.verdict_page.plot.threshold_line.value() == report.verdict.threshold(True)

    # the operating point chosen: at most 10 % of the known objects rejected
    before = dict(index.verdict)
    want = recalibrated(report.evidence, report.verdict, 0.10, verified=True)
    tab.verdict_page.max_known_spin.setValue(10.0)
    assert tab.verdict_page.plot.candidate_line.value() == want.threshold(True)
    assert want.rule(True) in tab.verdict_page.candidate_label.text()
    assert tab.verdict_page.store_button.isEnabled()

    # another writer holds the index: the message is shown, nothing changes
    with writer_lock(index.path):
        with qtbot.waitSignal(tab.job_finished, timeout=TIMEOUT):
            assert tab.store_verdict()
    dialogs = _error_dialogs(tab)
    assert len(dialogs) == 1 and "being written" in dialogs[0].text()
    dialogs[0].close()
    assert index.verdict == before and Index.load(index.path).verdict == before

    # stored; the application's views get the index again (the Search tab rebuilds its pipelines)
    changed = []
    tab.state.index_changed.connect(changed.append)
    with qtbot.waitSignal(tab.verdict_stored, timeout=TIMEOUT) as blocker:
        assert tab.store_verdict()
    qtbot.waitUntil(lambda: not tab.is_running(), timeout=TIMEOUT)
    assert blocker.args[0] == want and want.source.startswith("labelled queries (21)")
    assert Verdict.from_dict(Index.load(index.path).verdict) == want
    assert index.verdict == want.to_dict() and changed == [index]
    assert Verdict.from_dict(data.index.verdict) == report.verdict  # the session's index is untouched
    assert "Verdict stored in" in tab.status_text()

    # a run without unknown queries cannot re-calibrate: the button is off, the figure is n/a
    s = report.summary
    no_unknown = replace(report, summary={**s, "verdict": {**s["verdict"], "unknown_queries": 0,
                                                             "unknown_rejected": None}})
    tab.add_run(replace(run, key=99, name="no unknown queries", report=no_unknown))
    assert tab.selected_run().key == 99 and not tab.verdict_page.store_button.isEnabled()
    assert tab.compare.table.item(1, VERDICT_COLUMN).text() == "n/a"
    assert not tab.store_verdict() and len(_error_dialogs(tab)) == 1

    tab.select_run(run)
    tab.pages.setCurrentWidget(tab.verdict_page)
    qtbot.wait(200)
    assert tab.grab().save(str(VERDICT_SCREENSHOT))


def test_live_plots_redraw_on_the_timer_not_per_record(qtbot):
    """The progress callback only appends; the curves change when the 10 Hz timer refreshes them."""
    from museum_search.core.evaluation._runner import EvalStep, QueryRecord
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
        rec = QueryRecord(i, f"q{i}.jpg", ["a"], {"mp@1": 1.0, "map": float(aps[i]), "amnro": 0.1},
                          np.arange(3), np.zeros(3, np.float32), np.array([True, False, False]), 1)
        plots.add_step(EvalStep(i + 1, n, record=rec, running={"mp@1": 1.0, "map": float(aps[: i + 1].mean()), "amnro": 0.1}))
    assert calls == []  # nothing drawn from the progress callback
    qtbot.waitUntil(lambda: len(calls) >= 1, timeout=2000)  # the timer's refresh
    x, y = curve.getData()
    np.testing.assert_array_equal(x, np.arange(1, n + 1))
    assert y[-1] == pytest.approx(aps.mean())
    assert plots.histogram_counts("map").sum() == n
    refreshes = len(calls)
    qtbot.wait(350)
    assert len(calls) == refreshes  # nothing new: no redraw
    plots.stop_live()
    assert not plots.timer.isActive()

    # buffers grow past their capacity (appends are amortized O(1))
    buf = RunningBuffer(capacity=2)
    for i in range(5):
        buf.append(i + 1, {"mp@1": 0.5, "map": i / 10, "amnro": 0.2}, {"map": float("nan") if i == 2 else i / 10, "amnro": 0.3})
    np.testing.assert_array_equal(buf.x, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(buf.series("map"), [0, 0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(buf.per_query("map"), [0, 0.1, 0.3, 0.4])  # NaN (open-set) dropped


# ---------------------------------------------------------------------------------------------
# layout, waiting, the ICFRR warning (issue 13)


def _fully_visible(w) -> bool:
    """Shown, and not cut by its parents (a button cut in half fails)."""
    return w.isVisible() and w.visibleRegion().boundingRect() == w.rect()


def test_layout_holds_at_1024x700_and_up(qtbot, data, tmp_path):
    """Run and export buttons uncut, the sweep's controls on its page, every plot in view, the
    legend of four runs outside the plots, the settings scrolled to when the window is short."""
    from museum_search.gui.main_window import MainWindow
    from museum_search.gui.widgets.plots import run_colour

    state = AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))
    win = MainWindow(state)
    qtbot.addWidget(win)
    win.show()
    state.set_index(data.index)
    tab = win.evaluation_tab
    win.tabs.setCurrentWidget(tab)
    try:
        assert tab.load_queryset_path(data.queries)
        tab.rerank.set_names([])
        tab.rerank.set_verify(False)
        tab.queryset_box.regions_check.setChecked(False)
        run = _evaluate(qtbot, tab)
        for k in range(2, 5):  # four runs compared, long names
            tab.add_run(replace(run, key=100 + k, colour=run_colour(k),
                                name=f"icfrr + dba, not verified (K 7/7, β 0.35, 9 it) · run number {k}"))
        tab.select_run(tab.runs[0])
        for size in ((1024, 700), (1280, 820), (1600, 1000)):
            win.resize(*size)
            qtbot.waitUntil(lambda size=size: (win.width(), win.height()) == size, timeout=5000)
            qtbot.wait(100)
            for b in (tab.run_button, tab.cancel_button, tab.run_list.remove_button, tab.run_list.export_json_button,
                      tab.run_list.export_csv_button, tab.progress_panel.bar):
                assert _fully_visible(b), (size, b.text() if hasattr(b, "text") else b)
            # every plot lies inside the plots' view
            view = tab.plots.viewport().rect()
            for item in (tab.plots.running_plot, tab.plots.pr_plot, *tab.plots.hist_plots.values()):
                rect = tab.plots.mapFromScene(item.sceneBoundingRect()).boundingRect()
                assert view.adjusted(-1, -1, 1, 1).contains(rect), (size, item)
            # the runs are named outside the data: no legend in a plot, one legend beside them
            assert tab.plots.running_plot.legend is None and tab.plots.pr_plot.legend is None
            legend = tab.plots.legend
            assert legend.isVisible() and [e[0] for e in legend.entries()][1:] == [r.name for r in tab.runs[1:]]
            top_left = legend.mapTo(win, legend.rect().topLeft())
            plots_top_left = tab.plots.mapTo(win, tab.plots.rect().topLeft())
            assert not legend.rect().translated(top_left).intersects(tab.plots.rect().translated(plots_top_left))
            for lbl in legend.labels():  # long names elided to the room there is, in full in the tooltip
                assert lbl.fontMetrics().horizontalAdvance(lbl.text()) <= lbl.width()
                assert lbl.toolTip() == lbl.full_text() and (lbl.text() == lbl.full_text() or "…" in lbl.text())
            _check_legend_is_the_lines(tab)
            _check_running_axis(tab, size)
            _check_run_list_names(tab, size)
            _check_verdict_page(qtbot, tab, size)
            # the settings scroll: the last one can be brought into view
            scroll = tab.findChild(QScrollArea, "evalControlsScroll")
            scroll.ensureWidgetVisible(tab.rerank.verify_check)
            qtbot.wait(50)
            assert _fully_visible(tab.rerank.verify_check), size
            # the sweep's page shows its controls
            tab.pages.setCurrentWidget(tab.sweep)
            qtbot.wait(50)
            for w in (tab.sweep.param_combo, tab.sweep.values_edit, tab.sweep.run_button, tab.sweep.cancel_button):
                assert _fully_visible(w), (size, w)
            _check_compare_page(qtbot, tab, size)
            tab.pages.setCurrentIndex(0)
    finally:
        win.close()
        assert workers.wait_all(TIMEOUT)


def _check_legend_is_the_lines(tab) -> None:
    """The legend's samples are the pens of the lines: each metric's colour is its curves' colour,
    each run's line style its curves' style (running means and precision–recall), its square the
    colour of its precision–recall curve (issue 23: the runs were named in colours no line had)."""
    plots, legend = tab.plots, tab.plots.legend
    metric_pens = {e.name: e.pen for e in legend.metric_entries()}
    assert list(metric_pens) == [METRIC_LABELS[m] for m in METRICS]
    for m in METRICS:
        assert metric_pens[METRIC_LABELS[m]].color() == plots.running_curves[m].opts["pen"].color()
        assert plots.running_curves[m].opts["pen"].style() == Qt.PenStyle.SolidLine
    entries = legend.run_entries()
    shown, others = entries[0], entries[1:]
    assert shown.pen.style() == Qt.PenStyle.SolidLine and shown.colour == tab.selected_run().colour
    assert QColor(shown.colour) == plots.pr_curve.opts["pen"].color()
    drawn = [r for r in tab.compared_runs() if r.key != tab.selected_run().key]
    assert [e.name for e in others] == [r.name for r in drawn]
    for e, run in zip(others, drawn):
        for m in METRICS:
            pen = plots.running_overlays[run.key][m].opts["pen"]
            assert pen.style() == e.pen.style() != Qt.PenStyle.SolidLine
            assert pen.color() == QColor(METRIC_COLOURS[m])  # the metric's colour, not the run's
        pr = plots.pr_overlays[run.key].opts["pen"]
        assert pr.style() == e.pen.style() and pr.color() == QColor(e.colour) == QColor(run.colour)


def _drawn_tick_labels(axis) -> list[str]:
    """The tick labels ``axis`` draws at its size (pyqtgraph drops those that do not fit)."""
    pm = QPixmap(10, 10)
    p = QPainter(pm)
    try:
        specs = axis.generateDrawSpecs(p)
    finally:
        p.end()
    return [text for _rect, _flags, text in specs[2]]


def _check_running_axis(tab, size) -> None:
    """The running means' y axis is labelled at every quarter, with room above 1 (issue 23: a
    single label, "0.5", and lines at 1.0 against the frame)."""
    plot = tab.plots.running_plot
    assert _drawn_tick_labels(plot.getAxis("left")) == ["0", "0.25", "0.5", "0.75", "1"], size
    (_, _), (lo, hi) = plot.viewRange()
    height = plot.vb.height()
    assert (hi - 1.0) / (hi - lo) * height >= 5 and (0.0 - lo) / (hi - lo) * height >= 5, (size, lo, hi, height)


def _check_run_list_names(tab, size) -> None:
    """Every run's whole name is in the list (wrapped, never elided) and in its tooltip."""
    lst = tab.run_list.list
    fm = lst.fontMetrics()
    for i, run in enumerate(tab.runs):
        item = lst.item(i)
        assert item.text().removeprefix("⚠ ") == name_lines(run.name) and item.toolTip().startswith(run.name)
        rect = lst.visualItemRect(item)
        room = rect.width() - 2 * lst.iconSize().width() - 16  # the check box and the colour icon
        need = fm.boundingRect(QRect(0, 0, room, 10_000), int(Qt.TextFlag.TextWordWrap), item.text())
        assert need.width() <= room and need.height() <= rect.height(), (size, run.name, need, rect)
        assert "…" not in item.text()


def _check_verdict_page(qtbot, tab, size) -> None:
    """The verdict page's legend and the re-calibration's words are whole (issue 23: "wn objects
    rejected" and "Re-calibrate: known objects rejected a…" at 1024 and 1280)."""
    tab.pages.setCurrentWidget(tab.verdict_page)
    qtbot.wait(50)
    page = tab.verdict_page
    for label in (page.plot.legend, page.recalibrate_label):
        assert label.isVisible() and label.wordWrap(), size
        assert label.heightForWidth(label.contentsRect().width()) <= label.contentsRect().height(), size
        assert label.visibleRegion().boundingRect().width() == label.width(), size  # not cut by its parents
    for text, _colour in VERDICT_CURVES.values():
        assert text.replace(" ", "&nbsp;") in page.plot.legend.text()
    assert page.plot.getPlotItem().legend is None  # nothing over the curves
    side = tab.findChild(QScrollArea, "verdictSide")
    assert side.widget().width() <= side.viewport().width()  # the figures wrap, they are not cut on the right
    tab.pages.setCurrentIndex(0)


def _check_compare_page(qtbot, tab, size) -> None:
    """The Compare page: run names never cut; a significant drop shown as one (issue 23)."""
    tab.pages.setCurrentWidget(tab.compare)
    qtbot.wait(50)
    table = tab.compare.table
    assert table.rowCount() == len(tab.runs)
    for r, run in enumerate(tab.runs):
        item = table.item(r, 0)
        assert item.toolTip().startswith(run.name)
        head, _, rest = run.name.partition(" · ")
        assert item.text().startswith(f"{head}\n{rest}")
        # the text fits the cell: as wide as the column leaves (icon and margins off), no line elided
        room = table.columnWidth(0) - table.iconSize().width() - 12
        fm = table.fontMetrics()
        need = fm.boundingRect(QRect(0, 0, room, 10_000), int(Qt.TextFlag.TextWordWrap), item.text())
        assert need.width() <= room and need.height() <= table.rowHeight(r), (size, run.name)
        assert fm.horizontalAdvance(head) <= room
    assert table.columnViewportPosition(0) == 0 and table.columnWidth(0) <= table.viewport().width()
    # ICFRR on the paintings: MP@1 0.967 -> 0.567, 12 queries of 30 worse
    drop = paired_randomization_test(np.array([0.0] * 12 + [1.0] * 17 + [0.0]), np.array([1.0] * 29 + [0.0]))
    rows = tab.compare.fill(tab.runs, tab.runs[0], lambda run, base: {m: drop for m in COMPARED})
    assert rows[1]["direction"]["mp@1"] == "worse" and rows[1]["p"]["mp@1"] == pytest.approx(2 / 4096)
    cell = table.item(1, P_COLUMN)
    assert cell.text().startswith("worse, p = 0.0005 ***")
    assert cell.foreground().color().name() == DIRECTION_COLOURS["worse"] and cell.font().bold()
    assert "worse" in cell.toolTip().lower() and "two-sided p = 0.0005" in cell.toolTip()
    tab._update_comparison()  # back to the real tests


@pytest.mark.parametrize("phase", ["loading", "describing", "answering", "sweep describing", "sweep answering"])
def test_cancel_does_not_wait_for_the_call_under_way(qtbot, tab, data, block, phase):
    """Cancel stops the job while a long call (loading the network, describing photos, answering
    one) is still running: the job yields every 0.1 s while it waits."""
    from museum_search.core.answer._pipeline import QueryPipeline
    from museum_search.core.evaluation import _runner as runner

    owner, name, stage = {
        "loading": (runner, "extractor_for_meta", LOADING),
        "describing": (QueryPipeline, "embed", DESCRIBING),
        "answering": (QueryPipeline, "answer", VERIFYING),
        "sweep describing": (QueryPipeline, "embed", DESCRIBING),
        "sweep answering": (QueryPipeline, "answer", "answering at K_q = K_g = 1"),
    }[phase]
    assert tab.load_queryset_path(data.queries)
    tab.rerank.set_names([])
    tab.rerank.set_verify(True)
    tab.queryset_box.regions_check.setChecked(False)
    blocked = block(owner, name)
    try:
        assert tab.run_sweep("k", [1, 2]) if phase.startswith("sweep") else tab.run_evaluation()
        qtbot.waitUntil(lambda: blocked.started.is_set() and getattr(tab._last_progress, "stage", None) == stage,
                        timeout=TIMEOUT)
        assert tab.progress_panel.status_label.text().startswith(stage[:1].upper() + stage[1:])
        tab.cancel()
        qtbot.waitUntil(lambda: not tab.is_running(), timeout=30_000)
        assert not blocked.release.is_set()  # stopped while the call was still blocked
        assert "cancelled" in tab.progress_panel.status_label.text()
        assert tab.run_button.isEnabled() and not tab.cancel_button.isEnabled() and tab.runs == []
    finally:
        blocked.release.set()


def test_icfrr_warning_wherever_icfrr_runs_on_a_collection_it_cannot_help(qtbot, tab, data, single_photo_index):
    assert tab.load_queryset_path(data.queries)
    tab.rerank.set_names([])
    tab.rerank.set_verify(False)
    tab.queryset_box.regions_check.setChecked(False)
    # a collection with 3-4 photos per object: ICFRR may help, no warning
    tab.rerank.set_names(["icfrr"])
    tab.rerank.set_verify(False)
    assert tab.icfrr_warning.isHidden() and tab.sweep.warning.isHidden()
    # one photo per object: core's warning above Run and on the sweep's page
    tab.pages.setCurrentWidget(tab.sweep)
    tab.state.set_index(single_photo_index)
    advice = icfrr_advice(single_photo_index.labels)
    assert advice and "cannot help" in advice
    assert tab.icfrr_warning.isVisibleTo(tab) and tab.icfrr_warning.text() == f"⚠ {advice}"
    assert tab.sweep.warning.isVisibleTo(tab) and advice in tab.sweep.warning.text()
    tab.rerank.set_names(["icfrr"])  # by hand: still no help
    tab.rerank.set_options(RerankOptions(k_q=3, k_g=3))
    tab.rerank.set_verify(False)
    assert tab.icfrr_warning.isVisibleTo(tab)
    tab.rerank.set_names([])
    tab.rerank.set_verify(False)
    assert tab.icfrr_warning.isHidden() and tab.sweep.warning.isVisibleTo(tab)  # a sweep always runs ICFRR
    # a run: the warning stays in view while it runs, then in the status and on the run
    tab.rerank.set_names(["icfrr"])
    tab.rerank.set_verify(False)
    run = _evaluate(qtbot, tab)
    assert run.report.summary["icfrr_advice"] == advice
    assert tab.icfrr_warning.isVisibleTo(tab)
    # said once: under the settings and on the run, not again in the status
    assert advice not in tab.status_text() and advice in tab.icfrr_warning.text()
    item = tab.run_list.list.item(0)
    assert item.text().startswith("⚠ ") and advice in item.toolTip()


def test_search_tab_shows_the_icfrr_warning(qtbot, tmp_path, single_photo_index, data):
    from museum_search.gui.search_tab import SearchTab

    state = AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))
    st = SearchTab(state)
    qtbot.addWidget(st)
    st.show()
    try:
        state.set_index(single_photo_index)
        assert st.icfrr_warning.isHidden()
        st.rerank.set_names(["icfrr"])
        advice = icfrr_advice(single_photo_index.labels, st.rerank.options())
        assert advice and st.icfrr_warning.isVisibleTo(st) and st.icfrr_warning.text() == f"⚠ {advice}"
        st.rerank.set_names([""])
        assert st.icfrr_warning.isHidden()
        st.rerank.set_names(["icfrr"])
        state.set_index(data.index)  # 3-4 photos per object: gone
        assert st.icfrr_warning.isHidden()
    finally:
        st.shutdown()
        assert workers.wait_all(TIMEOUT)


@pytest.mark.parametrize("size", [(1024, 700), (1280, 820)])
def test_run_and_cancel_stay_put_and_the_settings_keep_their_rows(qtbot, data, tmp_path, single_photo_index, block,
                                                                  size):
    """At 1024×700 and 1280×820, Run and Cancel are where they were before, during and after a run, and the
    settings' view keeps its height, also after a run with the ICFRR warning (issue 23: they moved
    about 100 px, so a Cancel click missed, and the settings shrank to 1–2 rows)."""
    from museum_search.core.answer._pipeline import QueryPipeline
    from museum_search.gui.main_window import MainWindow

    state = AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))
    win = MainWindow(state)
    qtbot.addWidget(win)
    win.show()
    state.set_index(single_photo_index)
    tab = win.evaluation_tab
    win.tabs.setCurrentWidget(tab)
    win.resize(*size)
    qtbot.waitUntil(lambda: (win.width(), win.height()) == size, timeout=5000)
    scroll = tab.findChild(QScrollArea, "evalControlsScroll")

    def where() -> tuple:
        qtbot.wait(50)  # the layouts have settled
        return (tab.run_button.mapToGlobal(tab.run_button.rect().topLeft()),
                tab.cancel_button.mapToGlobal(tab.cancel_button.rect().topLeft()),
                scroll.viewport().height(), tab.progress_panel.status_label.height())

    try:
        assert tab.load_queryset_path(data.queries)
        tab.rerank.set_names(["icfrr"])
        tab.rerank.set_verify(False)
        tab.queryset_box.regions_check.setChecked(False)
        assert tab.icfrr_warning.isVisibleTo(tab)  # one photo per object: ICFRR cannot help
        before = where()
        assert before[2] >= 200  # the settings show several rows
        blocked = block(QueryPipeline, "answer")
        assert tab.run_evaluation()
        qtbot.waitUntil(blocked.started.is_set, timeout=TIMEOUT)
        during = where()
        assert tab.cancel_button.isEnabled() and during == before
        blocked.release.set()
        qtbot.waitUntil(lambda: not tab.is_running(), timeout=TIMEOUT)
        assert tab.runs and tab.runs[0].report.summary["icfrr_advice"]
        after = where()
        assert after == before, (before, during, after)
        # the status is cut at its lines, never taller; whole in its tooltip
        status = tab.progress_panel.status_label
        assert status.text() == tab.status_text() or (status.text().endswith("…")
                                                      and status.toolTip() == tab.status_text())
        assert status.heightForWidth(status.contentsRect().width()) <= status.height()
        # a long status (an error with a path) does not move them either
        tab._set_status("Evaluation failed: " + "a very long reason with a path /x/y/z " * 20)
        assert where() == before and tab.progress_panel.status_label.text().endswith("…")
        _check_run_list_names(tab, size)
    finally:
        win.close()
        assert workers.wait_all(TIMEOUT)
