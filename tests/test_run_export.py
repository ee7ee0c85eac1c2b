"""An exported run carries what runs it again (issue 23): the index id, the query set, every setting
and the verdict of each query; ``evaluate --settings RUN.json`` gives the same numbers, and refuses
another index, another query set or settings given beside it, saying what to do."""

from __future__ import annotations

import csv
import json
import logging
import shutil

import numpy as np
import pytest

from museum_search.cli import main
from museum_search.core.answer import _rerank as rerank
from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, descriptor_query
from museum_search.core.answer._rerank import RerankOptions
from museum_search.core.answer._verdict import Verdict
from museum_search.core.evaluation import _export as export


@pytest.fixture(scope="module")
def exported(tmp_path_factory, sample_index, sample_collection):
    """A verified ICFRR run of the sample's queries with its parameters and a verdict rule set by
    hand, exported by ``evaluate --json --csv``."""
    out = tmp_path_factory.mktemp("run")
    args = ["evaluate", str(sample_index.path), str(sample_collection / "queries"), "--rerank", "icfrr", "--kq", "2",
            "--kg", "3", "--beta", "0.4", "--iterations", "3", "--verify-top", "10", "--min-inliers", "11",
            "--json", str(out / "run.json"), "--csv", str(out / "run.csv")]
    assert main(args) == 0
    return out


