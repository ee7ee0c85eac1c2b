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
from museum_search.core import rerank
from museum_search.core.evaluation import export
from museum_search.core.query import QueryPipeline, QuerySettings, descriptor_query
from museum_search.core.rerank import RerankOptions
from museum_search.core.verdict import Verdict


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
    assert "same numbers as" in capsys.readouterr().out
    old = json.loads((exported / "run.json").read_text(encoding="utf-8"))
    new = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert export.same_numbers(old, new) == []
    for key in ("mp@1", "map", "amnro", "gap", "p@5"):
        assert new["summary"][key] == old["summary"][key]
    assert [q["ap"] for q in new["queries"]] == [q["ap"] for q in old["queries"]]
    # the run's settings again, verdict included; the index's own verdict is not the run's rule
    assert new["run"]["settings"] == old["run"]["settings"]
    assert new["run"]["index"]["id"] == old["run"]["index"]["id"]
    # and a different run would not pass for the same: same_numbers sees it
    changed = json.loads(json.dumps(new))
    changed["queries"][0]["ap"] = 0.123
    assert export.same_numbers(old, changed) and "ap" in export.same_numbers(old, changed)[0]


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
    assert "is not the one of the run" in err and "21 queries then, 5 now" in err
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
    with caplog.at_level(logging.WARNING, logger="museum_search.core.rerank"):
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
