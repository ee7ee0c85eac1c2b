"""Search: top-k by dot product, ties, per-instance aggregation, open-set verdict."""

import numpy as np
import pytest

from museum_search.core.backbones import BackboneMeta
from museum_search.core.index import Index, Item
from museum_search.core.search import full_ranking, score_matrix, search, top_k


def _index(desc, labels):
    meta = BackboneMeta("test", "none", "gem", "longest_side", 64, (1.0,), 3.0, desc.shape[1],
                        (0.5,) * 3, (0.5,) * 3)
    items = [Item(f"{i}.jpg", 1, 0.0, lab, {"title": f"t{i}"}) for i, lab in enumerate(labels)]
    return Index("/coll", meta, items, desc.astype(np.float32))


def test_top_k_matches_full_sort_with_ties_by_row():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, (20, 50)).astype(np.float32)  # many ties
    for k in (1, 3, 10, 50, 80):
        got = top_k(scores, k)
        full = full_ranking(scores)
        for q in range(20):
            np.testing.assert_array_equal(got[q], full[q, : min(k, 50)])
            # ties broken by lower row first
            s = scores[q, got[q]]
            assert np.all(np.diff(s) <= 0)


def test_per_instance_keeps_best_of_each_instance():
    scores = np.array([[0.9, 0.8, 0.95, 0.1, 0.7]])
    labels = np.array(["a", "a", "b", "c", "b"], dtype=object)
    assert top_k(scores, 3, labels, per_instance=True)[0].tolist() == [2, 0, 3]
    with pytest.raises(ValueError):
        top_k(scores, 3, per_instance=True)


def test_search_results_carry_everything():
    desc = np.eye(4)
    idx = _index(desc, ["x", "y", "y", "z"])
    q = np.array([[0.0, 0.6, 0.8, 0.0]])
    res = search(idx, q, k=2)[0]
    assert [r.row for r in res] == [2, 1]
    assert [r.rank for r in res] == [1, 2]
    assert res[0].score == pytest.approx(0.8) and res[0].instance == "y"
    assert res[0].metadata == {"title": "t2"} and res[0].path == "2.jpg"
    d = res[0].to_dict()
    assert set(d) == {"rank", "score", "path", "instance", "metadata"}
    np.testing.assert_allclose(score_matrix(idx, q), q @ desc.T)


def test_batch_equals_single_queries():
    rng = np.random.default_rng(3)
    desc = rng.normal(size=(100, 16))
    desc /= np.linalg.norm(desc, axis=1, keepdims=True)
    idx = _index(desc, [str(i % 7) for i in range(100)])
    q = rng.normal(size=(5, 16))
    batch = search(idx, q, k=5)
    for i in range(5):
        assert [r.row for r in search(idx, q[i], k=5)[0]] == [r.row for r in batch[i]]