def test_the_export_carries_everything_needed(exported, sample_index, sample_collection):
    doc = json.loads((exported / "run.json").read_text(encoding="utf-8"))
    run = doc["run"]
    assert run["format"] == export.FORMAT and run["index"]["id"] == export.index_id(sample_index) is not None
    assert run["index"]["path"] == str(sample_index.path.resolve()) and run["index"]["references"] == len(sample_index)
    qs = run["query_set"]
    assert (qs["path"], qs["layout"], qs["queries"]) == (str(sample_collection / "queries"), "csv", 21)
    settings = export.settings_from_dict(run["settings"])
    assert settings.rerank == ("icfrr",) and settings.verify and settings.verify_top == 10
    assert settings.options == RerankOptions(k_q=2, k_g=3, beta=0.4, iterations=3)
    assert settings.verdict.min_inliers == 11 and settings.verdict.model_verified is None  # the rule set by hand
    assert run["resolved"] == {"search": "exact", "k_q": 2, "k_g": 3}
    assert doc["summary"]["rerank"] == "icfrr, verified (top 10) (K 2/3, β 0.40, 3 it)"
    for q in doc["queries"]:  # the verdict of each query
        assert isinstance(q["in_collection"], bool) and q["reason"] and 0 <= q["confidence"] <= 1
        assert q["inliers"] is None or isinstance(q["inliers"], int)
    with open(exported / "run.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 21
    assert all(r["k_q"] == "2" and r["k_g"] == "3" and r["beta"] == "0.400000" and r["iterations"] == "3"
               and r["verify_top"] == "10" and r["index_id"] == run["index"]["id"]
               and r["ann_id"] == run["index"]["ann_id"] == export.NO_ANN
               and r["verdict"] == "at least 11 matching points" for r in rows)
    by_query = {q["query"]: q for q in doc["queries"]}
    for r in rows:
        q = by_query[r["query"]]
        assert r["in_collection"] == str(int(q["in_collection"])) and r["reason"] == q["reason"]
        assert r["inliers"] == ("" if q["inliers"] is None else str(q["inliers"]))
        assert float(r["confidence"]) == pytest.approx(q["confidence"], abs=1e-6)
        # the rank score is not a cosine: ICFRR's score plus the verification bonus; the cosine is apart
        assert float(r["top1_cosine"]) == pytest.approx(q["cosine"], abs=1e-6) and float(r["top1_cosine"]) <= 1
    assert max(float(r["top1_rank_score"]) for r in rows) > 1.0
    assert "top1_rank_score" in doc["summary"]["notes"]["score"]


def test_settings_runs_it_again_with_the_same_numbers(exported, tmp_path, capsys):
    assert main(["evaluate", "--settings", str(exported / "run.json"), "--json", str(tmp_path / "again.json")]) == 0
    said = capsys.readouterr()
    assert "same numbers as" in said.out
    # the run asked for "auto", which chose the exact search: it runs again with that, and says so
    assert 'search "auto" chose the exact search then; it runs again with --search exact' in said.err
    old = json.loads((exported / "run.json").read_text(encoding="utf-8"))
    new = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert export.same_numbers(old, new) == []
    for key in ("mp@1", "map", "amnro", "gap", "p@5"):
        assert new["summary"][key] == old["summary"][key]
    assert [q["map"] for q in new["queries"]] == [q["map"] for q in old["queries"]]
    # the run's settings again, verdict included (the index's own verdict is not the run's rule),
    # and its search as it resolved
    assert old["run"]["settings"]["search"] == "auto" and old["run"]["resolved"]["search"] == "exact"
    assert new["run"]["settings"] == {**old["run"]["settings"], "search": "exact"}
    assert new["run"]["index"]["ann_id"] == old["run"]["index"]["ann_id"] == export.NO_ANN
    assert new["run"]["index"]["id"] == old["run"]["index"]["id"]
    # and a different run would not pass for the same: same_numbers sees it
    changed = json.loads(json.dumps(new))
    changed["queries"][0]["map"] = 0.123
    assert export.same_numbers(old, changed) and "map" in export.same_numbers(old, changed)[0]


def test_the_run_records_its_engine_and_runs_again_on_it(sample_index, sample_collection, tmp_path, monkeypatch,
                                                         capsys):
    """Issue 32: the engine is a setting of the run (``--engine``, else the default), recorded from the
    pipeline that ran, not read from the process; ``--settings`` runs it again on the same engine (the
    same numbers), and ``--engine`` beside it chooses another (the numbers then differ in the last digits,
    which the re-run says). The settings section of the file is as before (no engine)."""
    monkeypatch.delenv("MUSEUM_SEARCH_ENGINE", raising=False)
    base = ["evaluate", str(sample_index.path), str(sample_collection / "queries"), "--no-verify"]

    def run(*args: str) -> dict:
        out = tmp_path / f"run{len(list(tmp_path.glob('*.json')))}.json"
        assert main([*args, "--json", str(out)]) == 0
        return json.loads(out.read_text(encoding="utf-8"))["run"]

    torch_run = run(*base, "--engine", "torch")
    assert torch_run["engine"] == "torch" and "engine" not in torch_run["settings"]
    assert run(*base)["engine"] == "onnx"  # the default here: the torch run above chose nothing for the process
    first = str(tmp_path / "run0.json")
    assert run("evaluate", "--settings", first)["engine"] == "torch"
    capsys.readouterr()
    assert main(["evaluate", "--settings", first, "--engine", "onnx", "--json", str(tmp_path / "onnx.json")]) == 1
    assert "the numbers differ from" in capsys.readouterr().err


def _fails(args, capsys) -> str:
    assert main(args) == 1
    return capsys.readouterr().err


def test_settings_refuses_what_is_not_the_run(exported, tmp_path, sample_collection, capsys):
    run = exported / "run.json"
    out = tmp_path / "out.json"
    # another index (its content differs from the run's): what to do
    doc = json.loads(run.read_text(encoding="utf-8"))
    doc["run"]["index"]["id"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc), encoding="utf-8")
    err = _fails(["evaluate", "--settings", str(other), "--json", str(out)], capsys)
    assert "is not the one the run was evaluated on" in err and "Give the run's index folder" in err
    # the index moved away
    doc = json.loads(run.read_text(encoding="utf-8"))
    doc["run"]["index"]["path"] = str(tmp_path / "gone")
    other.write_text(json.dumps(doc), encoding="utf-8")
    assert "give its folder" in _fails(["evaluate", "--settings", str(other), "--json", str(out)], capsys)
    # another query set (fewer queries) given in place of the run's
    part = tmp_path / "part"
    part.mkdir()
    lines = (sample_collection / "queries" / "ground_truth.csv").read_text(encoding="utf-8").splitlines()
    for line in lines[1:6]:
        shutil.copy(sample_collection / "queries" / line.split(",")[0], part)
    (part / "ground_truth.csv").write_text("\n".join(lines[:6]) + "\n", encoding="utf-8")
    index = json.loads(run.read_text(encoding="utf-8"))["run"]["index"]["path"]
    err = _fails(["evaluate", "--settings", str(run), index, str(part), "--json", str(out)], capsys)
    assert "changed since the run" in err and "21 queries then, 5 now" in err
    # settings beside --settings; a JSON that is no run; the run itself as the output
    assert "leave out --rerank, --beta" in _fails(["evaluate", "--settings", str(run), "--rerank", "aqe", "--beta", "1"],
                                                  capsys)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"summary": {}}), encoding="utf-8")
    assert "no \"run\" section" in _fails(["evaluate", "--settings", str(plain)], capsys)
    assert "would overwrite" in _fails(["evaluate", "--settings", str(run), "--json", str(run)], capsys)
    assert not out.exists()  # nothing was written


