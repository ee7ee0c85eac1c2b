"""Evaluation runner and reports on the sample collection: JSON, CSV, TREC (checked with trec_eval)."""

import csv
import json

import numpy as np
import pytest
from report_files import write_json

from museum_search.cli import _differ, _print_summary
from museum_search.core.answer._pipeline import QuerySettings
from museum_search.core.answer._rerank import RerankOptions
from museum_search.core.evaluation import _reports as reports
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import (
    EvalStep,
    evaluate,
    precision_recall_curve,
    run_evaluation,
)
from museum_search.core.evaluation._stats import (
    format_p,
    paired_bootstrap_test,
    paired_randomization_test,
)


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
    # between the records, plain progress records name the stage (describing, verifying)
    steps = [s for s in steps if isinstance(s, EvalStep)]
    assert [s.done for s in steps] == list(range(1, len(qs.queries) + 1))
    assert all(s.record is not None for s in steps)
    n_open = sum(1 for q in qs.queries if not q.relevant)
    assert report.summary["open_set_queries"] == n_open == 3
    assert report.summary["queries"] == len(qs.queries) - n_open
    # running means at the end equal the final summary
    assert steps[-1].running["mp@1"] == pytest.approx(report.summary["mp@1"])
    assert steps[-1].running["map"] == pytest.approx(report.summary["map"])
    assert steps[-1].running["amnro"] == pytest.approx(report.summary["amnro"])
    # every ranking covers the whole collection; the objects hold the places their scores give them
    # (within an object its verified photos may lead by matching points: the same labels, place by place)
    labels = sample_index.labels
    for r in report.records:
        assert sorted(r.ranking.tolist()) == list(range(len(sample_index)))
        by_score = r.ranking[np.argsort(-r.scores, kind="stable")]
        assert labels[r.ranking].tolist() == labels[by_score].tolist()
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
    doc = write_json(report, sample_index, tmp_path / "run.json", rankings=True)
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
    assert len(open_rows) == 3 and all(r["map"] == "" for r in open_rows)


def test_baseline_comparison_and_pr_curve(sample_run, sample_index, sample_collection, tmp_path, capsys):
    report, qs = sample_run
    base = write_json(report, sample_index, tmp_path / "base.json")
    # the same run against itself: no difference, not significant
    cmp_same = reports.compare_with_baseline(base, tmp_path / "base.json")
    assert cmp_same["paired_queries"] == report.summary["queries"]
    assert cmp_same["map"]["delta"] == 0 and not any(cmp_same["map"]["significant"].values())
    assert (cmp_same["map"]["test"], cmp_same["map"]["p_value"], cmp_same["map"]["differing_queries"]) == \
        ("randomization", 1.0, 0)
    assert (cmp_same["map"]["direction"], cmp_same["map"]["alternative"]) == ("same", "two-sided")
    icfrr = run_evaluation(sample_index, qs, QuerySettings(rerank="icfrr", options=RerankOptions()))
    doc = reports.report_dict(icfrr, sample_index)
    cmp = reports.compare_with_baseline(doc, tmp_path / "base.json")
    assert cmp["map"]["delta"] == pytest.approx(icfrr.summary["map"] - report.summary["map"], abs=1e-5)
    # summary.baseline.<metric>: the randomization test's p (the default), the bootstrap's next to it
    evaluated = [(a, b) for a, b in zip(doc["queries"], base["queries"]) if a["map"] is not None]
    assert [a["query"] for a, _ in evaluated] == [b["query"] for _, b in evaluated]
    for name, m in reports.COMPARED.items():
        key, higher = m.key, m.higher_is_better
        run_v = np.array([a[key] for a, _ in evaluated], float)
        base_v = np.array([b[key] for _, b in evaluated], float)
        c = cmp[name]
        assert c["test"] == "randomization"
        assert c["differing_queries"] == int(np.count_nonzero(run_v != base_v))
        assert c["p_value"] == pytest.approx(
            paired_randomization_test(run_v, base_v, higher_is_better=higher).p_value, abs=1e-6)
        assert c["bootstrap_p_value"] == pytest.approx(
            paired_bootstrap_test(run_v, base_v, higher_is_better=higher).p_value, abs=1e-6)
        assert c["significant"] == {str(a): c["p_value"] <= a for a in (0.05, 0.01, 0.001)}
        d = (run_v - base_v).mean() * (1 if higher else -1)
        assert c["direction"] == ("better" if d > 1e-12 else "worse" if d < -1e-12 else "same")
        assert c["alternative"] == "two-sided"
        assert (c["run_mean"], c["baseline_mean"]) == (pytest.approx(run_v.mean(), abs=1e-6),
                                                       pytest.approx(base_v.mean(), abs=1e-6))
    # the CLI says which test, the direction, the number of differing queries with each p-value
    _print_summary({**doc["summary"], "baseline": cmp})
    out = capsys.readouterr().out
    header = next(row for row in out.splitlines() if row.startswith("against baseline"))
    assert f"({cmp['paired_queries']} paired queries; two-sided paired randomization test" in header
    for name, label in (("mp@1", "MP@1"), ("map", "MAP"), ("amnro", "AMNRO")):
        c = cmp[name]
        line = next(row for row in out.splitlines() if row.strip().startswith(label + " ") and " vs " in row)
        how = "exact" if c["exact"] else "Monte Carlo"
        assert (f"{label} {c['run_mean']:.3f} vs {c['baseline_mean']:.3f}: {c['direction']}, "
                f"p = {format_p(c['p_value'])} ({_differ(c['differing_queries'])})") in line
        assert f"[randomization, {how};" in line
        assert f"bootstrap p = {format_p(c['bootstrap_p_value'])}" in line
    recall, precision = precision_recall_curve(report)
    assert recall[0] == 0 and recall[-1] == 1
    assert np.all(np.diff(precision) <= 1e-12)  # interpolated precision never increases
    assert precision[0] == pytest.approx(1.0) or precision[0] >= report.summary["mp@1"]


