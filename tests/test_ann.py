"""core/index (_exact, _approximate, _neighbours): exact scores of float16 memory maps, the IVF-PQ index with exact re-scoring, and
neighbour lists that reproduce ICFRR's dense gallery ranks bit for bit."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from oracles import gallery_ranks

from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index import _approximate, _exact, _modes, _neighbours
from museum_search.core.index._knn import KnnParams, knn_candidates
from museum_search.core.progress import Progress, drive
from museum_search.core.ranking import order


def clustered(objects: int, views: int, dim: int, seed: int = 0, dtype=np.float16, per_group: int = 10) -> np.ndarray:
    """Unit vectors: objects of ``views`` noisy views, objects in groups of related ones."""
    rng = np.random.default_rng(seed)
    groups = rng.standard_normal((-(-objects // per_group), dim)) / np.sqrt(dim)
    obj = 1.5 * groups[np.arange(objects) // per_group] + rng.standard_normal((objects, dim)) / np.sqrt(dim)
    obj /= np.linalg.norm(obj, axis=1, keepdims=True)
    noise = rng.uniform(0.5, 1.5, size=(objects, 1))
    x = np.repeat(obj, views, 0) + np.repeat(noise, views, 0) * rng.standard_normal((objects * views, dim)) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


def queries_near(d: np.ndarray, count: int, seed: int = 1) -> np.ndarray:
    """New noisy views of random references (what a visitor's photo is)."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(d), count, replace=False)
    q = np.asarray(d[rows], np.float32) + rng.uniform(0.5, 1.5, (count, 1)) * rng.standard_normal(
        (count, d.shape[1])) / np.sqrt(d.shape[1])
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def dense_lists(d: np.ndarray, k: int) -> np.ndarray:
    """The references at ranks 1..k of the dense gallery ranks (the reference implementation)."""
    return np.argsort(gallery_ranks(d), axis=1, kind="stable")[:, :k].astype(np.int32)


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> np.ndarray:
    """3,000 float16 references (300 objects x 10 views, 128-d), memory-mapped from a .npy."""
    path = tmp_path_factory.mktemp("ann") / "descriptors.npy"
    np.save(path, clustered(300, 10, 128))
    return np.load(path, mmap_mode="r")


@pytest.fixture(scope="module")
def built(refs) -> _approximate.AnnIndex:
    return drive(_approximate.AnnIndex.build(refs))


# ---- search modes ----------------------------------------------------------------------------


def test_resolve_mode():
    big = _modes.AUTO_MIN_REFERENCES
    assert _modes.resolve_mode("exact", big * 10, True) == "exact"
    assert _modes.resolve_mode("ann", 10, True) == "ann"
    assert _modes.resolve_mode("auto", big, True) == "ann"
    assert _modes.resolve_mode("auto", big - 1, True) == "exact"
    assert _modes.resolve_mode("auto", big * 10, False) == "exact"
    with pytest.raises(MuseumSearchError, match="unknown search mode 'fast'"):
        _modes.resolve_mode("fast", 10, True)
    with pytest.raises(MuseumSearchError, match="no approximate.*--search exact.*update"):
        _modes.resolve_mode("ann", big, False)


# ---- exact scores ----------------------------------------------------------------------------


def test_exact_scores_equal_float32_without_a_whole_copy(tmp_path):
    n, dim = 20_000, 256
    path = tmp_path / "d.npy"
    np.save(path, clustered(2000, 10, dim, seed=3))
    d = np.load(path, mmap_mode="r")
    q = queries_near(d, 3)
    expected = q @ np.asarray(d, dtype=np.float32).T
    tracemalloc.start()
    try:
        got = _exact.exact_scores(d, q, chunk_rows=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.shape == (3, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # the output (3 x N) and a few chunks of 1,000 rows, far from N x D float32 (20 MB)
    assert peak < n * dim * 4 / 4, peak
    # default chunking, a single query as a vector, and float32 descriptors as they are
    np.testing.assert_allclose(_exact.exact_scores(d, q[0]), expected[:1], rtol=0, atol=1e-6)
    d32 = np.asarray(d, np.float32)
    np.testing.assert_allclose(_exact.exact_scores(d32, q), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="255-d"):
        _exact.exact_scores(d, q[:, :255])


def test_rows_scores(refs):
    q = queries_near(refs, 4)
    full = q @ np.asarray(refs, np.float32).T
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(refs), size=(4, 50))
    rows[0, :5] = rows[0, 5]  # a row asked for several times
    rows[1, 10:] = -1  # no candidate
    rows[3, :] = -1
    got = _exact.rows_scores(refs, q, rows)
    assert got.shape == (4, 50) and got.dtype == np.float32
    valid = rows >= 0
    np.testing.assert_allclose(got[valid], np.take_along_axis(full, np.where(valid, rows, 0), 1)[valid],
                               rtol=0, atol=1e-6)
    assert np.all(np.isneginf(got[~valid]))
    with pytest.raises(IndexError):
        _exact.rows_scores(refs, q[:1], np.array([[len(refs)]]))


# ---- the approximate index -------------------------------------------------------------------


def test_params_round_trip_through_json():
    p = _approximate.choose_params(1_000_000, 1280)
    assert p.m == 80 and p.nbits == 8 and p.nlist == 1024 and p.train_size <= 65_536
    assert _approximate.AnnParams.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(IndexFormatError, match="rebuild"):
        _approximate.AnnParams.from_dict({"m": 8})
    with pytest.raises(IndexFormatError, match="rebuild"):
        _approximate.AnnParams.from_dict(None)
    small = _approximate.choose_params(100, 100)
    assert small.nlist <= 100 // 8 and 2 ** small.nbits <= 100


def test_ann_search_recall_and_ranking_rule(refs, built):
    assert built.ntotal == len(refs) and built.dim == refs.shape[1]
    q = queries_near(refs, 100)
    exact = _exact.exact_scores(refs, q)
    truth = order(exact, 10)
    rows, scores = built.search(refs, q, 10)
    assert rows.shape == (100, 10) and rows.dtype == np.int64 and scores.dtype == np.float32
    recall = np.mean([len(set(rows[i]) & set(truth[i])) / 10 for i in range(len(q))])
    assert recall >= 0.95, recall
    # the scores are the exact ones, and the order is the ranking rule's on them
    np.testing.assert_allclose(scores, np.take_along_axis(exact, rows, 1), rtol=0, atol=1e-6)
    assert np.all(np.diff(scores, axis=1) <= 0)
    cand = built.candidates(q)
    assert cand.shape == (100, built.params.shortlist) and cand.dtype == np.int64
    # a short list (100 candidates, 3% of the references) re-scored exactly still finds them,
    # where the approximate (PQ) order alone does not
    params = _approximate.AnnParams.from_dict({**built.params.to_dict(), "shortlist": 100})
    short = _approximate.AnnIndex.from_bytes(built.to_bytes(), params)
    rows, _ = short.search(refs, q, 10)
    rescored = np.mean([len(set(rows[i]) & set(truth[i])) / 10 for i in range(len(q))])
    pq_only = np.mean([len(set(c) & set(t)) / 10 for c, t in zip(short.candidates(q, 10), truth)])
    assert rescored >= 0.95 and pq_only < rescored, (rescored, pq_only)


def test_ann_search_equals_exact_when_the_shortlist_holds_everything(tmp_path):
    d = clustered(50, 10, 32, seed=5)
    d[7] = d[3]  # exact duplicates: equal scores, the lower row first
    d[400] = d[3]
    params = _approximate.choose_params(len(d), 32)
    params.nprobe, params.shortlist = params.nlist, len(d)
    index = drive(_approximate.AnnIndex.build(d, params))
    q = np.concatenate([d[3:4].astype(np.float32), queries_near(d, 5)])
    rows, scores = index.search(d, q, 12)
    expected = order(_exact.exact_scores(d, q), 12)
    np.testing.assert_array_equal(rows, expected)
    assert list(rows[0, :3]) == [3, 7, 400]
    # more than the index holds: padded
    rows, scores = index.search(d, q[:1], len(d) + 3)
    assert list(rows[0, -3:]) == [-1, -1, -1] and np.all(np.isneginf(scores[0, -3:]))


def test_round_trip_through_a_file(refs, built, tmp_path):
    q = queries_near(refs, 20, seed=7)
    path = tmp_path / "ann.faiss"
    path.write_bytes(built.to_bytes())
    params = _approximate.AnnParams.from_dict(built.params.to_dict())
    for again in (_approximate.AnnIndex.read(path, params), _approximate.AnnIndex.from_bytes(path.read_bytes(), params)):
        assert again.ntotal == built.ntotal and again.dim == built.dim
        np.testing.assert_array_equal(again.candidates(q), built.candidates(q))
        np.testing.assert_array_equal(again.search(refs, q, 10)[0], built.search(refs, q, 10)[0])
    with pytest.raises(IndexFormatError, match="rebuild"):
        bad = tmp_path / "bad.faiss"
        bad.write_bytes(b"not an index")
        _approximate.AnnIndex.read(bad, params)


def test_dimension_not_a_multiple_of_the_sub_quantizers():
    d = clustered(100, 10, 100, seed=2)  # m = 6: zero padded to 102
    params = _approximate.choose_params(len(d), 100)
    assert 100 % params.m != 0
    index = drive(_approximate.AnnIndex.build(d, params))
    q = queries_near(d, 10)
    truth = order(_exact.exact_scores(d, q), 5)
    rows, _ = index.search(d, q, 5)
    assert np.mean([len(set(rows[i]) & set(truth[i])) / 5 for i in range(10)]) >= 0.9
    again = _approximate.AnnIndex.from_bytes(index.to_bytes(), params)
    np.testing.assert_array_equal(again.candidates(q), index.candidates(q))


def _lists_of(index) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each inverted list's (ids, codes) of a faiss IVF index."""
    faiss = _exact._faiss()
    ivf = faiss.extract_index_ivf(index)
    inv, cs, out = ivf.invlists, int(ivf.code_size), []
    for c in range(int(ivf.nlist)):
        size = int(inv.list_size(c))
        ids = faiss.rev_swig_ptr(inv.get_ids(c), size).copy() if size else np.empty(0, np.int64)
        codes = faiss.rev_swig_ptr(inv.get_codes(c), size * cs).copy() if size else np.empty(0, np.uint8)
        out.append((ids, codes))
    return out


@pytest.mark.parametrize("dim, m", [(64, 8), (100, 6)])  # 100 = 6 x 17 - 2: the zero-padding wrapper
def test_fast_add_gives_faiss_own_lists_and_codes(dim, m):
    faiss = _exact._faiss()
    d = clustered(400, 10, dim, seed=3, dtype=np.float32)
    params = _approximate.AnnParams(nlist=32, m=m, nbits=8, train_size=4000)
    trained = _approximate.AnnIndex._empty(dim, params)
    trained.train(d)
    blob = faiss.serialize_index(trained)
    ours, theirs = faiss.deserialize_index(blob), faiss.deserialize_index(blob)
    assert _approximate._add_rows(ours, d[:2500])  # encoded here (not by faiss), numbered from 0, then on
    assert _approximate._add_rows(ours, d[2500:])
    theirs.add(d[:2500])
    theirs.add(d[2500:])
    ids = np.arange(7000, 7000 + 600, dtype=np.int64)[::-1].copy()  # with ids, in any order
    assert _approximate._add_rows(ours, d[:600], ids)
    theirs.add_with_ids(d[:600], ids)
    assert ours.ntotal == theirs.ntotal == 4600
    a, b = _lists_of(ours), _lists_of(theirs)
    assert sum(len(i) for i, _ in a) == 4600 and sum(len(i) > 0 for i, _ in a) > 16
    for (ia, ca), (ib, cb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)  # the same rows, in the same order, in each list
        np.testing.assert_array_equal(ca, cb)  # and the same PQ codes
    q = queries_near(d, 20)
    np.testing.assert_array_equal(ours.search(q, 50)[1], theirs.search(q, 50)[1])


def test_build_reports_its_stages_and_cancels(refs):
    stages = []
    gen = _approximate.AnnIndex.build(refs)
    for p in gen:
        assert isinstance(p, Progress)
        stages.append(p.stage)
        if p.stage == _approximate.ADD_STAGE and p.done > 0:
            gen.close()  # cancel in the middle of adding
            break
    assert stages[0] == _approximate.TRAIN_STAGE and _approximate.ADD_STAGE in stages
    with pytest.raises(StopIteration):
        next(gen)
    gen = _approximate.AnnIndex.build(refs)
    next(gen)
    gen.close()  # cancel before the training
    with pytest.raises(StopIteration):
        next(gen)


# ---- neighbour lists -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_neighbour_lists_are_the_dense_gallery_ranks(dtype, monkeypatch):
    d = clustered(60, 8, 48, seed=11, dtype=dtype)
    d[10] = d[11]  # duplicates tie exactly: ties by lower row
    d[12] = d[11]
    d[300] = d[11]
    d[301] = d[300]
    monkeypatch.setattr(_neighbours, "_BLOCK_ROWS", 100)  # several blocks: the symmetric pass, partly full blocks
    expected = dense_lists(d, len(d) - 1)
    for k in (1, 5, 20, 40):
        got = drive(_neighbours.neighbour_lists(d, k))
        assert got.shape == (len(d), k) and got.dtype == np.int32
        np.testing.assert_array_equal(got, expected[:, :k])
    assert list(drive(_neighbours.neighbour_lists(d, 3))[11]) == [10, 12, 300]
    # k larger than the gallery: every other reference
    small = d[:7]
    np.testing.assert_array_equal(drive(_neighbours.neighbour_lists(small, 50)), dense_lists(small, 6))
    assert drive(_neighbours.neighbour_lists(d[:1], 5)).shape == (1, 0)


def test_neighbour_lists_with_many_identical_references():
    """A group of identical copies longer than the kept list: those rows are scanned again."""
    d = clustered(40, 5, 32, seed=4)
    d[50:90] = d[50]  # 40 identical references, k + extra = 18 kept
    got = drive(_neighbours.neighbour_lists(d, 10))
    np.testing.assert_array_equal(got, dense_lists(d, 10))
    assert list(got[50]) == list(range(51, 61)) and list(got[70]) == [50, *range(51, 60)]


def test_neighbour_lists_report_progress():
    d = clustered(30, 10, 16, seed=6)
    records = list(_records(_neighbours.neighbour_lists(d, 5)))
    assert records and all(r.stage == _neighbours.NEIGHBOURS_STAGE and r.total == len(d) for r in records)


def _records(gen):
    while True:
        try:
            yield next(gen)
        except StopIteration:
            return


def test_neighbour_lists_from_the_approximate_index(refs, built):
    k = 20
    exact = drive(_neighbours.neighbour_lists(refs, k))
    approx = drive(_neighbours.neighbour_lists(refs, k, ann=built))
    assert approx.shape == exact.shape and approx.dtype == np.int32
    overlap = np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact)])
    assert overlap >= 0.95, overlap
    assert np.all(approx != np.arange(len(refs))[:, None])  # never the reference itself
    # a reference whose exact neighbours are all among its k-NN graph candidates gets the exact list
    _, idx = drive(knn_candidates(refs, _neighbours._kept(k, len(refs) - 1)))
    inside = [r for r in range(len(refs)) if set(idx[r].tolist()).issuperset(exact[r].tolist())]
    assert len(inside) >= 0.5 * len(refs)
    np.testing.assert_array_equal(approx[inside], exact[inside])
    with pytest.raises(MuseumSearchError, match="rebuild"):
        drive(_neighbours.neighbour_lists(refs[:100], 5, ann=built))


