"""Updating neighbour lists after an index update (issue 21, item 5): only the rows that can change
are computed again, and the lists are identical to lists computed from scratch (bit for bit, ties
included); the approximate index is updated in place of a rebuild; `update` uses both."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_ann import clustered, dense_lists

from museum_search.core.errors import MuseumSearchError
from museum_search.core.index import _approximate, _neighbours
from museum_search.core.index import _store as store_mod
from museum_search.core.index._store import MANIFEST, Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs import _indexing as index_mod
from museum_search.core.jobs._indexing import build_index, update_index
from museum_search.core.progress import Progress, drive
from museum_search.core.progress import drive as run


def planted(seed: int, objects: int = 60, views: int = 8, dim: int = 48, dtype=np.float16) -> np.ndarray:
    """Clustered unit vectors with exact copies (ties) and near-duplicates."""
    d = clustered(objects, views, dim, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed)
    d[10] = d[11]
    d[12] = d[11]
    d[300] = d[11]  # four identical references, far apart in row order
    d[40:46] = d[40]  # six more
    near = np.asarray(d[200], np.float32) + 1e-3 * rng.standard_normal(dim).astype(np.float32)
    d[201] = (near / np.linalg.norm(near)).astype(dtype)
    return d


def apply(d: np.ndarray, removed, new: np.ndarray, at_end: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The descriptors after an update (kept rows in order, then the new ones) and the old -> new map."""
    keep = np.ones(len(d), dtype=bool)
    keep[list(removed)] = False
    kept = np.asarray(d[keep])
    if at_end:
        out = np.concatenate([kept, new]).astype(d.dtype)
        m = np.full(len(d), -1, dtype=np.int64)
        m[keep] = np.arange(keep.sum())
        return out, m
    # the new references spread among the kept ones (kept ones still in their order)
    total = len(kept) + len(new)
    slots = np.sort(np.random.default_rng(7).choice(total, len(new), replace=False))
    out = np.empty((total, d.shape[1]), d.dtype)
    is_new = np.zeros(total, bool)
    is_new[slots] = True
    out[slots], out[~is_new] = new, kept
    m = np.full(len(d), -1, dtype=np.int64)
    m[keep] = np.flatnonzero(~is_new)
    return out, m


def scenarios(d: np.ndarray, seed: int):
    rng = np.random.default_rng(100 + seed)
    dim = d.shape[1]
    fresh = clustered(4, 3, dim, seed=500 + seed, dtype=d.dtype)
    copies = np.asarray(d[[11, 40, 200, 5]])  # exact ties with kept references (and their copies)
    changed = [3, 77]
    changed_desc = clustered(2, 1, dim, seed=900 + seed, dtype=d.dtype)
    removed = rng.choice(len(d), 6, replace=False).tolist() + [11, 41]  # one of each group of copies
    yield "add one", [], copies[:1]
    yield "add many", [], np.concatenate([fresh, copies])
    yield "remove one", [11], copies[:0]
    yield "remove several", removed, copies[:0]
    yield "change", changed, changed_desc
    yield "mix", removed + changed, np.concatenate([changed_desc, fresh, copies])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_incremental_lists_equal_lists_from_scratch(dtype, seed, monkeypatch):
    monkeypatch.setattr(_neighbours, "_BLOCK_ROWS", 64)  # several row blocks and column chunks
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)  # never fall back to the full computation
    d = planted(seed, dtype=dtype)
    for k in (5, 20):
        old = drive(_neighbours.neighbour_lists(d, k))
        for name, removed, new in scenarios(d, seed):
            after, m = apply(d, removed, new)
            got = drive(_neighbours.update_neighbour_lists(old, m, after, k))
            expected = drive(_neighbours.neighbour_lists(after, k))
            assert got.dtype == np.int32 and got.shape == expected.shape, name
            np.testing.assert_array_equal(got, expected, err_msg=f"{name}, k={k}")
            np.testing.assert_array_equal(got, dense_lists(after, k), err_msg=f"{name}, k={k}")