# ---------------------------------------------------------------------------------------------
# ground truth naming instances the index does not have


def _typo_queries(sample_collection, out):
    """Queries q01–q11 of the sample: 2 explicit open-set (q08, q11), 2 naming only instances the
    index does not have (typos), 1 naming a missing instance besides its real one."""
    src = sample_collection / "queries"
    with open(src / "ground_truth.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["query"] <= "q11.jpg"]
    typos = {"q02.jpg": "harbor_lights", "q05.jpg": "turbulent_nite"}
    out.mkdir()
    with open(out / "ground_truth.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["query", "instance"])
        for r in rows:
            (out / r["query"]).write_bytes((src / r["query"]).read_bytes())
            w.writerow([r["query"], typos.get(r["query"], r["instance"])])
        w.writerow(["q10.jpg", "valley_at_dawn"])  # q10 also names a second painting, not in the index
    return out


def test_unknown_instances_are_reported_apart_from_open_set(sample_index, sample_collection, tmp_path):
    qs = load_queryset(_typo_queries(sample_collection, tmp_path / "queries"))
    assert len(qs.queries) == 11 and qs.n_open_set == 2
    report = run_evaluation(sample_index, qs)
    s = report.summary
    assert s["open_set_queries"] == 2  # q08, q11: the ground truth says "not in the collection"
    assert s["unknown_instance_queries"] == 2  # q02, q05: typos, not open-set queries
    assert s["partly_unknown_queries"] == 1  # q10: evaluated on valley_at_dusk
    assert s["unknown_instances"] == ["harbor_lights", "turbulent_nite", "valley_at_dawn"]
    assert s["queries"] == 11 - 2 - 2
    by_name = {r.query.replace("\\", "/").rsplit("/", 1)[-1]: r for r in report.records}
    assert by_name["q02.jpg"].unknown == ["harbor_lights"] and by_name["q02.jpg"].unknown_only
    assert by_name["q08.jpg"].open_set and not by_name["q08.jpg"].unknown_only
    assert by_name["q10.jpg"].relevant == ["valley_at_dusk"] and by_name["q10.jpg"].unknown == ["valley_at_dawn"]
    assert not by_name["q10.jpg"].open_set
    # the means are over the evaluated queries only, as before
    evaluated = [r for r in report.records if not r.open_set]
    assert len(evaluated) == s["queries"]
    assert s["map"] == pytest.approx(np.mean([r.metrics["map"] for r in evaluated]))
    assert "open-set" in report.queryset_description and "2 open-set" in report.queryset_description

    doc = write_json(report, sample_index, tmp_path / "run.json")
    again = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    for key in ("open_set_queries", "unknown_instance_queries", "partly_unknown_queries", "unknown_instances"):
        assert again["summary"][key] == s[key] == doc["summary"][key]
    unknown = {q["query"].replace("\\", "/").rsplit("/", 1)[-1]: q["unknown"] for q in again["queries"] if q["unknown"]}
    assert unknown == {"q02.jpg": ["harbor_lights"], "q05.jpg": ["turbulent_nite"], "q10.jpg": ["valley_at_dawn"]}
    assert reports.unknown_instances_warning(again["summary"]) == (
        "3 queries name 3 instances not in this index: harbor_lights, turbulent_nite, valley_at_dawn "
        "— check the ground truth or the index (not averaged: 2 queries)")

    reports.write_csv(report, sample_index, tmp_path / "run.csv")
    with (tmp_path / "run.csv").open(encoding="utf-8", newline="") as f:
        rows = {r["query"].replace("\\", "/").rsplit("/", 1)[-1]: r for r in csv.DictReader(f)}
    assert sorted(n for n, r in rows.items() if r["open_set"] == "1") == ["q08.jpg", "q11.jpg"]
    assert rows["q02.jpg"]["unknown_instances"] == "harbor_lights" and rows["q02.jpg"]["map"] == ""
    assert rows["q10.jpg"]["unknown_instances"] == "valley_at_dawn" and rows["q10.jpg"]["map"] != ""


def test_sample_run_has_no_unknown_instances(sample_run):
    report, _ = sample_run
    assert report.summary["unknown_instances"] == []
    assert report.summary["unknown_instance_queries"] == report.summary["partly_unknown_queries"] == 0
    assert reports.unknown_instances_warning(report.summary) is None


def test_unknown_instances_warning_shows_the_first_names():
    summary = {"unknown_instances": [f"obj{i}" for i in range(8)], "unknown_instance_queries": 1,
               "partly_unknown_queries": 0}
    assert reports.unknown_instances_warning(summary) == (
        "1 query names 8 instances not in this index: obj0, obj1, obj2, obj3, obj4… (+3 more) "
        "— check the ground truth or the index (not averaged: 1 query)")
    assert reports.unknown_instances_warning({"open_set_queries": 3}) is None


# ---------------------------------------------------------------------------------------------
# the comparison of two runs (the Evaluation tab's and evaluate --baseline's p-values)


def test_paired_tests_agree_with_scipy_permutation_test():
    from scipy.stats import permutation_test

    rng = np.random.default_rng(3)
    queries = [f"q{i:02d}.jpg" for i in range(12)]
    base = {"mp@1": dict(zip(queries, rng.integers(0, 2, 12).astype(float))),
            "map": dict(zip(queries, rng.random(12).round(3))),
            "amnro": dict(zip(queries, rng.random(12).round(3)))}
    run = {key: {q: (v if i % 3 == 0 else min(1.0, v + rng.random() * 0.4)) for i, (q, v) in enumerate(vals.items())}
           for key, vals in base.items()}
    run["amnro"] = {q: max(0.0, v - 0.2) if i % 2 else v for i, (q, v) in enumerate(base["amnro"].items())}
    run["map"]["extra.jpg"] = 1.0  # a query the baseline did not evaluate is not paired
    tests = reports.paired_tests(run, base)
    assert set(tests) == set(reports.COMPARED)
    for name, m in reports.COMPARED.items():
        key, higher = m.key, m.higher_is_better
        a = np.array([run[key][q] for q in queries])
        b = np.array([base[key][q] for q in queries])
        res = tests[name]
        assert res.test == "randomization" and res.exact and res.n_queries == len(queries)
        assert res.differing_queries == int(np.count_nonzero(a != b))
        assert res.delta == pytest.approx(a.mean() - b.mean())
        # scipy: exact paired (sign-flip) permutation test of the mean difference, two-sided
        d = (a - b) if higher else (b - a)
        ref = permutation_test((d,), np.mean, permutation_type="samples", alternative="two-sided",
                               n_resamples=np.inf)
        assert res.p_value == pytest.approx(ref.pvalue, abs=1e-9)
        assert res.alternative == "two-sided"
        assert res.direction == ("better" if d.mean() > 0 else "worse" if d.mean() < 0 else "same")
        greater = permutation_test((d,), np.mean, permutation_type="samples", alternative="greater",
                                   n_resamples=np.inf)
        assert paired_randomization_test(a, b, higher_is_better=higher, alternative="greater").p_value == \
            pytest.approx(greater.pvalue, abs=1e-9)
        assert res.bootstrap_p_value == pytest.approx(
            paired_bootstrap_test(a, b, higher_is_better=higher).p_value, abs=1e-12)
    # fewer than 2 common queries: no test
    one = {key: {queries[0]: 1.0} for key in reports.COMPARED}
    assert reports.paired_tests(one, base) == {name: None for name in reports.COMPARED}


def test_values_by_query_are_the_evaluated_queries(sample_run):
    report, _qs = sample_run
    values = reports.values_by_query(report)
    evaluated = [r for r in report.records if not r.open_set]
    assert set(values) == set(reports.COMPARED)
    assert list(values["map"]) == [r.query for r in evaluated]
    assert values["mp@1"] == {r.query: float(r.metrics["mp@1"]) for r in evaluated}


def _drop_docs(tmp_path):
    """ICFRR on the paintings (issue 23): MP@1 0.967 -> 0.567 over 30 queries, 12 of them worse."""
    names = [f"{i:05d}.jpg" for i in range(30)]
    base_p1 = [1.0] * 29 + [0.0]
    run_p1 = [0.0] * 12 + [1.0] * 17 + [0.0]
    def doc(p1):
        return {"queries": [{"query": q, "mp@1": v, "map": v, "amnro": 1 - v} for q, v in zip(names, p1)]}
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(doc(base_p1)), encoding="utf-8")
    return doc(run_p1), base_path, np.array(run_p1), np.array(base_p1)


def test_a_clear_drop_is_worse_with_a_small_two_sided_p(tmp_path, capsys):
    from scipy.stats import permutation_test

    doc, base_path, run_v, base_v = _drop_docs(tmp_path)
    cmp = reports.compare_with_baseline(doc, base_path)
    c = cmp["mp@1"]
    d = run_v - base_v
    # (the equal queries change no sign assignment's mean: scipy enumerates only the 2^12 of the others)
    ref = permutation_test((d[d != 0],), np.sum, permutation_type="samples", alternative="two-sided",
                           n_resamples=np.inf)
    assert c["p_value"] == pytest.approx(ref.pvalue, abs=1e-6) == pytest.approx(2 / 2**12, abs=1e-6)
    assert (c["direction"], c["differing_queries"], c["exact"]) == ("worse", 12, True)
    assert c["significant"] == {"0.05": True, "0.01": True, "0.001": True}
    assert c["bootstrap_p_value"] < 0.001
    assert cmp["amnro"]["direction"] == "worse"  # lower is better: a rise is worse
    # the one-tailed "better than" test said nothing of it
    assert paired_randomization_test(run_v, base_v, alternative="greater").p_value == 1.0
    _print_summary({"index": "i", "query_set": "q", "rerank": "icfrr", "queries": 30, "open_set_queries": 0,
                    "skipped_queries": 0, "baseline": cmp})
    out = capsys.readouterr().out
    assert "MP@1 0.567 vs 0.967: worse, p = 0.0005 (12 queries differ)" in out


def test_run_name_carries_the_query_set_and_the_changed_settings():
    from datetime import datetime

    when = datetime(2026, 11, 26, 14, 37, 43)
    assert reports.run_name(QuerySettings(), "qsd2_w3", when) == "qsd2_w3 · default · 14:37:43"
    icfrr = QuerySettings(rerank="icfrr", options=RerankOptions(k_q=2, k_g=2))
    assert reports.run_name(icfrr, "qsd2_w3", when) == "qsd2_w3 · ICFRR K 2/2 · 14:37:43"
    # only what differs from QuerySettings()'s defaults; the re-rankers' options only when they differ
    assert reports.run_name(QuerySettings(rerank="icfrr"), "paintings") == "paintings · ICFRR"
    other = QuerySettings(rerank="icfrr,aqe", options=RerankOptions(beta=0.3, qe_n=3), verify=False,
                          regions=False, search="exact")
    assert reports.settings_difference(other) == "ICFRR β 0.3 + AQE n 3, not verified, exact search, whole image"
    assert reports.settings_difference(QuerySettings(verify_top=50)) == "verified top 50"
    assert reports.settings_difference(QuerySettings(options=RerankOptions(k_q=2))) == "default"
    assert reports.run_name(QuerySettings(), None, when) == "default · 14:37:43"