def test_neighbour_lists_with_cells_smaller_than_k():
    """One probe, cells of at most 48 references: every reference has fewer than k others, done exactly
    (more cases in test_knn.py)."""
    d = clustered(50, 10, 32, seed=8)
    index = drive(_approximate.AnnIndex.build(d))
    got = drive(_neighbours.neighbour_lists(d, 60, ann=index, knn=KnnParams(probes=1)))
    np.testing.assert_array_equal(got, dense_lists(d, 60))


def test_tiny_indexes():
    d = clustered(1, 3, 16, seed=1)
    with pytest.raises(MuseumSearchError, match="at least 2"):
        drive(_approximate.AnnIndex.build(d[:1]))
    index = drive(_approximate.AnnIndex.build(d))
    rows, _ = index.search(d, d[:1], 5)
    assert rows[0, 0] == 0 and sorted(rows[0, :3].tolist()) == [0, 1, 2] and list(rows[0, 3:]) == [-1, -1]
    np.testing.assert_array_equal(drive(_neighbours.neighbour_lists(d, 5, ann=index)), dense_lists(d, 2))


# ---- tuning: held-out queries -------------------------------------------------------------------


def test_exact_top_leaves_each_querys_own_row_out(refs):
    src = np.array([0, 5, 1234, len(refs) - 1])
    q = np.asarray(refs[src], np.float32)  # each query is its own row: the best hit, left out
    got = drive(_exact._exact_top(refs, q, 10, src, lambda i: Progress(i, 1)))
    s = q.astype(np.float64) @ np.asarray(refs, np.float64).T
    s[np.arange(len(src)), src] = -np.inf
    expected = np.argsort(-s, axis=1, kind="stable")[:, :10]
    assert got.dtype == np.int64 and not np.any(got == src[:, None])
    for g, e in zip(got, expected):  # float32 against float64 products: the same set of ten
        assert set(g.tolist()) == set(e.tolist())


