"""Bring your own descriptors (issue 12, part 1): `import`, `query --descriptors`,
`evaluate --descriptors`, on the descriptors of a real index of the bundled sample collection."""

import csv
import json
import os
import pickle

import numpy as np
import pytest

from museum_search.cli import main
from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, descriptor_query, load_query
from museum_search.core.answer._verdict import Verdict
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import run_evaluation
from museum_search.core.index._store import LOCK, MANIFEST, Index
from museum_search.core.inference._extract import QUERY_REGIONS
from museum_search.core.jobs._importing import check_descriptors, descriptor_queries, descriptor_queryset, import_index
from museum_search.core.jobs._indexing import update_index
from museum_search.core.progress import drive

# The settings under which a photo query is answered from one descriptor, as a descriptor query is:
# the whole image, no verification.
AS_DESCRIPTORS = dict(regions=False, verify=False)


def write_items(path, index, root_relative=True):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "instance", "title", "artist"])
        for it in index.items:
            p = it.path if root_relative else str(index.root / it.path)
            w.writerow([p, it.instance, it.metadata.get("title", ""), it.metadata.get("artist", "")])


def folder_state(path):
    """Names, sizes and contents of every file in ``path`` (None when it does not exist)."""
    if not path.exists():
        return None
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, sample_index, sample_collection):
    """The sample index's descriptors and items as DESCRIPTORS.npy + ITEMS.csv, the sample queries'
    whole-image descriptors as Q.npy with GT.csv, and the index imported from them."""
    d = tmp_path_factory.mktemp("byod")
    np.save(d / "descriptors.npy", np.asarray(sample_index.descriptors))
    write_items(d / "items.csv", sample_index)
    photos = sorted((sample_collection / "queries").glob("*.jpg"))
    pipe = QueryPipeline(sample_index, QuerySettings(**AS_DESCRIPTORS))
    q = pipe.embed([load_query(p) for p in photos])[:, 0]
    np.save(d / "q.npy", q)
    truth = dict(line.split(",", 1) for line in
                 (sample_collection / "queries" / "ground_truth.csv").read_text().splitlines()[1:])
    # both spellings of a row: "row N" and "N"
    rows = [f"{'row ' if i % 2 else ''}{i},{truth[p.name].strip()}" for i, p in enumerate(photos)]
    (d / "gt.csv").write_text("query,instance\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = d / "imported"
    assert main(["import", str(d / "descriptors.npy"), "--items", str(d / "items.csv"), "-o", str(out),
                 "--root", str(sample_index.root)]) == 0
    return {"dir": d, "index": out, "photos": photos, "q": q}


def test_import_writes_an_index_of_the_descriptors(exported, sample_index, capsys):
    ix = Index.load(exported["index"])
    assert ix.meta.imported and ix.meta.name == "imported" and ix.meta.dim == sample_index.meta.dim
    assert ix.meta.summary() == f"imported descriptors ({ix.meta.dim}-d)"
    assert [(it.path, it.instance) for it in ix.items] == [(it.path, it.instance) for it in sample_index.items]
    assert ix.items[0].metadata == {k: v for k, v in sample_index.items[0].metadata.items()
                                    if k in ("title", "artist") and v}
    assert ix.items[0].size == sample_index.items[0].size  # the files exist here: size and time recorded
    assert ix.descriptors.dtype == np.float32 and ix.local is None and ix.labelling.rule == "imported"
    np.testing.assert_allclose(np.asarray(ix.descriptors), np.asarray(sample_index.descriptors), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(ix.descriptors), axis=1), 1.0, atol=1e-6)
    manifest = json.loads((exported["index"] / MANIFEST).read_text())
    assert manifest["backbone"]["name"] == "imported" and manifest["count"] == len(sample_index)
    assert sorted(p.name for p in exported["index"].iterdir() if p.name != LOCK) == \
        sorted([MANIFEST, *manifest["files"].values()])
    # `info` says how it is queried
    assert main(["info", str(exported["index"])]) == 0
    assert "imported descriptors" in capsys.readouterr().out