def test_ties_between_new_and_kept_references_follow_the_row_order(monkeypatch):
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    d = planted(3)
    old = drive(_neighbours.neighbour_lists(d, 4))
    after, m = apply(d, [12], np.asarray(d[[11, 11]]))  # two more copies of 10 = 11 = 300
    got = drive(_neighbours.update_neighbour_lists(old, m, after, 4))
    n = len(after)
    # the group: 10, 11, 299 (300 renumbered), n - 2, n - 1; each row lists the others by row
    assert list(got[10]) == [11, 299, n - 2, n - 1]
    assert list(got[299]) == [10, 11, n - 2, n - 1]
    assert list(got[n - 1]) == [10, 11, 299, n - 2]
    np.testing.assert_array_equal(got, drive(_neighbours.neighbour_lists(after, 4)))


def test_new_references_anywhere_and_longer_or_complete_old_lists(monkeypatch):
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    d = planted(4)
    new = np.concatenate([np.asarray(d[[11, 40]]), clustered(3, 2, d.shape[1], seed=44)])
    after, m = apply(d, [2, 40, 100], new, at_end=False)
    old = drive(_neighbours.neighbour_lists(d, 30))  # longer than asked: their first k are used
    np.testing.assert_array_equal(drive(_neighbours.update_neighbour_lists(old, m, after, 12)),
                                  drive(_neighbours.neighbour_lists(after, 12)))
    # a tiny index: each list holds every other reference (fewer than k); new ones lengthen them
    small = d[:8]
    old = drive(_neighbours.neighbour_lists(small, 32))
    assert old.shape == (8, 7)
    after, m = apply(small, [], new)
    got = drive(_neighbours.update_neighbour_lists(old, m, after, 32))
    assert got.shape == (len(after), len(after) - 1)
    np.testing.assert_array_equal(got, dense_lists(after, len(after) - 1))
    after, m = apply(small, [3], new)  # and with a removal every row is computed again
    np.testing.assert_array_equal(drive(_neighbours.update_neighbour_lists(old, m, after, 32)),
                                  dense_lists(after, len(after) - 1))


def test_many_new_candidates_and_the_fallback_are_still_exact(monkeypatch):
    d = planted(5)
    old = drive(_neighbours.neighbour_lists(d, 6))
    new = np.repeat(np.asarray(d[[40, 200]]), 5, axis=0)  # ten more copies: many candidates per row
    after, m = apply(d, [7, 8], new)
    expected = drive(_neighbours.neighbour_lists(after, 6))
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    monkeypatch.setattr(_neighbours, "_MERGE_CAP", 3)  # those rows are computed again instead of merged
    np.testing.assert_array_equal(drive(_neighbours.update_neighbour_lists(old, m, after, 6)), expected)
    monkeypatch.setattr(_neighbours, "_MERGE_CAP", 256)
    monkeypatch.setattr(_neighbours, "_PAIRS_MAX", 20)  # too many pairs held: the busiest rows computed again
    np.testing.assert_array_equal(drive(_neighbours.update_neighbour_lists(old, m, after, 6)), expected)
    monkeypatch.setattr(_neighbours, "_PAIRS_MAX", 1 << 23)
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 0.0)  # everything from scratch
    np.testing.assert_array_equal(drive(_neighbours.update_neighbour_lists(old, m, after, 6)), expected)


def test_bad_arguments_are_refused():
    d = planted(6)
    old = drive(_neighbours.neighbour_lists(d, 5))
    after, m = apply(d, [1], np.asarray(d[[2]]))
    with pytest.raises(ValueError, match="fewer than"):
        drive(_neighbours.update_neighbour_lists(old, m, after, 10))  # the old lists are too short
    with pytest.raises(ValueError, match="order"):
        drive(_neighbours.update_neighbour_lists(old, m[::-1].copy(), after, 5))
    with pytest.raises(ValueError, match="one int per old reference"):
        drive(_neighbours.update_neighbour_lists(old, m[:-1], after, 5))
    with pytest.raises(ValueError, match="both"):
        drive(_neighbours.update_neighbour_lists(old, m, after, 5, old_ann=object()))
    assert drive(_neighbours.update_neighbour_lists(old[:1, :0], np.array([0]), after[:1], 5)).shape == (1, 0)


