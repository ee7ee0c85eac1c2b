"""Neighbour lists of large indexes by a k-NN graph method (issue 24, items 3 and 5): balanced
cells (``core/knn.py``), the candidates ranked by the exact arithmetic and tie rule; updates merge
new references exactly. The oracle is the dense definition (``dense_lists``: gallery ranks) and an
exact ranking written again here."""

from __future__ import annotations

import numpy as np
import pytest
from test_ann import clustered, dense_lists
from test_update_neighbours import apply, planted

from museum_search.core.index import _neighbours
from museum_search.core.index._knn import KnnParams, knn_candidates
from museum_search.core.progress import drive
from museum_search.core.ranking import neg_distance, order


class Sized:
    """The approximate index as the lists see it: its size only."""

    def __init__(self, d):
        self.ntotal = len(d)


def objects(count: int, views: int, dim: int, seed: int = 0) -> np.ndarray:
    """Random object centres (no themes), ``views`` noisy views each (cosine ~0.73 between views)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((count, 1, dim))
    c /= np.linalg.norm(c, axis=2, keepdims=True)
    noise = rng.standard_normal((count, views, dim))
    noise /= np.linalg.norm(noise, axis=2, keepdims=True)
    x = (c + 0.6 * noise).reshape(-1, dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def exact_among(d: np.ndarray, row: int, cands, k: int) -> list[int]:
    """The ``k`` best of ``cands`` for ``row`` by the definition (float64 dot rounded to float32,
    -D, ties by lower row)."""
    cands = np.array(sorted(set(int(c) for c in cands) - {row}))
    dots = (np.asarray(d[cands], np.float64) @ np.asarray(d[row], np.float64)).astype(np.float32)
    return cands[order(neg_distance(dots[None, :]), k)[0]].tolist()


def other_views_recall(lists: np.ndarray, views: int, first: int = 0) -> float:
    """The share of the other views of each row's object in its list (rows ``first``, ``first + 1``...)."""
    rows = first + np.arange(len(lists))
    same = (lists // views) == (rows // views)[:, None]
    return float(same.sum() / (len(lists) * (views - 1)))


@pytest.mark.parametrize("seed", [0, 1])
def test_lists_are_exact_wherever_the_candidates_hold_the_true_neighbours(seed):
    d = planted(seed, objects=300, views=10, dim=48)  # 3,000 rows with exact copies and near-duplicates
    k = 20
    params = KnnParams(probes=3, seed=seed)  # few probes: some rows miss neighbours
    exact = dense_lists(d, k)
    got = drive(_neighbours.neighbour_lists(d, k, ann=Sized(d), knn=params))
    _, idx = drive(knn_candidates(d, _neighbours._kept(k, len(d) - 1), params))
    held = np.array([set(e.tolist()) <= set(c.tolist()) for e, c in zip(exact, idx)])
    assert 0.2 < held.mean() < 1.0  # the test sees both kinds of rows
    np.testing.assert_array_equal(got[held], exact[held])
    assert np.all(got != np.arange(len(d))[:, None])  # never the row itself
    assert all(len(set(r.tolist())) == k for r in got)  # no row twice
    # each list is the exact ranking of what it holds: in order, ties by lower row
    for i in np.flatnonzero(~held)[:50]:
        assert got[i].tolist() == exact_among(d, i, got[i], k)


def test_candidates_score_each_pair_once_and_exclude_the_row():
    d = clustered(200, 10, 32, seed=4)
    vals, idx = drive(knn_candidates(d, 30, KnnParams(probes=4)))
    assert np.all(idx != np.arange(len(d))[:, None])
    for v, i in zip(vals, idx):
        ok = i >= 0
        assert len(set(i[ok].tolist())) == ok.sum()  # no duplicates
        assert np.all(np.diff(v[ok]) <= 0)  # best first
    # the scores are the rows' float32 dot products
    x = np.asarray(d, np.float32)
    r = np.arange(len(d))[:, None].repeat(30, 1)
    ok = idx >= 0
    np.testing.assert_allclose(vals[ok], np.einsum("ij,ij->i", x[r[ok]], x[idx[ok]]), atol=1e-5)


def test_other_views_of_random_object_centres_are_found():
    """Objects with random centres (no themes: the data where the old IVF regions found 75 %)."""
    views = 10
    d = objects(800, views, 96, seed=2)  # 8,000 rows
    lists = drive(_neighbours.neighbour_lists(d, 32, ann=Sized(d)))
    assert other_views_recall(lists, views) >= 0.98


def test_cells_are_balanced_on_data_grouped_in_themes():
    from museum_search.core.index import _knn as knn

    d = clustered(1000, 10, 64, seed=5, per_group=100)  # 10,000 rows in 10 tight themes
    params = KnnParams()
    cent = knn._centroids(d, params.cells(len(d)), params)
    cells = np.argmax(np.asarray(d, np.float32) @ cent.T, axis=1)
    sizes = np.bincount(cells, minlength=len(cent))
    assert sizes.max() <= 8 * len(d) / len(cent), (sizes.max(), len(d) / len(cent))


def test_tiny_and_small_cells_fall_back_to_exact():
    d = clustered(50, 10, 32, seed=8)
    # one probe: cells of at most 2 x 24 rows (the split), fewer than k = 60 others: done exactly
    got = drive(_neighbours.neighbour_lists(d, 60, ann=Sized(d), knn=KnnParams(probes=1)))
    np.testing.assert_array_equal(got, dense_lists(d, 60))
    d = clustered(40, 5, 32, seed=9)
    d[50:90] = d[50]  # 40 identical references: kept candidates all tied, scanned again
    got = drive(_neighbours.neighbour_lists(d, 10, ann=Sized(d)))
    np.testing.assert_array_equal(got[50:90], dense_lists(d, 10)[50:90])  # the 10 lowest rows of the 39 others


def test_approximate_update_merges_new_references_exactly(monkeypatch):
    """With an approximate index: new rows and rows that lost a neighbour get their exact lists, a
    kept row its old list merged with every new reference that belongs in it (exact ranking)."""
    d = planted(3, objects=200, views=10, dim=32)
    k = 12
    old = drive(_neighbours.neighbour_lists(d, k, ann=Sized(d), knn=KnnParams(probes=2)))  # inexact
    assert not np.array_equal(old, dense_lists(d, k))
    rng = np.random.default_rng(0)
    removed = rng.choice(len(d), 15, replace=False)
    new = np.concatenate([np.asarray(d[[11, 300]]), clustered(10, 5, d.shape[1], seed=6)])
    after, m = apply(d, removed, new)
    got = drive(_neighbours.update_neighbour_lists(old, m, after, k, ann=Sized(after), old_ann=Sized(d)))
    exact = dense_lists(after, k)
    kept_old = np.flatnonzero(m >= 0)
    new_rows = np.setdiff1d(np.arange(len(after)), m[kept_old])
    renumbered = m[old[kept_old]]
    lost = kept_old[(renumbered < 0).any(axis=1)]
    redo = np.union1d(m[lost], new_rows)
    np.testing.assert_array_equal(got[redo], exact[redo])
    for o in np.setdiff1d(kept_old, lost):
        row = int(m[o])
        assert got[row].tolist() == exact_among(after, row, np.concatenate([renumbered[kept_old.searchsorted(o)],
                                                                            new_rows]), k)


def test_approximate_append_keeps_recall():
    """Appending objects to an approximate index: the other views are found as well as before."""
    views = 10
    d = objects(700, views, 64, seed=7)
    base, extra = d[:6_000], d[6_000:]
    old = drive(_neighbours.neighbour_lists(base, 32, ann=Sized(base)))
    after, m = apply(base, [], extra)
    got = drive(_neighbours.update_neighbour_lists(old, m, after, 32, ann=Sized(after), old_ann=Sized(base)))
    assert other_views_recall(got, views) >= 0.98
    assert other_views_recall(got[6_000:], views, 6_000) == 1.0  # the new rows: exact


def test_a_large_approximate_update_computes_the_lists_again(monkeypatch):
    d = clustered(100, 10, 32, seed=1)
    old = drive(_neighbours.neighbour_lists(d, 10, ann=Sized(d)))
    monkeypatch.setattr(_neighbours, "_APPROX_REDO_MAX", 5)
    calls = []
    real = _neighbours.neighbour_lists

    def spy(*a, **kw):
        calls.append(kw.get("ann"))
        return real(*a, **kw)

    monkeypatch.setattr(_neighbours, "neighbour_lists", spy)
    after, m = apply(d, [], clustered(3, 3, 32, seed=2))
    got = drive(_neighbours.update_neighbour_lists(old, m, after, 10, ann=Sized(after), old_ann=Sized(d)))
    assert len(calls) == 1 and calls[0] is not None  # from scratch, with the k-NN graph method
    assert got.shape == (len(after), 10)
