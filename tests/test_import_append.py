"""``import --append`` (issue 24, item 5): references computed elsewhere are added to an imported
index without building it again; its neighbour lists stay those of a build from scratch, its
approximate index takes the new rows, and a refused input changes nothing."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from museum_search.cli import main
from museum_search.core.index import _neighbours
from museum_search.core.index._store import MANIFEST, Index
from museum_search.core.jobs._importing import import_index
from museum_search.core.progress import drive

DIM = 48


def _objects(n_objects: int, first: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((n_objects, 1, DIM))
    x = (c + 0.5 * rng.standard_normal((n_objects, 6, DIM))).reshape(-1, DIM)
    return x.astype(np.float32)


def _write(tmp: Path, name: str, x: np.ndarray, first_object: int) -> tuple[Path, Path]:
    np.save(tmp / f"{name}.npy", x)
    with open(tmp / f"{name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "instance", "title"])
        for i in range(len(x)):
            obj = first_object + i // 6
            w.writerow([f"obj{obj}/view{i % 6}.jpg", f"obj{obj}", f"Object {obj}"])
    return tmp / f"{name}.npy", tmp / f"{name}.csv"


@pytest.fixture()
def parts(tmp_path):
    first = _write(tmp_path, "first", _objects(150, 0, seed=1), 0)  # 900 references
    more = _write(tmp_path, "more", _objects(40, 150, seed=2), 150)  # 240 more
    return tmp_path, first, more


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("approximate", ["no", "yes"])
def test_append_equals_an_import_of_everything(parts, approximate, capsys):
    tmp, (d1, i1), (d2, i2) = parts
    out = tmp / "index"
    drive(import_index(d1, i1, out, root=tmp, ann=approximate, neighbours=8))
    assert main(["import", str(d2), "--items", str(i2), "-o", str(out), "--append", "--ann", approximate]) == 0
    assert "1,140 references" in capsys.readouterr().out
    index = Index.load(out)
    everything = _unit(np.concatenate([np.load(d1), np.load(d2)]))
    np.testing.assert_allclose(np.asarray(index.descriptors), everything, atol=1e-6)
    assert [it.path for it in index.items][-1] == "obj189/view5.jpg" and index.items[900].instance == "obj150"
    assert index.items[900].metadata["title"] == "Object 150"
    # the stored lists: a build from scratch's, exactly (every new row, and the old rows they enter)
    k = index.neighbours.shape[1]  # as an update: at least the default 32
    assert k >= 8
    exact = drive(_neighbours.neighbour_lists(np.asarray(index.descriptors), k))
    if approximate == "no":
        np.testing.assert_array_equal(index.neighbours, exact)
    else:
        # the approximate path: each reference's other views (its 5 nearest) exactly; the rest of a
        # list (unrelated objects, near-ties) mostly
        np.testing.assert_array_equal(index.neighbours[:, :5], exact[:, :5])
        assert np.mean(index.neighbours == exact) >= 0.8, np.mean(index.neighbours == exact)
        assert index.ann is not None and index.ann.ntotal == 1140
        rows, _ = index.ann.search(index.descriptors, np.asarray(index.descriptors[900:]), 1)
        np.testing.assert_array_equal(rows[:, 0], np.arange(900, 1140))  # each new row finds itself


def test_a_refused_append_changes_nothing(parts, capsys):
    tmp, (d1, i1), (d2, i2) = parts
    out = tmp / "index"
    drive(import_index(d1, i1, out, root=tmp, ann="no", neighbours=8))
    before = (out / MANIFEST).read_bytes()
    # paths the index holds already
    assert main(["import", str(d1), "--items", str(i1), "-o", str(out), "--append"]) != 0
    assert "already holds" in capsys.readouterr().err
    # another dimension
    np.save(tmp / "wide.npy", np.ones((240, DIM + 1), np.float32))
    assert main(["import", str(tmp / "wide.npy"), "--items", str(i2), "-o", str(out), "--append"]) != 0
    assert f"{DIM + 1}-d" in capsys.readouterr().err
    # a row count that is not the items'
    np.save(tmp / "short.npy", np.ones((10, DIM), np.float32))
    assert main(["import", str(tmp / "short.npy"), "--items", str(i2), "-o", str(out), "--append"]) != 0
    assert "nothing was written" in capsys.readouterr().err
    # --float16 would say the index changes its dtype: it does not
    assert main(["import", str(d2), "--items", str(i2), "-o", str(out), "--append", "--float16"]) != 0
    assert "dtype" in capsys.readouterr().err
    # another root
    assert main(["import", str(d2), "--items", str(i2), "-o", str(out), "--append", "--root", str(out)]) != 0
    assert "relative to" in capsys.readouterr().err
    assert (out / MANIFEST).read_bytes() == before and len(Index.load(out)) == 900