def test_progress_and_cancel(monkeypatch):
    monkeypatch.setattr(_neighbours, "_BLOCK_ROWS", 64)
    d = planted(7)
    old = drive(_neighbours.neighbour_lists(d, 5))
    after, m = apply(d, [4], np.asarray(d[[9]]))
    records = []
    gen = _neighbours.update_neighbour_lists(old, m, after, 5)
    for p in gen:
        assert isinstance(p, Progress) and p.stage == _neighbours.NEIGHBOURS_STAGE and p.total == len(after)
        records.append(p.done)
        if len(records) == 3:
            gen.close()
            break
    with pytest.raises(StopIteration):
        next(gen)
    records = [p.done for p in _neighbours.update_neighbour_lists(old, m, after, 5)]
    assert records == sorted(records) and records[-1] == len(after)


# ---- the approximate index -------------------------------------------------------------------


def _lists_of(index) -> list[tuple[np.ndarray, np.ndarray]]:
    import faiss

    lists = faiss.extract_index_ivf(index._index).invlists
    out = []
    for c in range(lists.nlist):
        size = lists.list_size(c)
        ids = faiss.rev_swig_ptr(lists.get_ids(c), size).copy() if size else np.empty(0, np.int64)
        codes = faiss.rev_swig_ptr(lists.get_codes(c), size * lists.code_size).copy() if size else b""
        out.append((ids, np.asarray(codes)))
    return out


@pytest.fixture(scope="module")
def ann_case():
    d = clustered(300, 10, 96, seed=3)  # 96-d with 6 sub-quantizers: no zero padding
    d[10] = d[11]
    d[500] = d[11]
    built = drive(_approximate.AnnIndex.build(d))
    return d, built


def test_the_approximate_index_is_updated_not_rebuilt(ann_case):
    import faiss

    d, built = ann_case
    before = _lists_of(built)
    removed = np.random.default_rng(1).choice(len(d), 25, replace=False)
    after, m = apply(d, removed, np.concatenate([np.asarray(d[[11, 12]]), clustered(4, 3, d.shape[1], seed=8)]))
    updated = drive(built.updated(after, m))
    assert updated.ntotal == len(after)
    assert replace(updated.params, tuning=None) == replace(built.params, tuning=None)
    # its recall measured again, on the updated references; the old index's measurement left as it was
    assert updated.params.tuning.references == len(after) and built.params.tuning.references == len(d)
    assert updated.params.tuning.held_out and updated.params.tuning.meets_target
    # the same as emptying the trained index and adding every reference in row order
    ref = faiss.deserialize_index(faiss.serialize_index(built._index))
    ref.reset()
    ref.add(np.asarray(after, np.float32))
    for (ia, ca), (ib, cb) in zip(_lists_of(updated), _lists_of(type(built)(ref, built.params, built.dim))):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)
    # the old index is untouched
    assert built.ntotal == len(d)
    for (ia, ca), (ib, cb) in zip(before, _lists_of(built)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)
    rows, _ = updated.search(after, after[-3:], 1)
    assert list(rows[:, 0]) == [len(after) - 3, len(after) - 2, len(after) - 1]


def test_padded_approximate_index_is_updated_too():
    d = clustered(40, 5, 50, seed=2)  # 50-d, m = 3: zero padded to 51
    built = drive(_approximate.AnnIndex.build(d))
    after, m = apply(d, [0, 7], np.asarray(d[[3]]))
    updated = drive(built.updated(after, m))
    assert type(updated._index).__name__ == "IndexPreTransform"
    assert updated.ntotal == len(after) and built.ntotal == len(d)
    rows, _ = updated.search(after, after[-1:], 2)
    assert sorted(rows[0].tolist()) == [2, len(after) - 1]  # row 3 became 2