def test_verdict_left_to_the_index_when_it_is_the_same(sample_index, exported):
    spec, _ = export.read_run(exported / "run.json")
    assert spec.settings_for(sample_index).verdict is not None  # the run's rule (--min-inliers 11) is kept
    own = export.RunSpec.from_dict({**spec.to_dict(), "settings": export.settings_dict(
        spec.settings, Verdict.of_index(sample_index))})
    assert own.settings_for(sample_index).verdict is None  # the index's own: named as the run was


def test_icfrr_advice_is_logged_once_per_process(single_photo_index, monkeypatch, caplog):
    """stderr said the ICFRR advice at every run or retry (issue 23); now once per process."""
    monkeypatch.setattr(rerank, "_ADVISED", set())
    settings = QuerySettings(rerank="icfrr", verify=False)
    query = descriptor_query(np.asarray(single_photo_index.descriptors[0], np.float32), "row 0")
    with caplog.at_level(logging.WARNING, logger="museum_search.core.answer._rerank"):
        for _ in range(3):  # three runs, each with its own pipeline
            QueryPipeline.for_descriptors(single_photo_index, settings).answer([query])
    said = [r for r in caplog.records if "ICFRR cannot help" in r.getMessage()]
    assert len(said) == 1


def test_a_run_of_descriptor_queries_runs_again(sample_index, tmp_path, capsys):
    """Queries given as descriptors: the run names the array and its ground truth, and runs again."""
    rows = np.asarray(sample_index.descriptors[::3], np.float32)
    np.save(tmp_path / "q.npy", rows)
    labels = sample_index.labels[::3]
    (tmp_path / "gt.csv").write_text("query,instance\n" + "".join(f"row {i},{lab}\n" for i, lab in enumerate(labels)),
                                     encoding="utf-8")
    args = ["evaluate", str(sample_index.path), "--descriptors", str(tmp_path / "q.npy"), "--ground-truth",
            str(tmp_path / "gt.csv"), "--rerank", "aqe", "--qe-n", "3", "--no-verify", "--json", str(tmp_path / "d.json")]
    assert main(args) == 0
    doc = json.loads((tmp_path / "d.json").read_text(encoding="utf-8"))
    qs = doc["run"]["query_set"]
    assert qs["descriptors"] == str(tmp_path / "q.npy") and qs["path"] == str(tmp_path / "gt.csv")
    assert qs["queries"] == len(labels) and doc["run"]["settings"]["options"]["qe_n"] == 3
    capsys.readouterr()
    assert main(["evaluate", "--settings", str(tmp_path / "d.json"), "--json", str(tmp_path / "again.json")]) == 0
    assert "same numbers as" in capsys.readouterr().out
    again = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert export.same_numbers(doc, again) == [] and again["summary"]["map"] == doc["summary"]["map"]


def _objects(n_objects: int, dim: int, seed: int) -> np.ndarray:
    """``n_objects`` objects of 6 views each, the views of one object near each other."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((n_objects, 1, dim))
    return (c + 0.5 * rng.standard_normal((n_objects, 6, dim))).reshape(-1, dim).astype(np.float32)


@pytest.fixture()
def approximate_run(tmp_path, monkeypatch):
    """An imported index of 900 references with an approximate index, and a run of 40 descriptor
    queries exported where ``auto`` chose the approximate search (as on a machine where it was
    measured faster: resolve_mode is made to say so)."""
    import csv as csv_module

    from museum_search.core.answer import _pipeline as query_module
    from museum_search.core.index._modes import resolve_mode
    from museum_search.core.jobs._importing import import_index
    from museum_search.core.progress import drive

    x = _objects(150, 48, seed=1)
    np.save(tmp_path / "d.npy", x)
    with open(tmp_path / "d.csv", "w", newline="", encoding="utf-8") as f:
        w = csv_module.writer(f)
        w.writerow(["path", "instance"])
        w.writerows([f"obj{i // 6}/v{i % 6}.jpg", f"obj{i // 6}"] for i in range(len(x)))
    index_dir = tmp_path / "index"
    drive(import_index(tmp_path / "d.npy", tmp_path / "d.csv", index_dir, root=tmp_path, ann="yes", neighbours=8))
    rng = np.random.default_rng(2)
    picked = rng.choice(len(x), 40, replace=False)
    np.save(tmp_path / "q.npy", x[picked] + 0.3 * rng.standard_normal((40, 48)).astype(np.float32))
    (tmp_path / "gt.csv").write_text("query,instance\n" + "".join(f"row {i},obj{r // 6}\n" for i, r in enumerate(picked)),
                                     encoding="utf-8")

    def auto_says(choice):
        monkeypatch.setattr(query_module, "resolve_mode",
                            lambda mode, n, has_ann: choice if mode == "auto" else resolve_mode(mode, n, has_ann))

    auto_says("ann")
    base = ["evaluate", str(index_dir), "--descriptors", str(tmp_path / "q.npy"), "--ground-truth",
            str(tmp_path / "gt.csv"), "--no-verify"]
    assert main([*base, "--json", str(tmp_path / "run.json"), "--csv", str(tmp_path / "run.csv")]) == 0
    assert main([*base, "--search", "exact", "--json", str(tmp_path / "exact.json")]) == 0
    return index_dir, tmp_path, auto_says


def _rebuild_ann(index_dir, **changes):
    """Build the index's approximate index again with ``changes`` to its parameters, untuned."""
    from dataclasses import replace as replaced

    from museum_search.core.index._approximate import AnnIndex
    from museum_search.core.index._store import Index
    from museum_search.core.progress import drive

    index = Index.load(index_dir)
    index.ann = drive(AnnIndex.build(np.asarray(index.descriptors), replaced(index.ann.params, tuning=None, **changes),
                                     tune=False))
    index.save()
    return Index.load(index_dir)