def _measured(index, d, nprobe, shortlist, held_out=True) -> float:
    """The tuning's recall@10 at these settings, computed again here: its queries (the same seeded
    sample and noise), float64 truth; ``held_out``: the source row left out of truth and result."""
    p = index.params
    rng = np.random.default_rng(p.seed + 2)
    src = np.sort(rng.choice(len(d), 200, replace=False))
    q = _approximate._noisy_views(np.asarray(d[src], np.float32), rng, _approximate.TUNE_COSINE)
    s = q.astype(np.float64) @ np.asarray(d, np.float64).T
    if held_out:
        s[np.arange(len(src)), src] = -np.inf
    truth = np.argsort(-s, axis=1, kind="stable")[:, :10]
    again = _approximate.AnnIndex.from_bytes(index.to_bytes(), _approximate.AnnParams.from_dict(
        {**p.to_dict(), "nprobe": nprobe, "shortlist": shortlist}))
    rows, _ = again.search(d, q, 11)
    got = [r[r != s_][:10] if held_out else r[:10] for r, s_ in zip(rows, src)]
    return float(np.mean([len(set(g.tolist()) & set(t.tolist())) / 10 for g, t in zip(got, truth)]))


def test_tuning_measures_held_out_queries(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, clustered(100, 10, 64, seed=21))
    d = np.load(path, mmap_mode="r")
    params = _approximate.choose_params(len(d), 64)
    params.nprobe, params.shortlist = 1, 10
    index = drive(_approximate.AnnIndex.build(d, params, tune=True))
    t = index.params.tuning
    assert t.held_out and t.references == len(d) and t.queries == 200 and t.meets_target
    assert "200 held-out noisy references, leave-one-out, on 1,000 references" in t.summary()
    # each step's recall is the leave-one-out one, computed again independently
    for nprobe, shortlist, recall in (t.steps[0], t.steps[-1]):
        assert abs(_measured(index, d, nprobe, shortlist) - recall) <= 0.01, (nprobe, shortlist, recall)
    # counting the source reference (always found: the best hit) would have said more
    first = t.steps[0]
    assert _measured(index, d, first[0], first[1], held_out=False) > first[2] + 0.05
    # a manifest written before: no field, not held out, still loads
    old = {k: v for k, v in t.to_dict().items() if k not in ("held_out", "references")}
    back = _approximate.AnnTuning.from_dict(old)
    assert not back.held_out and back.references == 0 and "noisy references)" in back.summary()