def test_a_memory_mapped_index_is_updated_and_saved_as_it_reads_back(ann_case, tmp_path):
    """An index read from its file (memory-mapped: faiss on-disk lists, which faiss can neither
    clone nor serialize into bytes that read back) is copied into memory to be updated or saved."""
    d, built = ann_case
    f = tmp_path / "ann.faiss"
    f.write_bytes(built.to_bytes())
    mapped = _approximate.AnnIndex.read(f, built.params)
    assert mapped.to_bytes() == built.to_bytes()
    again = _approximate.AnnIndex.from_bytes(mapped.to_bytes(), built.params)
    np.testing.assert_array_equal(again.search(d, d[:5], 3)[0], built.search(d, d[:5], 3)[0])
    after, m = apply(d, [0, 1], np.asarray(d[[2]]))
    a, b = drive(mapped.updated(after, m)), drive(built.updated(after, m))
    assert a.to_bytes() == b.to_bytes() and mapped.ntotal == len(d)


@pytest.mark.parametrize("k", [12, 40])
def test_approximate_lists_updated_with_the_updated_index(ann_case, k, monkeypatch):
    """With the approximate index (k-NN graph lists, see test_knn.py): the new rows and the rows that
    lost a neighbour get exact lists; a kept row keeps its list unless a new reference enters it."""
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    d, built = ann_case
    old = drive(_neighbours.neighbour_lists(d, k, ann=built))
    rng = np.random.default_rng(k)
    for removed, new in (([], np.asarray(d[[11]])),
                         (rng.choice(len(d), 30, replace=False), np.asarray(d[[5, 6, 11]])),
                         (rng.choice(len(d), 10, replace=False), clustered(10, 3, d.shape[1], seed=k))):
        after, m = apply(d, removed, new)
        updated = drive(built.updated(after, m))
        got = drive(_neighbours.update_neighbour_lists(old, m, after, k, ann=updated, old_ann=built))
        exact = dense_lists(after, k)
        kept_old = np.flatnonzero(m >= 0)
        new_rows = np.setdiff1d(np.arange(len(after)), m[kept_old])
        renumbered = m[old[kept_old]]
        lost = (renumbered < 0).any(axis=1)
        redo = np.union1d(m[kept_old[lost]], new_rows)
        np.testing.assert_array_equal(got[redo], exact[redo])
        entered = np.isin(got[m[kept_old[~lost]]], new_rows).any(axis=1)
        np.testing.assert_array_equal(got[m[kept_old[~lost]]][~entered], renumbered[~lost][~entered])
        with pytest.raises(MuseumSearchError, match="rebuild"):
            drive(_neighbours.update_neighbour_lists(old, m, after[:-1], k, ann=updated, old_ann=built))


def test_an_update_measures_the_recall_again_on_the_updated_references(monkeypatch):
    """The tuning stored with the approximate index describes the references it holds: after an
    update that the old settings no longer serve (4,000 references crowded into one region, where
    the tuned shortlist is far too short), it is measured again, and the settings are raised."""
    d = clustered(100, 10, 64, seed=21)
    params = _approximate.choose_params(len(d), 64)
    params.nprobe, params.shortlist = 1, 10
    built = drive(_approximate.AnnIndex.build(d, params, tune=True))
    before = built.params.tuning
    assert before.references == len(d) and before.meets_target
    settings = (built.params.nprobe, built.params.shortlist)
    after = np.concatenate([d, clustered(400, 10, 64, seed=22, per_group=400)])
    stages = []
    gen = built.updated(after, np.arange(len(d)))
    try:
        while True:
            stages.append(next(gen).stage)
    except StopIteration as stop:
        updated = stop.value
    assert stages[0] == _approximate.ADD_STAGE and stages[-1] == _approximate.TUNE_STAGE
    t = updated.params.tuning
    assert t.references == len(after) and t.held_out and t.queries == 200
    # measured from the old settings: on the updated references they fell short, so were raised
    assert t.steps[0][:2] == settings and t.steps[0][2] < _approximate.TARGET_RECALL
    assert t.meets_target and (updated.params.nprobe, updated.params.shortlist) != settings
    assert (updated.params.nprobe, updated.params.shortlist, t.recall_at_10) in t.steps
    assert t.exact_ms == before.exact_ms  # not timed again (it does not depend on the settings)
    # the old index keeps its own parameters and measurement
    assert built.params.tuning == before and (built.params.nprobe, built.params.shortlist) == settings
    # independently: new views of the updated references, against the float64 ranking
    rng = np.random.default_rng(5)
    q = np.asarray(after[rng.choice(len(after), 100, replace=False)], np.float64)
    q += 0.3 * rng.standard_normal(q.shape) / 8
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    truth = np.argsort(-(q @ np.asarray(after, np.float64).T), axis=1, kind="stable")[:, :10]
    rows, _ = updated.search(after, q.astype(np.float32), 10)
    assert np.mean([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(rows, truth)]) >= 0.9
    # a large index (here: made to look large) is measured again with fewer queries, and says so
    monkeypatch.setattr(_approximate, "_UPDATE_PAIRS", 60 * len(after))
    fewer = drive(built.updated(after, np.arange(len(d)))).params.tuning
    assert fewer.queries == 60 and "60 held-out noisy references" in fewer.summary()
    # an index that was never tuned is not measured by an update either
    untuned = drive(_approximate.AnnIndex.build(d, params, tune=False))
    assert drive(untuned.updated(after, np.arange(len(d)))).params.tuning is None