def test_import_normalizes_and_notes_missing_files(tmp_path, sample_index, capsys):
    raw = np.asarray(sample_index.descriptors, np.float64) * np.linspace(0.5, 40, len(sample_index))[:, None]
    np.save(tmp_path / "d.npy", raw)
    write_items(tmp_path / "items.csv", sample_index)  # relative to tmp_path: no file exists there
    assert main(["import", str(tmp_path / "d.npy"), "--items", str(tmp_path / "items.csv"),
                 "-o", str(tmp_path / "ix"), "--float16"]) == 0
    cap = capsys.readouterr()
    assert f"{len(sample_index)} of {len(sample_index)} files were not found" in cap.err
    assert "not verified" in cap.err and "L2-normalized" in cap.out
    ix = Index.load(tmp_path / "ix")
    assert ix.descriptors.dtype == np.float16
    np.testing.assert_allclose(np.asarray(ix.descriptors, np.float32), np.asarray(sample_index.descriptors),
                               atol=2e-3)
    # integers are numbers too, normalized like the rest
    ints = check_descriptors(np.array([[3, 4], [0, 2]], np.int16))
    np.testing.assert_allclose(ints, [[0.6, 0.8], [0, 1]])


def test_query_descriptors_gives_the_photo_index_top_k(exported, sample_index, capsys):
    assert main(["query", str(exported["index"]), "--descriptors", str(exported["dir"] / "q.npy"),
                 "-k", "5", "--json"]) == 0
    cap = capsys.readouterr()
    assert "verification is skipped" in cap.err
    doc = json.loads(cap.out)
    assert [d["query"] for d in doc] == [f"row {i}" for i in range(len(exported["photos"]))]
    # the imported index has the default verdict (no photos to calibrate it on)
    verdict = Verdict.of_index(Index.load(exported["index"]))
    assert verdict == Verdict()
    pipe = QueryPipeline(sample_index, QuerySettings(k=5, verdict=verdict, **AS_DESCRIPTORS))
    for d, photo in zip(doc, exported["photos"]):
        (ans,) = pipe.answer([load_query(photo)])
        assert set(d) == set(ans.to_dict())  # the JSON of a photo query
        assert [(r["path"], r["instance"]) for r in d["results"]] == [(r.abspath, r.instance) for r in ans.results]
        assert [r["cosine"] for r in d["results"]] == pytest.approx([r.cosine for r in ans.results], abs=1e-5)
        assert all(r["inliers"] is None for r in d["results"]) and "not verified" in d["reason"]
        assert (d["in_collection"], d["reason"]) == (ans.in_collection, ans.reason)


@pytest.mark.parametrize("rerank", ["icfrr", "aqe", "dba", "dba,icfrr"])
def test_rerankers_work_on_descriptor_queries(exported, sample_index, rerank):
    """Re-rankers see the same scores whether the query was a photo or its descriptor."""
    settings = QuerySettings(k=5, rerank=rerank, **AS_DESCRIPTORS)
    imported = QueryPipeline.for_descriptors(Index.load(exported["index"]), settings)
    photo = QueryPipeline(sample_index, settings)
    queries = descriptor_queries(exported["dir"] / "q.npy", imported.index)
    got = imported.answer(queries)
    for a, p in zip(got, exported["photos"]):
        (b,) = photo.answer([load_query(p)])
        assert [r.row for r in a.results] == [r.row for r in b.results]
        np.testing.assert_allclose([r.score for r in a.results], [r.score for r in b.results], atol=1e-4)


def test_descriptors_query_a_photo_index_too(exported, sample_index, capsys):
    """--descriptors on an index of photos (with local features): the same answers, not verified."""
    assert main(["query", str(sample_index.path), "--descriptors", str(exported["dir"] / "q.npy"),
                 "-k", "3", "--json"]) == 0
    on_photos = json.loads(capsys.readouterr().out)
    main(["query", str(exported["index"]), "--descriptors", str(exported["dir"] / "q.npy"), "-k", "3", "--json"])
    on_imported = json.loads(capsys.readouterr().out)
    assert [[r["instance"] for r in d["results"]] for d in on_photos] == \
        [[r["instance"] for r in d["results"]] for d in on_imported]
    assert all(r["inliers"] is None for d in on_photos for r in d["results"])
    # photos and descriptors in one batch: a descriptor stands for every region of the photos'
    pipe = QueryPipeline(sample_index)
    desc = pipe.embed([load_query(exported["photos"][0]), descriptor_query(exported["q"][1], "row 1")])
    regions = len(QUERY_REGIONS)
    assert desc.shape == (2, regions, sample_index.meta.dim)
    np.testing.assert_array_equal(desc[1], np.repeat(exported["q"][1:2], regions, axis=0))


