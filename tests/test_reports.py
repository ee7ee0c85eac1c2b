"""Evaluation runner and reports on the sample collection: JSON, CSV, TREC (checked with trec_eval)."""

import csv
import json

import numpy as np
import pytest

from museum_search.core.evaluation import reports
from museum_search.core.evaluation.querysets import load_queryset
from museum_search.core.evaluation.runner import evaluate, precision_recall_curve, run_evaluation
from museum_search.core.rerank import RerankOptions, build_pipeline


@pytest.fixture(scope="module")
def sample_run(sample_index, sample_collection):
    qs = load_queryset(sample_collection / "queries")
    return run_evaluation(sample_index, qs), qs


def test_runner_streams_one_record_per_query(sample_index, sample_collection):
    qs = load_queryset(sample_collection / "queries")
    gen = evaluate(sample_index, qs, batch_size=4)
    steps = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            report = stop.value
            break
    assert [s.done for s in steps] == list(range(1, len(qs.queries) + 1))
    assert all(s.record is not None for s in steps)
    n_open = sum(1 for q in qs.queries if not q.relevant)
    assert report.summary["open_set_queries"] == n_open == 3
    assert report.summary["queries"] == len(qs.queries) - n_open
    # running means at the end equal the final summary
    assert steps[-1].running["mp@1"] == pytest.approx(report.summary["mp@1"])
    assert steps[-1].running["map"] == pytest.approx(report.summary["map"])
    assert steps[-1].running["amnro"] == pytest.approx(report.summary["amnro"])
    # every ranking covers the whole collection, ties by row
    for r in report.records:
        assert sorted(r.ranking.tolist()) == list(range(len(sample_index)))
        assert np.all(np.diff(r.scores) <= 0)
    assert report.summary["mp@1"] >= 0.8  # the sample's queries are easy for the default backbone


def test_trec_files_agree_with_trec_eval(sample_run, sample_index, tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    report, _ = sample_run
    run_path, qrels_path = reports.write_trec(report, sample_index, tmp_path / "sample")
    run, qrels = {}, {}
    for line in run_path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    for line in qrels_path.read_text().splitlines():
        qid, _, doc, rel = line.split()
        qrels.setdefault(qid, {})[doc] = int(rel)
    res = pytrec_eval.RelevanceEvaluator(qrels, {"map", "P_1", "P_5"}).evaluate(run)
    assert len(res) == report.summary["queries"]  # open-set queries have no qrels
    assert np.mean([v["map"] for v in res.values()]) == pytest.approx(report.summary["map"], abs=1e-6)
    assert np.mean([v["P_1"] for v in res.values()]) == pytest.approx(report.summary["mp@1"], abs=1e-6)
    assert np.mean([v["P_5"] for v in res.values()]) == pytest.approx(report.summary["p@5"], abs=1e-6)


def test_json_and_csv(sample_run, sample_index, tmp_path):
    report, qs = sample_run
    doc = reports.write_json(report, sample_index, tmp_path / "run.json", rankings=True)
    again = json.loads((tmp_path / "run.json").read_text())
    assert again["summary"]["mp@1"] == pytest.approx(report.summary["mp@1"], abs=1e-6)
    assert again["summary"]["queries"] + again["summary"]["open_set_queries"] == len(qs.queries)
    lo, hi = again["summary"]["ci95"]["map"]
    assert lo <= report.summary["map"] <= hi
    assert len(again["queries"][0]["ranking"]) == len(sample_index)
    assert doc["queries"][0]["query"] == report.records[0].query
    reports.write_csv(report, sample_index, tmp_path / "run.csv")
    with (tmp_path / "run.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(report.records)
    open_rows = [r for r in rows if r["open_set"] == "1"]
    assert len(open_rows) == 3 and all(r["ap"] == "" for r in open_rows)


def test_baseline_comparison_and_pr_curve(sample_run, sample_index, sample_collection, tmp_path):
    report, qs = sample_run
    base = reports.write_json(report, sample_index, tmp_path / "base.json")
    # the same run against itself: no difference, not significant
    cmp_same = reports.compare_with_baseline(base, tmp_path / "base.json")
    assert cmp_same["paired_queries"] == report.summary["queries"]
    assert cmp_same["map"]["delta"] == 0 and not any(cmp_same["map"]["significant"].values())
    icfrr = run_evaluation(sample_index, qs, build_pipeline("icfrr", RerankOptions()))
    doc = reports.report_dict(icfrr, sample_index)
    cmp = reports.compare_with_baseline(doc, tmp_path / "base.json")
    assert cmp["map"]["delta"] == pytest.approx(icfrr.summary["map"] - report.summary["map"], abs=1e-5)
    recall, precision = precision_recall_curve(report)
    assert recall[0] == 0 and recall[-1] == 1
    assert np.all(np.diff(precision) <= 1e-12)  # interpolated precision never increases
    assert precision[0] == pytest.approx(1.0) or precision[0] >= report.summary["mp@1"]