def test_cancelling_the_approximate_update_changes_nothing(ann_case, monkeypatch):
    d, built = ann_case
    before = _lists_of(built)
    after, m = apply(d, [3], clustered(30, 1, d.shape[1], seed=4))
    monkeypatch.setattr(built.params, "add_chunk", 5)
    gen = built.updated(after, m)
    for p in gen:
        assert p.stage == _approximate.ADD_STAGE
        if p.done > len(d) - 1:  # adding the new ones
            gen.close()
            break
    assert built.ntotal == len(d)
    for (ia, ca), (ib, cb) in zip(before, _lists_of(built)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ca, cb)


# ---- update_index on a real collection -----------------------------------------------------------

K = 5  # neighbours stored (monkeypatched K_MAX): lists shorter than the collection


@pytest.fixture()
def sample_copy(tmp_path, sample_collection):
    coll = tmp_path / "coll"
    shutil.copytree(sample_collection / "collection", coll)
    shutil.copy2(sample_collection / "catalogue.csv", coll / "catalogue.csv")
    return coll


def _spec(coll: Path) -> LabellingSpec:
    return LabellingSpec("catalogue", str(coll / "catalogue.csv"))


def _build(coll: Path, out: Path | None, ann_mode: str = "auto"):
    return run(build_index(coll, out, BackboneConfig(size=64), _spec(coll), verification=False,
                           neighbours=K, ann=ann_mode))


def _edit(coll: Path) -> None:
    """Delete two photos, change one (another photo's content, a new time), add a copy of one."""
    files = sorted(coll.glob("*.jpg"))
    files[0].unlink()
    files[17].unlink()
    shutil.copy2(files[30], files[5])
    later = time.time() + 10
    os.utime(files[5], (later, later))
    shutil.copy2(files[9], coll / "copy-of-9.jpg")
    with open(coll / "catalogue.csv", "a", encoding="utf-8") as f:
        f.write(f"copy-of-9.jpg,{files[9].stem.rsplit('-', 1)[0]},,,,\n")


def _by_path(index: Index) -> dict[str, list[bytes]]:
    """Each reference's neighbours by path, each neighbour named by its descriptor (so that copies,
    which tie, compare equal whatever their rows)."""
    desc = np.asarray(index.descriptors)
    paths = [it.path for it in index.items]
    return {paths[i]: [desc[j].tobytes() for j in row] for i, row in enumerate(np.asarray(index._neighbours))}


@pytest.fixture()
def spy(monkeypatch):
    """Counts the from-scratch computations of the lists and of the approximate index."""
    calls = {"lists": 0, "build": 0}
    real_lists, real_build = _neighbours.neighbour_lists, _approximate.AnnIndex.build.__func__

    def lists(*a, **k):
        calls["lists"] += 1
        return real_lists(*a, **k)

    def build(cls, *a, **k):
        calls["build"] += 1
        return real_build(cls, *a, **k)

    monkeypatch.setattr(_neighbours, "neighbour_lists", lists)
    monkeypatch.setattr(_approximate.AnnIndex, "build", classmethod(build))
    return calls