def test_a_run_runs_again_with_the_search_auto_chose(approximate_run, capsys):
    """``auto`` is not resolved again on a re-run (here it would choose the exact search): the run
    runs with the approximate search it chose, says so, and gives the same numbers."""
    index_dir, tmp, auto_says = approximate_run
    doc = json.loads((tmp / "run.json").read_text(encoding="utf-8"))
    run = doc["run"]
    assert run["settings"]["search"] == "auto" and run["resolved"]["search"] == "ann"
    assert run["index"]["ann_id"] not in (None, export.NO_ANN) and run["index"]["ann"]["nprobe"] >= 1
    with open(tmp / "run.csv", newline="", encoding="utf-8") as f:  # the CSV names the approximate index too
        assert {r["ann_id"] for r in csv.DictReader(f)} == {run["index"]["ann_id"]}
    capsys.readouterr()
    auto_says("exact")  # another machine, or another measurement: auto would choose otherwise now
    assert main(["evaluate", "--settings", str(tmp / "run.json"), "--json", str(tmp / "again.json")]) == 0
    said = capsys.readouterr()
    assert 'search "auto" chose the approximate search then; it runs again with --search ann' in said.err
    assert "same numbers as" in said.out
    again = json.loads((tmp / "again.json").read_text(encoding="utf-8"))
    assert again["run"]["resolved"]["search"] == "ann" and again["run"]["settings"]["search"] == "ann"
    assert again["run"]["index"]["ann_id"] == run["index"]["ann_id"]
    assert export.same_numbers(doc, again) == []
    # a run exported before the approximate index was recorded runs again, with a note that says so
    old = json.loads(json.dumps(doc))
    del old["run"]["index"]["ann_id"], old["run"]["index"]["ann"]
    (tmp / "old.json").write_text(json.dumps(old), encoding="utf-8")
    assert main(["evaluate", "--settings", str(tmp / "old.json"), "--json", str(tmp / "old_again.json")]) == 0
    said = capsys.readouterr()
    assert "exported before museum-search recorded the approximate index; it is not checked" in said.err
    assert "same numbers as" in said.out


def test_a_rebuilt_approximate_index_is_not_the_run_s(approximate_run, capsys):
    """Same descriptors and items (same index id), another approximate index: a run that used it is
    refused, saying what differs, and nothing is written; a run of the exact search still runs."""
    index_dir, tmp, _ = approximate_run
    before = json.loads((tmp / "run.json").read_text(encoding="utf-8"))["run"]["index"]
    index = _rebuild_ann(index_dir, nprobe=1, shortlist=20)
    assert export.index_id(index) == before["id"]  # what the id alone could not see
    assert export.ann_id(index) != before["ann_id"]
    capsys.readouterr()
    assert main(["evaluate", "--settings", str(tmp / "run.json"), "--json", str(tmp / "out.json"),
                 "--csv", str(tmp / "out.csv")]) == 1
    err = capsys.readouterr().err
    assert "its approximate index differs" in err and "nprobe 1, shortlist 20" in err and "Give the run's index" in err
    assert f"nprobe {before['ann']['nprobe']}, shortlist {before['ann']['shortlist']}" in err
    assert not (tmp / "out.json").exists() and not (tmp / "out.csv").exists()
    # the exact search's run does not depend on the approximate index
    exact = json.loads((tmp / "exact.json").read_text(encoding="utf-8"))
    assert exact["run"]["resolved"]["search"] == "exact"
    assert main(["evaluate", "--settings", str(tmp / "exact.json"), "--json", str(tmp / "exact_again.json")]) == 0
    assert "same numbers as" in capsys.readouterr().out
