"""The `museum-search` command line: index, update, query, info, exit codes."""

import json
import subprocess
import sys

import pytest

from museum_search.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "museum_search", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory, sample_collection):
    out = tmp_path_factory.mktemp("cli") / "index"
    r = run_cli("index", sample_collection / "collection", "-o", out, "--size", "160",
                "--catalogue", sample_collection / "catalogue.csv")
    assert r.returncode == 0, r.stderr
    assert "42 references of 12 instances" in r.stdout
    return out


def test_query_json(cli_index, sample_collection):
    queries = sample_collection / "queries"
    truth = dict(line.split(",", 1) for line in (queries / "ground_truth.csv").read_text().splitlines()[1:])
    known = [q for q, inst in truth.items() if inst.strip()][:3]
    r = run_cli("query", cli_index, *[queries / q for q in known], "-k", "3", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["query"] for d in doc] == [str(queries / q) for q in known]
    for d in doc:
        assert set(d) == {"query", "in_collection", "confidence", "reason", "inliers", "rival_inliers", "results",
                          "objects"}
        # every object found in the photo: the top answer first when it is accepted
        assert [o["instance"] for o in d["objects"][:1]] == ([d["results"][0]["instance"]] if d["in_collection"] else [])
        assert isinstance(d["confidence"], float) and 0.0 <= d["confidence"] <= 1.0
        assert isinstance(d["in_collection"], bool) and d["reason"] and isinstance(d["rival_inliers"], int)
        assert len(d["results"]) == 3
        assert [x["rank"] for x in d["results"]] == [1, 2, 3]
        assert set(d["results"][0]) == {"rank", "score", "cosine", "inliers", "path", "instance", "metadata"}
        assert all(isinstance(x["inliers"], int) for x in d["results"])  # verified by default
        # within an object, its verified photo with the most matching points first (issue 23,
        # item 9); the order of the objects is the core pipeline's (checked below)
        for inst in {x["instance"] for x in d["results"]}:
            inliers = [x["inliers"] for x in d["results"] if x["instance"] == inst]
            assert inliers == sorted(inliers, reverse=True)
    hits = sum(d["results"][0]["instance"] == truth[d["query"].split("/")[-1]].strip() for d in doc)
    assert hits >= 2
    # the CLI gives exactly what the core pipeline computes
    from museum_search.core.answer._pipeline import QueryPipeline, load_query
    from museum_search.core.index._store import Index

    answer = QueryPipeline(Index.load(cli_index)).answer([load_query(queries / known[0])])[0]
    assert doc[0]["in_collection"] == answer.in_collection and doc[0]["reason"] == answer.reason
    assert [x["instance"] for x in doc[0]["results"]] == [r.instance for r in answer.results[:3]]
    assert doc[0]["results"][0]["cosine"] == pytest.approx(answer.results[0].cosine, abs=1e-6)
    assert doc[0]["results"][0]["inliers"] == answer.results[0].inliers
    assert doc[0]["rival_inliers"] == answer.rival and doc[0]["inliers"] == answer.top_inliers
    assert doc[0]["confidence"] == pytest.approx(answer.confidence, abs=1e-4)
    # --no-verify: no inliers, the verdict from the cosine
    r = run_cli("query", cli_index, queries / known[0], "--json", "--no-verify")
    d = json.loads(r.stdout)[0]
    assert all(x["inliers"] is None for x in d["results"]) and "not verified" in d["reason"]
    assert d["rival_inliers"] is None


def test_query_table_and_per_instance(cli_index, sample_collection):
    q = sorted((sample_collection / "queries").glob("*.jpg"))[0]
    r = run_cli("query", cli_index, q, "-k", "5", "--per-instance")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 5
    instances = [row.split()[3] for row in rows]
    assert len(set(instances)) == 5  # one result per instance


def test_query_with_rerankers(cli_index, sample_collection, capsys):
    q = sorted((sample_collection / "queries").glob("*.jpg"))[0]
    for rr in ("icfrr", "aqe", "dba", "spatial", "spatial,icfrr", "dba,icfrr"):
        assert main(["query", str(cli_index), str(q), "-k", "3", "--json", "--rerank", rr]) == 0, rr
        assert len(json.loads(capsys.readouterr().out)[0]["results"]) == 3


def test_update_and_info(cli_index, capsys):
    assert main(["update", str(cli_index)]) == 0
    assert "0 added/changed, 0 removed" in capsys.readouterr().out
    assert main(["info", str(cli_index)]) == 0
    assert "42 references" in capsys.readouterr().out


def test_exit_codes_and_one_line_errors(tmp_path, cli_index, capsys):
    assert main(["info", str(tmp_path)]) == 1  # not an index
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a museum-search index" in err[0]
    with pytest.raises(SystemExit) as e:
        main(["query"])  # usage error
    assert e.value.code == 2
    bad = tmp_path / "bad.jpg"
    bad.write_text("hello")
    assert main(["query", str(cli_index), str(bad)]) == 1
    err = capsys.readouterr().err
    assert "not an image" in err and "Traceback" not in err
    assert main(["query", str(cli_index), str(bad), "--rerank", "bogus"]) == 1
    assert "unknown re-ranker" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "missing"), "-o", str(tmp_path / "x")]) == 1
    r = run_cli("index", tmp_path, "-o", tmp_path / "y", "--backbone", "resnet152")
    if r.returncode != 0:  # no weights here: a clear message, no traceback
        assert r.returncode == 1 and "--weights" in r.stderr and "Traceback" not in r.stderr


def test_version():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("museum-search ")


def test_cli_engine_option(cli_index, sample_collection):
    q = sorted((sample_collection / "queries").glob("*.jpg"))[0]
    out = {}
    for engine in ("onnx", "torch"):
        r = run_cli("query", cli_index, q, "--json", "--no-verify", "--engine", engine)
        assert r.returncode == 0, r.stderr
        out[engine] = json.loads(r.stdout)[0]["results"]
    assert [x["path"] for x in out["onnx"]] == [x["path"] for x in out["torch"]]
    r = run_cli("query", cli_index, q, "--engine", "tensorflow")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_progress_bar_shows_the_step_and_the_whole_job_time_left(monkeypatch):
    """The CLI's bar names the step of the job (a new count per step) and the whole job's time
    left, from core's JobEta over a plan (not invented in the view)."""
    import io

    from tqdm import tqdm

    import museum_search.cli as cli
    from museum_search.core.progress import PlannedStage, Progress, with_plan

    out = io.StringIO()
    bars = []

    def bar(total, desc):
        b = tqdm(total=total, desc=desc, file=out, disable=False, mininterval=0)
        bars.append(b)
        return b

    monkeypatch.setattr(cli, "_progress_bar", bar)

    def job():
        for i in range(1, 5):
            yield Progress(i, 4, current=f"/photos/p{i}.jpg", elapsed=float(i), stage="describing")
        for i in range(1, 3):
            yield Progress(i, 2, elapsed=2.0 * i, stage="local features")
        return "built"

    plan = [PlannedStage("describing", 1.0), PlannedStage("local features", 2.0, lambda n: n / 2)]
    assert cli._drive(with_plan(job(), plan), "indexing") == "built"
    text = out.getvalue()
    assert "indexing, step 1/2 describing" in text and "indexing, step 2/2 local features" in text
    # 1 s per photo measured; the plan prices the 2 steps of local features at 2 photos each
    for left in ("00:07", "00:06", "00:05", "00:04", "00:02"):
        assert f"whole job {left} left" in text
    assert "p4.jpg" in text
    assert len(bars) == 1 and bars[0].total == 2  # one bar, reset to the second step's count
