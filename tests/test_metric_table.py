"""The metric table of core (``museum_search.core.evaluation.METRICS``, issue 32): one key per metric
for its mean and its per-query values, and every view's list of metrics taken from it: the runner's
records, summary and running means, the reports (intervals, paired tests, CSV columns), the exports
(what a re-run must give again), ``evaluate``'s printout, the plots and the Evaluation tab's tables.
Exports written with the older per-query keys (``p@1``, ``ap``, ``mnro``, ``nmrr``, ``rr``) are read
back with today's."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from museum_search.core.evaluation import (
    COMPARED,
    HEADLINE_METRICS,
    METRICS,
    PRIMARY,
    PRINTED_METRICS,
    QUERY_METRICS,
    SUMMARY_METRICS,
    LabelledQuery,
    QuerySet,
    QuerySetSource,
    _export,
    _metrics,
    _reports,
    _stats,
    compare_with_baseline,
    current_keys,
    evaluate,
    paired_tests,
    read_run,
    run_spec,
    same_numbers,
    values_by_query,
    write_run_csv,
    write_run_json,
)
from museum_search.core.evaluation._runner import EvalStep
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta

#: The per-query keys of the exports written before the keys were unified.
OLD_KEYS = {"p@1": "mp@1", "ap": "map", "mnro": "amnro", "nmrr": "anmrr", "rr": "mrr"}


@pytest.fixture(scope="module")
def run():
    """A run of 10 queries given as descriptors (2 of them open-set) on a synthetic index of 6
    objects with 5 photos each: no network. (index, query set, report, its EvalSteps)"""
    rng = np.random.default_rng(0)
    dim, objects, photos = 16, 6, 5
    centres = rng.normal(size=(objects, dim))
    refs = np.repeat(centres, photos, axis=0) + 0.6 * rng.normal(size=(objects * photos, dim))
    refs = (refs / np.linalg.norm(refs, axis=1, keepdims=True)).astype(np.float32)
    items = [Item(f"o{i // photos}-{i % photos}.jpg", 1, 0.0, f"o{i // photos}") for i in range(objects * photos)]
    meta = BackboneMeta(name="dummy", weights_id="none", head="gem", input_policy="longest_side", size=64,
                        scales=(1.0,), gem_p=3.0, dim=dim, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    index = Index("/nowhere", meta, items, refs)
    q = np.vstack([centres[[0, 1, 2, 3, 4, 5, 0, 3]] + 0.9 * rng.normal(size=(8, dim)), rng.normal(size=(2, dim))])
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    truth = ["o0", "o1", "o2", "o3", "o4", "o5", "o0", "o3", "", ""]
    queries = [LabelledQuery(f"row {i}", frozenset({t} - {""}), row=i) for i, t in enumerate(truth)]
    qs = QuerySet("descriptors", "/nowhere", queries, [], descriptors=q)
    gen = evaluate(index, qs)
    steps = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            report = stop.value
            break
    return index, qs, report, [s for s in steps if isinstance(s, EvalStep)]


def test_the_table_is_consistent():
    assert all(key == m.key for key, m in METRICS.items())
    columns = [m.column for m in METRICS.values() if m.column]
    assert sorted(columns) == list(range(1, len(columns) + 1))  # per-query columns 1..n, each once
    assert list(QUERY_METRICS) == ["mp@1", "p@5", "map", "amnro", "anmrr", "mrr"]  # the exports' order
    assert list(SUMMARY_METRICS) == ["mp@1", "map", "amnro", "anmrr", "p@5", "mrr", "r-precision", "p@10"]
    assert list(HEADLINE_METRICS) == ["mp@1", "map", "amnro", "gap"]
    assert list(COMPARED) == ["mp@1", "map", "amnro"]
    assert list(PRINTED_METRICS) == ["mp@1", "map", "amnro", "gap", "anmrr", "p@5", "all_objects", "extra_objects"]
    assert PRIMARY is METRICS["map"]
    assert _metrics.HIGHER_IS_BETTER == {k: m.higher_is_better for k, m in METRICS.items()}
    assert [k for k, m in METRICS.items() if not m.higher_is_better] == ["amnro", "anmrr", "anar", "extra_objects"]
    assert _metrics.OLD_QUERY_KEYS == OLD_KEYS
    # every mean and every per-query figure is one summarize computes (one key for both)
    rel = np.array([[1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0] * 12], bool)
    out = _metrics.summarize(rel, np.array([3, 0]), ks=(1, 5, 10))
    for key, m in METRICS.items():
        if m.mean:
            assert key in out and key in out["per_query"]
            assert out[key] == pytest.approx(np.nanmean(out["per_query"][key]))
    m = METRICS["map"]
    assert (m.text(0.97531), m.text(float("nan")), m.text(None)) == ("0.975", "—", "—")
    assert (m.percent(0.97531), m.percent(None)) == (" 97.53", "   n/a")
    assert (METRICS["map"].better, METRICS["amnro"].better) == ("higher", "lower")


def test_current_keys_maps_the_old_per_query_keys():
    old = {"query": "q.jpg", "p@1": 1.0, "p@5": 0.4, "ap": 0.9, "mnro": 0.1, "nmrr": 0.2, "rr": 1.0, "reason": "x"}
    new = current_keys(old)
    assert list(new) == ["query", "mp@1", "p@5", "map", "amnro", "anmrr", "mrr", "reason"]  # in place
    assert [new[k] for k in new] == list(old.values())
    assert current_keys(new) == new  # today's keys: unchanged


def test_the_runner_uses_the_table(run):
    index, qs, report, steps = run
    assert all(list(r.metrics) == list(QUERY_METRICS) for r in report.records)
    keys = [k for k in report.summary if k in METRICS]
    assert keys[: len(SUMMARY_METRICS)] == list(SUMMARY_METRICS)
    assert all(k in report.summary for m in HEADLINE_METRICS.values() for k in (m.key, m.companion) if k)
    assert list(steps[-1].running) == [*COMPARED, "queries"]
    for key in COMPARED:
        assert steps[-1].running[key] == pytest.approx(report.summary[key])
        assert report.per_query_values(key).mean() == pytest.approx(report.summary[key])
    assert report.summary["open_set_queries"] == 2


def test_the_reports_and_exports_use_the_table(run, tmp_path):
    index, qs, report, _ = run
    doc = _reports.report_dict(report, index)
    assert list(doc["summary"]["ci95"]) == list(COMPARED)
    assert all(set(QUERY_METRICS) <= set(q) for q in doc["queries"])
    assert list(values_by_query(report)) == list(COMPARED)
    assert list(paired_tests(values_by_query(report), values_by_query(report))) == list(COMPARED)
    assert list(_stats.bootstrap_cis(report.per_query, n_resamples=50)) == list(COMPARED)
    assert _reports.CSV_METRICS == tuple(QUERY_METRICS)
    assert _export.REPRODUCED[: len(SUMMARY_METRICS)] == tuple(SUMMARY_METRICS)
    assert {"gap", "gap_known"} <= set(_export.REPRODUCED)
    assert _export.REPRODUCED_PER_QUERY[: len(QUERY_METRICS)] == tuple(QUERY_METRICS)
    spec = run_spec(report, index, QuerySetSource("/nowhere/truth.csv"), qs, name="test")
    write_run_csv(tmp_path / "run.csv", report, index, spec)
    with (tmp_path / "run.csv").open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f))
    assert header[3: 3 + len(QUERY_METRICS)] == list(QUERY_METRICS)


def test_an_export_with_the_old_keys_runs_again(run, tmp_path):
    """A run exported before the keys were unified: read back with today's keys, it gives the same
    numbers as today's run (``evaluate --settings``), and serves as a baseline."""
    index, qs, report, _ = run
    spec = run_spec(report, index, QuerySetSource("/nowhere/truth.csv"), qs, name="test")
    doc = write_run_json(tmp_path / "new.json", report, index, spec)
    old = json.loads((tmp_path / "new.json").read_text(encoding="utf-8"))
    new_to_old = {v: k for k, v in OLD_KEYS.items()}
    old["queries"] = [{new_to_old.get(k, k): v for k, v in q.items()} for q in old["queries"]]
    assert "ap" in old["queries"][0] and "map" not in old["queries"][0]
    (tmp_path / "old.json").write_text(json.dumps(old), encoding="utf-8")
    _, read = read_run(tmp_path / "old.json")
    assert same_numbers(read, doc) == []
    read["queries"][0]["map"] = 0.123  # a difference is still found, under today's key
    assert any(d.startswith("row 0 map:") for d in same_numbers(read, doc))
    with_old = compare_with_baseline(doc, tmp_path / "old.json")
    with_new = compare_with_baseline(doc, tmp_path / "new.json")
    assert with_old["paired_queries"] == with_new["paired_queries"] == report.summary["queries"]
    assert {k: v for k, v in with_old.items() if k != "baseline"} == \
        {k: v for k, v in with_new.items() if k != "baseline"}


