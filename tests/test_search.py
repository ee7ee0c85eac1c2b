"""Search and the one ranking: scores by dot product, top-k and full rankings with ties by row,
per-instance aggregation, re-ranking after a change, merged top-k blocks."""

import numpy as np
import pytest

from museum_search.core.answer._search import results_for, score_matrix
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta
from museum_search.core.ranking import grouped_order, merge_top, order, per_instance, reorder


def _index(desc, labels):
    meta = BackboneMeta("test", "none", "gem", "longest_side", 64, (1.0,), 3.0, desc.shape[1],
                        (0.5,) * 3, (0.5,) * 3)
    items = [Item(f"{i}.jpg", 1, 0.0, lab, {"title": f"t{i}"}) for i, lab in enumerate(labels)]
    return Index("/coll", meta, items, desc.astype(np.float32))


def test_top_k_matches_full_sort_with_ties_by_row():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, (20, 50)).astype(np.float32)  # many ties
    full = order(scores)
    np.testing.assert_array_equal(full, np.argsort(-scores, axis=1, kind="stable"))
    for k in (0, 1, 3, 10, 50, 80):
        got = order(scores, k)
        np.testing.assert_array_equal(got, full[:, : min(k, 50)])
        for q in range(20):
            np.testing.assert_array_equal(order(scores[q], k), got[q])  # one query: (k,)
            s = scores[q, got[q]]
            assert np.all(np.diff(s) <= 0)


def test_per_instance_keeps_best_of_each_instance():
    scores = np.array([0.9, 0.8, 0.95, 0.1, 0.7])
    labels = np.array(["a", "a", "b", "c", "b"], dtype=object)
    assert per_instance(scores, labels, 3).tolist() == [2, 0, 3]
    assert per_instance(scores, labels).tolist() == [2, 0, 3]
    assert per_instance(scores, labels, 1).tolist() == [2]
    with pytest.raises(ValueError):
        per_instance(scores[None], labels, 3)


def test_reorder_finds_the_changed_rows_and_ranks_them_as_order_does():
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 8, (30, 60)).astype(np.float32) / 7  # many ties
    previous = order(scores)
    new = scores.copy()
    new[::3] += rng.integers(0, 3, (10, 60)).astype(np.float32) / 7  # every third row moves (or not)
    new[1] = scores[1]
    changed, orders = reorder(new, previous)
    expected = order(new)
    assert changed.tolist() == [not np.array_equal(expected[i], previous[i]) for i in range(30)]
    assert not changed[1] and changed.any()
    np.testing.assert_array_equal(orders, expected[changed])
    changed2, none = reorder(new, previous, sort=False)
    np.testing.assert_array_equal(changed2, changed)
    assert none.shape == (0, 60)
    same, nothing = reorder(scores, previous)
    assert not same.any() and nothing.shape == (0, 60)


def test_merge_top_keeps_the_best_of_the_blocks():
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((6, 300)).astype(np.float32)  # distinct scores
    kk = 9
    vals = np.full((6, kk), -np.inf, np.float32)
    idx = np.full((6, kk), -1, np.int32)
    merge_top(vals, idx, scores[:, :100], 0)  # columns 0..99 (an int start)
    cols = np.arange(100, 300)
    merge_top(vals, idx, scores[:, 100:], cols)  # the others (an array of ids)
    expected = order(scores, kk)
    np.testing.assert_array_equal(idx, expected)
    np.testing.assert_array_equal(vals, np.take_along_axis(scores, expected, axis=1))


def test_grouped_order_is_order_within_each_group():
    rng = np.random.default_rng(9)
    groups = np.sort(rng.integers(0, 5, 80))
    scores = rng.integers(0, 4, 80).astype(np.float32)  # many ties
    ids = rng.permutation(80)
    ranked = grouped_order(groups, scores, ids)
    expected = sorted(range(80), key=lambda i: (groups[i], -scores[i], ids[i]))
    assert ranked.tolist() == expected


def test_results_carry_everything():
    desc = np.eye(4)
    idx = _index(desc, ["x", "y", "y", "z"])
    q = np.array([[0.0, 0.6, 0.8, 0.0]])
    scores = score_matrix(idx, q)
    res = results_for(idx, order(scores[0], 2), scores[0])
    assert [r.row for r in res] == [2, 1]
    assert [r.rank for r in res] == [1, 2]
    assert res[0].score == pytest.approx(0.8) and res[0].instance == "y"
    assert res[0].cosine == res[0].score and res[0].inliers is None  # bare scores: the cosines, not verified
    assert res[0].metadata == {"title": "t2"} and res[0].path == "2.jpg"
    d = res[0].to_dict()
    assert set(d) == {"rank", "score", "cosine", "inliers", "path", "instance", "metadata"}
    np.testing.assert_allclose(scores, q @ desc.T)
    # re-ranked scores with their cosines apart
    reranked = scores[0] * 2
    res = results_for(idx, order(reranked, 2), reranked, cosine=scores[0])
    assert res[0].score == pytest.approx(1.6) and res[0].cosine == pytest.approx(0.8)


def test_one_result_class_in_core():
    """The pipeline's answers and bare search results are one kind of result: the same fields, in
    the same order, and the same JSON."""
    from dataclasses import fields

    from museum_search.core.answer import _pipeline as query
    from museum_search.core.answer import _search as search

    assert [f.name for f in fields(search.Result)] == [f.name for f in fields(query.Result)]
    args = (1, 2, 0.5, 0.4, 12, "a.jpg", "/c/a.jpg", "x", {"title": "t"})
    assert search.Result(*args).to_dict() == query.Result(*args).to_dict()


def test_batch_equals_single_queries():
    rng = np.random.default_rng(3)
    desc = rng.normal(size=(100, 16))
    desc /= np.linalg.norm(desc, axis=1, keepdims=True)
    idx = _index(desc, [str(i % 7) for i in range(100)])
    q = rng.normal(size=(5, 16))
    batch = order(score_matrix(idx, q), 5)
    for i in range(5):
        np.testing.assert_array_equal(order(score_matrix(idx, q[i])[0], 5), batch[i])


def test_only_ranking_sorts_on_its_keys_and_ann_does_not_import_rerank():
    """The ranking's private helpers stay in ranking.py; the approximate search needs no re-ranker."""
    import ast
    import pathlib

    import museum_search

    root = pathlib.Path(museum_search.__file__).parent
    # the search modules of the index package (formerly ann.py)
    search_modules = {"_modes.py", "_exact.py", "_approximate.py", "_neighbours.py"}
    assert all((root / "core" / "index" / name).is_file() for name in search_modules)
    for path in root.rglob("*.py"):
        if path.name == "ranking.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("ranking"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path} imports {private} from ranking"
            if path.parent.name == "index" and path.name in search_modules and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
                assert not any("rerank" in n for n in names), f"{path.name} imports {names}"