def test_photo_queries_of_an_imported_index_are_refused(exported, capsys):
    assert main(["query", str(exported["index"]), str(exported["photos"][0])]) == 1
    assert "this index holds imported descriptors: query it with --descriptors" in capsys.readouterr().err
    with pytest.raises(MuseumSearchError, match="query it with --descriptors"):
        QueryPipeline(Index.load(exported["index"])).answer([load_query(exported["photos"][0])])
    # photos and --descriptors together, or neither
    assert main(["query", str(exported["index"]), str(exported["photos"][0]), "--descriptors",
                 str(exported["dir"] / "q.npy")]) == 1
    assert main(["query", str(exported["index"])]) == 1
    assert "one of the two" in capsys.readouterr().err
    # update has no network to describe new files with
    with pytest.raises(MuseumSearchError, match="imported descriptors"):
        drive(update_index(Index.load(exported["index"])))


def test_evaluate_descriptors_gives_the_photo_figures(exported, sample_index, sample_collection, capsys):
    out = exported["dir"] / "eval.json"
    assert main(["evaluate", str(exported["index"]), "--descriptors", str(exported["dir"] / "q.npy"),
                 "--ground-truth", str(exported["dir"] / "gt.csv"), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    photos = run_evaluation(sample_index, load_queryset(sample_collection / "queries"),
                            QuerySettings(**AS_DESCRIPTORS))
    imported = Index.load(exported["index"])
    core = run_evaluation(imported, descriptor_queryset(exported["dir"] / "q.npy", exported["dir"] / "gt.csv",
                                                        imported))
    assert summary["queries"] == core.summary["queries"] == photos.summary["queries"] > 10
    assert summary["open_set_queries"] == photos.summary["open_set_queries"] > 0
    for key in ("mp@1", "map", "amnro"):
        assert core.summary[key] == photos.summary[key], key  # the same rankings
        assert summary[key] == pytest.approx(photos.summary[key], abs=1e-6), key  # the CLI's JSON (rounded)
    for a, b in zip(core.records, photos.records):
        np.testing.assert_array_equal(a.ranking, b.ranking)
    assert summary["verified"] is False and core.summary["verified"] is False
    # the photo index evaluated on the same descriptors
    assert main(["evaluate", str(sample_index.path), "--descriptors", str(exported["dir"] / "q.npy"),
                 "--ground-truth", str(exported["dir"] / "gt.csv"), "--json", str(out)]) == 0
    again = json.loads(out.read_text())["summary"]
    assert (again["mp@1"], again["map"]) == (summary["mp@1"], summary["map"])
    # with a re-ranker
    assert main(["evaluate", str(exported["index"]), "--descriptors", str(exported["dir"] / "q.npy"),
                 "--ground-truth", str(exported["dir"] / "gt.csv"), "--rerank", "icfrr"]) == 0
    assert "MP@1" in capsys.readouterr().out


def test_evaluate_ground_truth_errors(exported, tmp_path, capsys):
    q = str(exported["dir"] / "q.npy")
    n = len(exported["q"])
    for text, message in ((f"query,instance\nrow {n},x\n", f"has {n} rows"),
                          ("query,instance\nrow one,x\n", "is not a row"),
                          ("query,label\n", "names none of the")):
        (tmp_path / "gt.csv").write_text(text)
        assert main(["evaluate", str(exported["index"]), "--descriptors", q, "--ground-truth",
                     str(tmp_path / "gt.csv")]) == 1
        assert message in capsys.readouterr().err
    assert main(["evaluate", str(exported["index"]), "--descriptors", q]) == 1  # no ground truth
    assert "--ground-truth" in capsys.readouterr().err


#: Every kind of array refused, with (part of) its message; {n} is the number of items.
BAD = {
    "nan": "row 5 holds NaN or infinite values",
    "inf": "row 2 holds NaN or infinite values",
    "zero": "row 7 cannot be L2-normalized",
    "rows": "has {m} rows but items.csv lists {n} items",
    "3d": "must be a 2-D array",
    "object": "holds Python objects",
    "pickle": "holds Python objects",
    "text": "descriptors must be numbers",
    "npz": "is a .npz archive",
}


class _Marker:
    """Unpickling this creates a file: proof that nothing was unpickled if the file is absent."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _write_bad(path, name, d):
    a = d.copy()
    if name == "nan":
        a[5, 3] = np.nan
    elif name == "inf":
        a[2, 0] = np.inf
    elif name == "zero":
        a[7] = 0
    elif name == "rows":
        a = d[:-2]
    elif name == "3d":
        a = d.reshape(len(d), 2, -1)
    elif name == "text":
        a = np.full((len(d), 3), "a")
    elif name == "object":
        a = np.array([[_Marker(path.parent / "unpickled")]] * len(d), dtype=object)
        return np.save(path, a, allow_pickle=True)
    elif name == "pickle":
        return path.write_bytes(pickle.dumps(_Marker(path.parent / "unpickled")))
    elif name == "npz":
        with open(path, "wb") as f:
            return np.savez(f, d)
    np.save(path, a)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arrays_are_refused_and_nothing_is_written(name, exported, sample_index, tmp_path, capsys):
    d = np.asarray(sample_index.descriptors, np.float32)
    message = BAD[name].format(n=len(d), m=len(d) - 2)
    bad = tmp_path / f"{name}.npy"
    _write_bad(bad, name, d)
    items = tmp_path / "items.csv"
    write_items(items, sample_index)
    # a new folder is not created; an existing index is left as it was
    existing = tmp_path / "existing"
    assert main(["import", str(exported["dir"] / "descriptors.npy"), "--items", str(items), "-o", str(existing)]) == 0
    before = folder_state(existing)
    for out in (tmp_path / "new", existing):
        state = folder_state(out)
        assert main(["import", str(bad), "--items", str(items), "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert message in err and "nothing was written" in err, err
        assert folder_state(out) == state
    assert folder_state(existing) == before
    assert not (tmp_path / "unpickled").exists()  # never unpickled
    # the same array as queries: refused too (except a row count, which queries do not have)
    if name != "rows":
        assert main(["query", str(exported["index"]), "--descriptors", str(bad)]) == 1
        assert message in capsys.readouterr().err
        assert not (tmp_path / "unpickled").exists()


def test_query_descriptors_of_another_dimension_are_refused(exported, tmp_path, capsys):
    np.save(tmp_path / "q.npy", exported["q"][:, :100])
    assert main(["query", str(exported["index"]), "--descriptors", str(tmp_path / "q.npy")]) == 1
    assert "holds 100-d descriptors, the index holds 1280-d descriptors" in capsys.readouterr().err
    assert main(["evaluate", str(exported["index"]), "--descriptors", str(tmp_path / "q.npy"),
                 "--ground-truth", str(exported["dir"] / "gt.csv")]) == 1
    assert "the index holds 1280-d" in capsys.readouterr().err


def test_items_csv_errors(exported, sample_index, tmp_path, capsys):
    desc = str(exported["dir"] / "descriptors.npy")
    lines = (exported["dir"] / "items.csv").read_text().splitlines()
    cases = [
        ("path,title\n" + "\n".join(lines[1:]), "has no instance column"),
        ("\n".join(lines[:3] + [lines[2]] + lines[4:]), "is listed twice"),
        ("\n".join(lines[:3] + [",x,,"] + lines[4:]), "line 4: no path"),
        ("\n".join(lines[:-1]), f"items.csv lists {len(lines) - 2} items"),
    ]
    for text, message in cases:
        (tmp_path / "items.csv").write_text(text + "\n", encoding="utf-8")
        assert main(["import", desc, "--items", str(tmp_path / "items.csv"), "-o", str(tmp_path / "out")]) == 1
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_an_index_is_never_overwritten(exported, tmp_path, capsys):
    desc, items = exported["dir"] / "descriptors.npy", exported["dir"] / "items.csv"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    before = folder_state(tmp_path / "mine")
    assert main(["import", str(desc), "--items", str(items), "-o", str(tmp_path / "mine")]) == 1
    assert "is not empty and is not a museum-search index" in capsys.readouterr().err
    assert folder_state(tmp_path / "mine") == before
    # nor the collection (the folder the items are relative to), nor a folder that holds it
    for out in (exported["dir"], exported["dir"].parent):
        state = sorted(os.listdir(out))
        with pytest.raises(MuseumSearchError, match="collection"):
            drive(import_index(desc, items, out))
        assert sorted(os.listdir(out)) == state
    # an index is replaced atomically by a new generation
    out = tmp_path / "ix"
    drive(import_index(desc, items, out))
    first = json.loads((out / MANIFEST).read_text())["files"]["descriptors"]
    drive(import_index(desc, items, out, float16=True))
    assert first not in os.listdir(out) and Index.load(out).descriptors.dtype == np.float16