def test_evaluate_prints_the_table(run, capsys):
    from museum_search.cli import _print_comparison, _print_summary

    index, _, report, _ = run
    doc = _reports.report_dict(report, index)
    _print_summary(doc["summary"])
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["metric", "value"])
    printed = [line.split()[0] for line in lines[start + 1: start + 1 + len(PRINTED_METRICS)]]
    assert printed == [m.label for m in PRINTED_METRICS.values()]
    tmp = {k: {"significant": {"0.05": False}, "exact": True, "run_mean": 0.5, "baseline_mean": 0.5, "delta": 0.0,
               "direction": "same", "p_value": 1.0, "differing_queries": 0, "test": "randomization",
               "bootstrap_p_value": 1.0, "alternative": "two-sided"} for k in COMPARED}
    _print_comparison({"baseline": "b.json", "paired_queries": 8, **tmp})
    lines = capsys.readouterr().out.splitlines()
    assert "for AMNRO lower is better" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == [m.label for m in COMPARED.values()]


def test_the_gui_views_use_the_table(qtbot, run):
    from museum_search.gui.evaluation_tab import headline
    from museum_search.gui.widgets import plots
    from museum_search.gui.widgets.comparison_table import P_COLUMN, VERDICT_COLUMN, ComparisonPage
    from museum_search.gui.widgets.query_page import query_text
    from museum_search.gui.widgets.query_table import QueryTableModel
    from museum_search.gui.widgets.sweep_page import SweepPage

    index, _, report, steps = run
    labels = [m.label for m in COMPARED.values()]
    assert plots.METRICS == tuple(COMPARED) and list(plots.METRIC_LABELS.values()) == labels
    assert plots.HISTOGRAMS == tuple(k for k, m in COMPARED.items() if not m.binary) == ("map", "amnro")
    assert plots.SWEEP_METRICS == ("map", "mp@1")
    ev = plots.EvaluationPlots()
    qtbot.addWidget(ev)
    assert list(ev.running_curves) == list(COMPARED) and list(ev.histograms) == list(plots.HISTOGRAMS)
    assert [label for label, _ in ev._metric_pens()] == labels
    assert ev.hist_plots["map"].titleLabel.text.endswith("Per-query AP")
    ev.start_live(len(steps))
    for step in steps:
        ev.add_step(step)
    ev.stop_live()
    assert ev.histogram_counts("map").sum() == report.summary["queries"]
    sweep = plots.SweepPlot()
    qtbot.addWidget(sweep)
    assert list(sweep.sweep_curves) == list(plots.SWEEP_METRICS)

    model = QueryTableModel()
    heads = [model.headerData(c, plots.Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert heads[2: 2 + len(COMPARED)] == [m.query_label for m in COMPARED.values()] == ["P@1", "AP", "MNRO"]
    assert "P@1 " in query_text(report.records[0]) and " · AP " in query_text(report.records[0])

    page = SweepPage()
    qtbot.addWidget(page)
    heads = [page.table.horizontalHeaderItem(c).text() for c in range(page.table.columnCount())]
    assert heads == ["Value", *(m.label for m in HEADLINE_METRICS.values())]
    compare = ComparisonPage()
    qtbot.addWidget(compare)
    # a header may wrap onto lines of its own (the Compare table fits 1600 px): the words are the table's
    heads = [" ".join(compare.table.horizontalHeaderItem(c).text().split()) for c in range(compare.table.columnCount())]
    assert heads[2:VERDICT_COLUMN] == ["MP@1 [95% CI]", "MAP [95% CI]", "AMNRO [95% CI]", "GAP [known]"]
    assert heads[P_COLUMN:] == [f"p {label}" for label in labels]
    assert headline(report.summary, ", ").split(", ")[0].startswith("MP@1 ")
    assert [part.split()[0] for part in headline(report.summary, ", ").split(", ")] == \
        [m.label for m in HEADLINE_METRICS.values()]