def test_update_keeps_and_updates_the_lists_like_a_fresh_build(sample_copy, tmp_path, monkeypatch, spy):
    monkeypatch.setattr(index_mod, "K_MAX", K)
    monkeypatch.setattr(store_mod, "K_MAX", K)
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)  # 42 photos: most rows change; use the update anyway
    out = tmp_path / "idx"
    _build(sample_copy, out)
    old = Index.load(out)
    assert old.neighbours_stored == K and old.ann is None
    _edit(sample_copy)
    spy["lists"] = 0
    report = run(update_index(Index.load(out)))
    assert (report.added, report.removed, report.unchanged) == (2, 2, len(old) - 3)  # a change counts as added
    assert spy["lists"] == 0  # updated, not computed from scratch
    up = Index.load(out)
    assert up.neighbours_stored == K and up.ann is None
    # identical to the lists computed from scratch on the updated index
    np.testing.assert_array_equal(np.asarray(up._neighbours), drive(_neighbours.neighbour_lists(up.descriptors, K)))
    # and the same as a fresh build of the same folder (row order differs: compared by path)
    fresh = _build(sample_copy, None).index
    assert _by_path(up) == _by_path(fresh)


def test_update_with_an_approximate_index_updates_it(sample_copy, tmp_path, monkeypatch, spy):
    monkeypatch.setattr(index_mod, "K_MAX", K)
    monkeypatch.setattr(store_mod, "K_MAX", K)
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    out = tmp_path / "idx"
    _build(sample_copy, out, ann_mode="yes")
    old = Index.load(out)
    assert old.ann is not None
    _edit(sample_copy)
    spy["lists"] = spy["build"] = 0
    run(update_index(Index.load(out), ann="yes"))
    assert spy == {"lists": 0, "build": 0}
    up = Index.load(out)
    assert up.ann is not None and up.ann.ntotal == len(up)
    np.testing.assert_array_equal(np.asarray(up._neighbours), drive(_neighbours.neighbour_lists(up.descriptors, K, ann=up.ann)))
    # dropping the approximate index: the lists are computed again, exactly
    spy["lists"] = 0
    (sample_copy / "copy-of-9.jpg").unlink()
    run(update_index(Index.load(out), ann="no"))
    up = Index.load(out)
    assert up.ann is None and spy["lists"] == 1
    np.testing.assert_array_equal(np.asarray(up._neighbours), drive(_neighbours.neighbour_lists(up.descriptors, K)))


def test_cancelled_update_of_the_lists_leaves_the_old_index(sample_copy, tmp_path, monkeypatch):
    monkeypatch.setattr(index_mod, "K_MAX", K)
    monkeypatch.setattr(store_mod, "K_MAX", K)
    monkeypatch.setattr(_neighbours, "_RECOMPUTE_SHARE", 1.0)
    monkeypatch.setattr(_neighbours, "_BLOCK_ROWS", 8)  # several progress records
    out = tmp_path / "idx"
    _build(sample_copy, out)
    names = sorted(p.name for p in out.iterdir())
    manifest = (out / MANIFEST).read_bytes()
    lists = np.asarray(Index.load(out)._neighbours).copy()
    _edit(sample_copy)
    gen = update_index(Index.load(out))
    seen = 0
    for p in gen:
        if p.stage == _neighbours.NEIGHBOURS_STAGE:
            seen += 1
            if seen == 3:
                gen.close()  # cancel in the middle of the neighbour lists
                break
    assert seen == 3
    assert sorted(p.name for p in out.iterdir()) == names and (out / MANIFEST).read_bytes() == manifest
    again = Index.load(out)
    np.testing.assert_array_equal(np.asarray(again._neighbours), lists)
    assert "copy-of-9.jpg" not in [it.path for it in again.items]
