"""GAP and the calibrated verdict's confidence as evaluation, the reports and the CLI give them.

On the sample collection's index and its labelled queries (3 of them show objects that are not in
the collection): the run's ``gap`` / ``gap_known`` equal :mod:`.metrics`' functions on the run's own
records and an independent re-implementation written here (a plain loop over the queries sorted by
confidence, and the (R/M)·AP identity with sklearn); ``evaluate --json`` gives each query's
``confidence`` and the summary's GAP, the CSV export has the verdict's columns, the text output
prints GAP next to MP@1, MAP and AMNRO. ``query`` prints the confidence with the verdict, ``info``
the verdict's operating point and, when it is weak, a warning.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
from report_files import write_json

from museum_search.cli import _print_summary, main
from museum_search.core.answer._verdict import Verdict
from museum_search.core.evaluation import _metrics as metrics
from museum_search.core.evaluation import _reports as reports
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import gap_figures, run_evaluation
from museum_search.core.index._store import Index


def gap_loop(confidence, correct, known, known_only=False) -> float:
    """GAP written from its definition (the Met dataset's, NeurIPS 2021): the queries (only the
    known ones when ``known_only``) sorted by confidence, highest first, ties by query order;
    (1/M) Σ rel(i)·P(i), M the number of known queries, rel(i) = 1 for a known query answered right."""
    rows = [(c, bool(r) and bool(k)) for c, r, k in zip(confidence, correct, known) if k or not known_only]
    m = sum(1 for k in known if k)
    if m == 0:
        return math.nan
    order = sorted(range(len(rows)), key=lambda i: -rows[i][0])  # sorted() is stable: ties by query order
    hits, total = 0, 0.0
    for position, i in enumerate(order, start=1):
        if rows[i][1]:
            hits += 1
            total += hits / position
    return total / m


@pytest.fixture(scope="module")
def sample_run(sample_index, sample_collection):
    qs = load_queryset(sample_collection / "queries")
    return run_evaluation(sample_index, qs), qs


def test_gap_of_a_run_equals_the_metric_and_an_independent_implementation(sample_run):
    report, qs = sample_run
    records = report.records
    assert len(records) == len(qs.queries) and report.summary["open_set_queries"] == 3
    conf = [r.confidence for r in records]
    assert all(c is not None and 0.0 <= c <= 1.0 for c in conf)
    correct = [bool(r.relevance[0]) for r in records]
    known = [not r.open_set for r in records]
    assert sum(known) == len(records) - 3

    # the record keeps the answer's confidence, and its evidence carries it
    assert [r.evidence.confidence for r in records] == conf

    # the run's own records, through metrics
    s = report.summary
    assert s["gap"] == metrics.global_average_precision(conf, correct, known)
    assert s["gap_known"] == metrics.gap_known(conf, correct, known)
    assert gap_figures(report.evidence) == {"gap": s["gap"], "gap_known": s["gap_known"]}
    # an independent implementation
    assert s["gap"] == pytest.approx(gap_loop(conf, correct, known), abs=1e-12)
    assert s["gap_known"] == pytest.approx(gap_loop(conf, correct, known, known_only=True), abs=1e-12)
    assert 0.0 < s["gap"] <= s["gap_known"] <= 1.0
    # sklearn: GAP = (R/M) · AP of the order, with the right answers as positives (without ties)
    if len(set(conf)) == len(conf):
        from sklearn.metrics import average_precision_score

        rel = np.array(correct) & np.array(known)
        r_, m_ = int(rel.sum()), int(sum(known))
        assert s["gap"] == pytest.approx(r_ / m_ * average_precision_score(rel, conf), abs=1e-9)


def test_gap_figures_conventions():
    from museum_search.core.answer._verdict import Evidence

    def ev(conf, known, correct):
        return Evidence(0.9, None, known, correct, confidence=conf)

    # a confident unknown query before a right known one halves its precision
    figures = gap_figures([ev(0.9, False, False), ev(0.8, True, True), ev(0.7, True, False)])
    assert figures["gap"] == pytest.approx((1 / 2) / 2)
    assert figures["gap_known"] == pytest.approx(1 / 2)
    # no answer (an empty collection): not right, placed last; no known query: NaN
    assert gap_figures([ev(None, True, True), ev(0.5, True, True)])["gap"] == pytest.approx(1 / 2)
    assert all(math.isnan(v) for v in gap_figures([ev(0.5, False, False)]).values())
    assert all(math.isnan(v) for v in gap_figures([]).values())


def test_json_csv_and_text_give_confidence_and_gap(sample_run, sample_index, tmp_path, capsys):
    report, qs = sample_run
    doc = write_json(report, sample_index, tmp_path / "run.json")
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["summary"]["gap"] == pytest.approx(report.summary["gap"], abs=1e-6)
    assert doc["summary"]["gap_known"] == pytest.approx(report.summary["gap_known"], abs=1e-6)
    assert [q["confidence"] for q in doc["queries"]] == pytest.approx([r.confidence for r in report.records],
                                                                       abs=1e-6)
    # the GAP of the JSON's own queries (known: a relevant instance; right: the top-1 is one of them)
    conf = [q["confidence"] for q in doc["queries"]]
    known = [bool(q["relevant"]) for q in doc["queries"]]
    right = [bool(q["relevant"]) and q["top"][0] in q["relevant"] for q in doc["queries"]]
    assert gap_loop(conf, right, known) == pytest.approx(doc["summary"]["gap"], abs=1e-6)

    reports.write_csv(report, sample_index, tmp_path / "run.csv")
    with (tmp_path / "run.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert set(reports.CSV_VERDICT_COLUMNS) <= set(rows[0])
    for row, rec in zip(rows, report.records):
        assert row["in_collection"] == str(int(rec.in_collection)) and row["reason"] == rec.reason
        assert row["inliers"] == ("" if rec.top_inliers is None else str(rec.top_inliers))
        assert float(row["confidence"]) == pytest.approx(rec.confidence, abs=1e-6)

    _print_summary({**doc["summary"]})
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines if line.startswith("  ") and line.split()]
    assert names[names.index("MP@1"):names.index("GAP") + 1] == ["MP@1", "MAP", "AMNRO", "GAP"]
    gap_line = next(line for line in lines if line.split()[:1] == ["GAP"])
    assert f"{100 * doc['summary']['gap']:.2f}" in gap_line
    assert f"{100 * doc['summary']['gap_known']:.2f}" in gap_line


def test_cli_evaluate_json_and_query_text(sample_index, sample_collection, tmp_path, capsys):
    queries = sample_collection / "queries"
    out = tmp_path / "run.json"
    assert main(["evaluate", str(sample_index.path), str(queries), "--json", str(out),
                 "--csv", str(tmp_path / "run.csv")]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert "gap" in doc["summary"] and "gap_known" in doc["summary"]
    assert all(isinstance(q["confidence"], float) for q in doc["queries"])
    gap_line = next(line.split() for line in text.splitlines() if line.split()[:1] == ["GAP"])
    assert gap_line[1] == f"{100 * doc['summary']['gap']:.2f}"
    with (tmp_path / "run.csv").open(encoding="utf-8") as f:
        assert "confidence" in next(csv.reader(f))

    # query: the confidence with the verdict, as the answer gives it
    photo = queries / doc["queries"][0]["query"].rsplit("/", 1)[-1]
    assert main(["query", str(sample_index.path), str(photo)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    q = doc["queries"][0]
    verdict = "in the collection" if q["in_collection"] else "NOT in this collection"
    assert f"→ {verdict} (confidence {q['confidence']:.2f}; {q['reason']})" in line
    assert main(["query", "--json", str(sample_index.path), str(photo)]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["confidence"] == pytest.approx(q["confidence"], abs=1e-4)


@pytest.fixture
def index_copy(sample_index, tmp_path):
    shutil.copytree(sample_index.path, tmp_path / "index")
    return Index.load(tmp_path / "index")


WEAK = {"known_accepted": 0.32, "unknown_rejected": 0.96, "known": 50, "unknown": 50, "source": "synthetic views"}
STRONG = {"known_accepted": 0.97, "unknown_rejected": 0.95, "known": 50, "unknown": 50, "source": "real views"}


def test_info_prints_the_operating_point_and_warns_when_it_is_weak(index_copy, capsys):
    verdict = Verdict.of_index(index_copy)
    for point in (STRONG, WEAK):
        index_copy.store_verdict(replace(verdict, operating_point={**(verdict.operating_point or {}), **point}))
        stored = Verdict.of_index(Index.load(index_copy.path))
        assert main(["info", str(index_copy.path)]) == 0
        out = capsys.readouterr().out
        assert f"verdict: {stored.summary()}" in out
        assert f"{point['known_accepted']:.0%}" in out  # the operating point itself
        warning = stored.warning()
        if point is WEAK:
            assert warning is not None and f"warning: {warning}" in out
        else:
            assert warning is None and "warning:" not in out
