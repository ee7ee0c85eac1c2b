"""Issue 24 (items 1, 2, 4): float16 descriptors scored by bit arithmetic (same rankings as a float64
reference, memory maps left as they are), the approximate search ranking only its candidates, and the
approximate index tuned on its own data at build time (recall and speed in the manifest, ``auto``
and ``info`` following them)."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from museum_search.cli import main as cli_main
from museum_search.core.answer import _search as search_module
from museum_search.core.answer._search import ranking_scores, score_matrix, top
from museum_search.core.errors import IndexFormatError
from museum_search.core.index import _approximate, _exact, _modes
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import MANIFEST, Index, LabellingSpec
from museum_search.core.inference._backbones import imported_meta
from museum_search.core.progress import drive
from museum_search.core.ranking import order, per_instance


def objects(n_objects: int, views: int, dim: int, seed: int = 0, spread: float = 0.6) -> np.ndarray:
    """float16 unit vectors: objects with random centres (no themes), ``views`` noisy views each."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((n_objects, 1, dim))
    c /= np.linalg.norm(c, axis=2, keepdims=True)
    noise = rng.standard_normal((n_objects, views, dim))
    noise /= np.linalg.norm(noise, axis=2, keepdims=True)
    x = (c + spread * noise).reshape(-1, dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def reference_top(d: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The top ``k`` by float64 dot products of the float16 values, ties by lower row (argsort)."""
    s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def memmap(tmp_path: Path, x: np.ndarray, name: str = "d.npy") -> np.ndarray:
    np.save(tmp_path / name, x)
    return np.load(tmp_path / name, mmap_mode="r")


# ---- exact scores of float16 -----------------------------------------------------------------


def test_float16_conversion_is_exact_for_every_finite_half():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)].reshape(-1, 8)  # subnormals, zeros, -0.0, 65504 included
    got = _exact._gather(halves, np.arange(len(halves)))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), halves.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(_exact._gather(halves, np.arange(len(halves)), np.float64),
                                  halves.astype(np.float64))


def test_exact_fp16_top_k_equals_float64_reference_with_ties_on_a_memory_map(tmp_path):
    x = objects(400, 10, 96)  # 4,000 references
    x[3999] = x[5]  # exact duplicates in other blocks: equal scores, ranked by row
    x[2048] = x[5]
    x[1000] = x[1001]
    d = memmap(tmp_path, x)
    rng = np.random.default_rng(3)
    q = np.asarray(x[[5, 1001, 17, 2500]], np.float32) + 0.05 * rng.standard_normal((4, 96)).astype(np.float32)
    q[3] = rng.standard_normal(96)  # not normalized: any query works
    expected = reference_top(x, q, 25)
    for chunk in (None, 37, 4000):  # blocks of the default size, small ones crossing the duplicates, one
        got = order(_exact.exact_scores(d, q, chunk_rows=chunk), 25)
        np.testing.assert_array_equal(got, expected)
    assert list(expected[0][:3]) == [5, 2048, 3999]  # the tie rule was exercised
    assert isinstance(d, np.memmap)
    # many queries (a matrix product per block) and a query large enough to need the other scaling
    many = np.concatenate([q, np.asarray(x[::500], np.float32)])
    np.testing.assert_array_equal(order(_exact.exact_scores(d, many), 10), reference_top(x, many, 10))
    big = q[:1] * 1e5
    np.testing.assert_array_equal(order(_exact.exact_scores(d, big), 25), expected[:1])


def test_exact_fp16_scores_do_not_copy_the_memory_map(tmp_path):
    x = objects(2000, 10, 128)  # 20,000 x 128: a float32 copy would be 10 MB
    d = memmap(tmp_path, x)
    q = np.asarray(x[[1, 2]], np.float32)
    _exact.exact_scores(d, q)  # the thread buffers, once
    tracemalloc.start()
    s = _exact.exact_scores(d, q)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 0.2 * x.size * 4 + s.nbytes, peak
    np.testing.assert_allclose(s, q.astype(np.float64) @ x.astype(np.float64).T, atol=2e-6)


# ---- the exact prefix of a ranking -----------------------------------------------------------


def _prefix_data(kind: str) -> np.ndarray:
    """30,000 x 64 float16: random rows, or objects of 10 views; duplicate rows (ties) either way."""
    rng = np.random.default_rng(11)
    if kind == "random":
        x = rng.standard_normal((30_000, 64))
        x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
    else:
        x = objects(3000, 10, 64, seed=12)
    x[20_000:20_040] = x[7]  # 40 copies of row 7 (ties near the top of its queries)
    x[25_000:25_300] = x[1234]  # 300 copies of row 1234 (ties at any rank, across blocks)
    return x


def _prefix_queries(x: np.ndarray, regions: int) -> np.ndarray:
    rng = np.random.default_rng(regions)
    base = np.asarray(x[[7, 1234, 4321]], np.float32)[:, None, :]
    q = base + 0.15 * rng.standard_normal((3, regions, x.shape[1])).astype(np.float32)
    return q / np.linalg.norm(q, axis=2, keepdims=True)


@pytest.mark.parametrize("kind", ["random", "objects"])
def test_exact_prefix_is_every_row_above_the_threshold_with_the_full_scores_bit_for_bit(tmp_path, kind):
    x = _prefix_data(kind)
    d = memmap(tmp_path, x)
    assert _exact._flat_view(d) is not None  # the prefix needs faiss's view of the file
    sizes = []
    for regions in (1, 2):
        q = _prefix_queries(x, regions)
        for m in (50, 400, 1024):
            got = _exact.exact_prefix(d, q if regions > 1 else q[:, 0], m)
            assert got is not None and len(got) == len(q)
            for i in range(len(q)):
                per_region = _exact.exact_scores(d, q[i])  # (R, N): faiss's k = N scan, every score
                full = per_region.max(axis=0)
                t = max(np.sort(per_region[r])[::-1][m - 1] for r in range(regions))
                expected = np.flatnonzero(full > t)
                rows, scores = got[i]
                np.testing.assert_array_equal(rows, expected)
                np.testing.assert_array_equal(scores.view(np.uint32), full[expected].view(np.uint32))
                assert len(rows) < len(x)
                sizes.append(len(rows))
    assert 0 in sizes and max(sizes) > 500  # ties at the threshold left out (row 1234's copies, m = 50)
    # the prefix is the first rows of the whole ranking, ties included: row 1234 and its 300 copies
    rows, scores = _exact.exact_prefix(d, np.asarray(x[1234:1235], np.float32), 1024)[0]
    whole = order(_exact.exact_scores(d, np.asarray(x[1234:1235], np.float32))[0])
    np.testing.assert_array_equal(rows[order(scores)], whole[:len(rows)])
    assert {1234, 25_000, 25_299} <= set(rows.tolist())
    # no prefix without faiss's view (float32, or not a memory map), nor for many query regions
    assert _exact.exact_prefix(np.asarray(x, np.float32), q[:, 0], 100) is None
    assert _exact.exact_prefix(np.asarray(x), q[:, 0], 100) is None
    assert _exact.exact_prefix(d, np.asarray(x[:9], np.float32), 100) is None


def _prefix_index(tmp_path: Path, x: np.ndarray, labels: list[str] | None = None) -> Index:
    d = memmap(tmp_path, x)
    views = 10
    items = _items(len(x), views) if labels is None else [
        Item(f"{lab}/{i}.jpg", 0, 0.0, lab, {}) for i, lab in enumerate(labels)]
    (tmp_path / "photos").mkdir(exist_ok=True)
    return Index(tmp_path / "photos", imported_meta(x.shape[1]), items, d)


class _Spy:
    """Counts the calls of search.score_matrix (every reference scored) and their queries."""

    def __init__(self, monkeypatch):
        self.calls: list[int] = []
        real = search_module.score_matrix

        def spy(index, q, mode="exact"):
            self.calls.append(len(np.atleast_2d(np.asarray(q))) if np.ndim(q) < 3 else len(q))
            return real(index, q, mode)

        monkeypatch.setattr(search_module, "score_matrix", spy)


@pytest.mark.parametrize("kind", ["random", "objects"])
def test_exact_top_ranks_the_prefix_as_the_whole_row(tmp_path, kind, monkeypatch):
    x = _prefix_data(kind)
    index = _prefix_index(tmp_path, x)
    for regions in (1, 2, 3):  # 3 x 3 query regions: more than exact_scores scans by faiss
        q = _prefix_queries(x, regions)
        qq = q if regions > 1 else q[:, 0]
        whole = score_matrix(index, qq)
        for k in (1, 10, 45, 700):
            spy = _Spy(monkeypatch)
            rows, scores = top(index, qq, k)
            monkeypatch.undo()
            expected = order(whole, k)
            np.testing.assert_array_equal(rows, expected)
            np.testing.assert_array_equal(scores.view(np.uint32),
                                          np.take_along_axis(whole, expected, axis=1).view(np.uint32))
            # from the prefix alone (no query scored every reference), but for 9 query regions
            assert spy.calls == ([3] if regions == 3 else [])
    # a query whose prefix is shorter than k (its best 2,000 rows tie: nothing above the threshold)
    tied = x.copy()
    tied[10_000:12_000] = tied[3]
    (tmp_path / "tied").mkdir()
    index = _prefix_index(tmp_path / "tied", tied)
    q = np.asarray(tied[[3, 4321]], np.float32)
    assert len(_exact.exact_prefix(index.descriptors, q[:1], 1024)[0][0]) < 10
    spy = _Spy(monkeypatch)
    rows, scores = top(index, q, 10)
    monkeypatch.undo()
    assert spy.calls == [1]  # the tied query only
    whole = score_matrix(index, q)
    np.testing.assert_array_equal(rows, order(whole, 10))
    np.testing.assert_array_equal(scores, np.take_along_axis(whole, order(whole, 10), axis=1))
    assert rows[0].tolist() == [3] + list(range(10_000, 10_009))


def test_ranking_scores_hold_the_prefix_or_the_whole_row(tmp_path):
    x = _prefix_data("objects")
    # one object holds 3,000 near copies of row 5's view: the top 1,024 of a query near it are all
    # that object's (too few objects), other queries' are of many objects
    rng = np.random.default_rng(2)
    near = np.asarray(x[5], np.float32) + 0.02 * rng.standard_normal((3000, 64)).astype(np.float32)
    x[5000:8000] = (near / np.linalg.norm(near, axis=1, keepdims=True)).astype(np.float16)
    labels = [f"obj{i // 10}" if not 5000 <= i < 8000 else "big" for i in range(len(x))]
    index = _prefix_index(tmp_path, x, labels)
    for regions in (1, 2):
        q = _prefix_queries(x, regions)
        q[0] = np.asarray(x[5000], np.float32)  # near the big object
        qq = q if regions > 1 else q[:, 0]
        whole = score_matrix(index, qq)
        got = ranking_scores(index, qq, "exact", rows=20, objects=6)
        assert got.shape == whole.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got[0], whole[0])  # fell back: its prefix is one object
        for i in (1, 2):
            finite = np.isfinite(got[i])
            assert 20 <= finite.sum() < len(x) // 10
            np.testing.assert_array_equal(got[i][finite].view(np.uint32), whole[i][finite].view(np.uint32))
            assert got[i][finite].min() > whole[i][~finite].max()  # the top of the ranking
            n_obj = len(set(index.labels[finite].tolist()))
            assert n_obj >= 6
            np.testing.assert_array_equal(order(got[i], 20), order(whole[i], 20))
            np.testing.assert_array_equal(per_instance(got[i], index.labels, 6),
                                          per_instance(whole[i], index.labels, 6))
        # asking for more objects than query 1's prefix holds: its whole row
        n1 = len(set(index.labels[np.isfinite(got[1])].tolist()))
        more = ranking_scores(index, qq, "exact", rows=20, objects=n1 + 1)
        np.testing.assert_array_equal(more[1], whole[1])
    # below PREFIX_MIN_REFERENCES references: every score
    (tmp_path / "small").mkdir()
    small = _prefix_index(tmp_path / "small", x[:search_module.PREFIX_MIN_REFERENCES - 1], labels[:search_module.PREFIX_MIN_REFERENCES - 1])
    q = np.asarray(x[[1, 2]], np.float32)
    got = ranking_scores(small, q, "exact", rows=20, objects=6)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, score_matrix(small, q))
    # float32 descriptors (no faiss view): every score
    (tmp_path / "f32").mkdir()
    index32 = _prefix_index(tmp_path / "f32", np.asarray(x, np.float32), labels)
    q = np.asarray(x[[1, 2]], np.float32)
    np.testing.assert_array_equal(ranking_scores(index32, q, "exact", rows=20, objects=6), score_matrix(index32, q))


def test_pipeline_answers_from_the_ranking_scores_as_from_the_whole_row(saved, monkeypatch):
    """With :func:`ranking_scores` in place of :func:`score_matrix` (no re-ranker, nothing left out),
    the pipeline's answers are the same: results, scores, cosines, margin, confidence."""
    from museum_search.core.answer import _pipeline as query_module
    from museum_search.core.answer._pipeline import QueryImage, QueryPipeline, QuerySettings

    index = Index.load(saved)
    assert _exact._flat_view(index.descriptors) is not None
    rng = np.random.default_rng(8)
    q = np.asarray(index.descriptors[rng.choice(len(index), 4, replace=False)], np.float32)
    q = np.stack([q, q + 0.2 * rng.standard_normal(q.shape).astype(np.float32)], axis=1)  # 2 regions
    queries = [QueryImage(f"q{i}", None) for i in range(len(q))]
    # the approximate search: its own scores, -inf but for its candidates
    np.testing.assert_array_equal(ranking_scores(index, q, "ann", rows=8, objects=9), score_matrix(index, q, "ann"))
    for one_per_object in (False, True):
        settings = QuerySettings(k=8, search="exact", verify=False, per_instance=one_per_object)
        pipe = QueryPipeline(index, settings)
        before = [pipe.answer([qi], q[i:i + 1])[0] for i, qi in enumerate(queries)]
        k = settings.k
        monkeypatch.setattr(query_module, "score_matrix", lambda idx, desc, mode, k=k: ranking_scores(
            idx, desc, mode, rows=k, objects=k + 1))
        after = [pipe.answer([qi], q[i:i + 1])[0] for i, qi in enumerate(queries)]
        monkeypatch.undo()
        for a, b in zip(after, before):
            assert np.isfinite(a.scores).sum() < len(index) // 2  # ranked from the prefix
            assert [r.to_dict() for r in a.results] == [r.to_dict() for r in b.results]
            assert [r.cosine for r in a.results] == [r.cosine for r in b.results]
            assert (a.margin, a.confidence, a.top_cosine, a.reason) == (b.margin, b.confidence, b.top_cosine, b.reason)


# ---- the approximate search ------------------------------------------------------------------


def _items(n: int, views: int) -> list[Item]:
    return [Item(f"obj{i // views}/view{i % views}.jpg", 0, 0.0, f"obj{i // views}", {}) for i in range(n)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A saved index of 20,000 float16 references (2,000 objects x 10 views, 64-d) with a tuned
    approximate index."""
    tmp = tmp_path_factory.mktemp("speed")
    x = objects(2000, 10, 64, seed=4)
    (tmp / "photos").mkdir()
    idx = Index(tmp / "photos", imported_meta(64), _items(len(x), 10), x, LabellingSpec("imported"))
    idx.ann = drive(_approximate.AnnIndex.build(idx.descriptors))
    idx.save(tmp / "idx")
    return tmp / "idx"


def test_approximate_top_ranks_only_candidates_as_the_dense_row_did(saved):
    index = Index.load(saved)
    rng = np.random.default_rng(9)
    q = np.asarray(index.descriptors[rng.choice(len(index), 12, replace=False)], np.float32)
    q += 0.1 * rng.standard_normal(q.shape).astype(np.float32)
    dense = score_matrix(index, q, "ann")  # the old semantics: -inf except the candidates, ranked whole
    expected = order(dense, 10)
    top(index, q, 10, "ann")  # this thread's conversion buffer, once
    tracemalloc.start()
    rows, scores = top(index, q, 10, "ann")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_array_equal(scores, np.take_along_axis(dense, expected, axis=1))
    assert peak < dense.nbytes / 2, (peak, dense.nbytes)  # not an N-long row of scores per query
    # with regions (Q, R, D): the best region per candidate, the same ranks
    q3 = np.stack([q, q[::-1]], axis=1)
    rows3, _ = top(index, q3, 10, "ann")
    np.testing.assert_array_equal(rows3, order(score_matrix(index, q3, "ann"), 10))
    # exact: the same as ranking the exact scores; and k past the shortlist is padded with -1
    np.testing.assert_array_equal(top(index, q, 7)[0], order(score_matrix(index, q), 7))
    few = Index.load(saved)
    few.ann.params = replace(few.ann.params, shortlist=20)
    r, s = top(few, q[:2], 30, "ann")
    assert r.shape == (2, 30) and (r[:, 20:] == -1).all() and np.isinf(s[:, 20:]).all()


def test_pipeline_answer_with_the_approximate_search_ranks_the_candidates_as_the_whole_row(saved):
    """The query pipeline ranks only the references the approximate search scored (not the N-long
    row): its results are those of ranking the whole row of scores it returns, per photo or per
    object, and with references left out."""
    from museum_search.core.answer._pipeline import QueryImage, QueryPipeline, QuerySettings
    from museum_search.core.ranking import per_instance

    index = Index.load(saved)
    rng = np.random.default_rng(3)
    q = np.asarray(index.descriptors[rng.choice(len(index), 6, replace=False)], np.float32)
    q += 0.1 * rng.standard_normal(q.shape).astype(np.float32)
    queries = [QueryImage(f"q{i}", None) for i in range(len(q))]
    exclude = np.zeros(len(index), bool)
    exclude[::7] = True
    for one_per_object in (False, True):
        pipe = QueryPipeline(index, QuerySettings(k=15, search="ann", verify=False, per_instance=one_per_object))
        assert pipe.search_mode == "ann"
        for mask in (None, exclude):
            for answer in pipe.answer(queries, q, exclude=mask):
                finite = np.isfinite(answer.scores)
                assert finite.sum() < len(index) // 2  # the approximate search scored a few
                whole = (per_instance(answer.scores, index.labels, 15) if one_per_object
                         else order(answer.scores, 15))
                whole = whole[np.isfinite(answer.scores[whole])]
                assert [r.row for r in answer.results] == whole.tolist()
                if mask is not None:
                    assert not any(mask[r.row] for r in answer.results)


# ---- tuning at build time --------------------------------------------------------------------


def test_tuning_raises_the_settings_to_the_target_recall_and_is_saved(saved, tmp_path):
    x = objects(300, 10, 64, seed=7)  # 3,000 references
    params = _approximate.choose_params(len(x), 64)
    params.nprobe, params.shortlist = 1, 10  # far too few: tuning must raise them
    index = drive(_approximate.AnnIndex.build(memmap(tmp_path, x), params, tune=True))
    t = index.params.tuning
    assert params.nprobe == 1 and params.tuning is None  # the caller's parameters are left alone
    assert t is not None and t.recall_at_10 >= _approximate.TARGET_RECALL and t.steps[0][:2] == (1, 10)
    assert t.steps[0][2] < _approximate.TARGET_RECALL and (index.params.nprobe, index.params.shortlist) != (1, 10)
    assert (index.params.nprobe, index.params.shortlist, t.recall_at_10) in t.steps
    assert t.ann_ms > 0 and t.exact_ms > 0 and t.queries == 200
    # independently: recall@10 of new views of indexed objects against the float64 ranking
    rng = np.random.default_rng(11)
    src = np.asarray(x[rng.choice(len(x), 100, replace=False)], np.float32)
    q = src + 0.6 * rng.standard_normal(src.shape).astype(np.float32) / 8
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    got, _ = index.search(x, q, 10)
    truth = reference_top(x, q, 10)
    assert np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(got, truth)]) >= 0.93
    # the default build tunes too, and the manifest keeps what it measured
    manifest = json.loads((saved / MANIFEST).read_text())
    stored = manifest["ann"]["tuning"]
    assert stored["recall_at_10"] >= _approximate.TARGET_RECALL and stored["exact_ms"] > 0 and stored["ann_ms"] > 0
    back = Index.load(saved)
    assert back.ann.params.tuning == _approximate.AnnTuning.from_dict(stored)
    assert back.ann.params.nprobe == manifest["ann"]["nprobe"]


def test_manifest_without_tuning_still_loads():
    old = {"nlist": 256, "m": 80, "nbits": 8, "nprobe": 8, "shortlist": 800, "train_size": 16384,
           "seed": 1234, "train_iterations": 10, "add_chunk": 16384}
    p = _approximate.AnnParams.from_dict(old)
    assert p.tuning is None and p.to_dict() == old
    with pytest.raises(IndexFormatError, match="measured"):
        _approximate.AnnParams.from_dict({**old, "tuning": {"recall_at_10": "x"}})


def test_auto_follows_the_measurement(saved):
    index = Index.load(saved).ann
    t = index.params.tuning
    small = 20_000  # below AUTO_MIN_REFERENCES: the old rule says exact
    assert _modes.resolve_mode("auto", small, True) == "exact"
    index.params.tuning = replace(t, ann_ms=1.0, exact_ms=5.0, recall_at_10=0.97)
    assert _modes.resolve_mode("auto", small, index) == "ann"
    index.params.tuning = replace(t, ann_ms=1.0, exact_ms=5.0, recall_at_10=0.90)  # misses the target
    assert _modes.resolve_mode("auto", small, index) == "exact"
    index.params.tuning = replace(t, ann_ms=6.0, exact_ms=5.0, recall_at_10=0.99)  # slower
    assert _modes.resolve_mode("auto", 10 * _modes.AUTO_MIN_REFERENCES, index) == "exact"
    index.params.tuning = None  # an index built before the measurement: the old rule
    assert _modes.resolve_mode("auto", small, index) == "exact"
    assert _modes.resolve_mode("auto", _modes.AUTO_MIN_REFERENCES, index) == "ann"
    assert _modes.resolve_mode("auto", small, None) == "exact"
    assert _modes.resolve_mode("ann", small, index) == "ann"


def test_info_shows_the_measurement(saved, capsys):
    assert cli_main(["info", str(saved)]) == 0
    out = capsys.readouterr().out
    t = Index.load(saved).ann.params.tuning
    assert f"recall@10 {t.recall_at_10:.3f} against exact search (target 0.95" in out
    assert f"{t.ann_ms:.1f} ms per query against {t.exact_ms:.1f} ms exact" in out
    assert f"--search auto: {'ann' if t.faster and t.meets_target else 'exact'}" in out


def test_faiss_scans_the_float16_file_in_place_and_agrees_with_the_conversion(tmp_path):
    x = objects(500, 10, 96)
    d = memmap(tmp_path, x)
    view = _exact._flat_view(d)
    assert view is not None and view.ntotal == len(x) and not view.codes.is_owned  # the file's pages
    assert _exact._flat_view(d[:100]) is None and _exact._flat_view(np.asarray(d)) is None  # a slice, no map
    q = np.random.default_rng(2).standard_normal((6, 96)).astype(np.float32)  # e.g. a photo's regions
    faiss_scores = _exact.exact_scores(d, q)
    converted = _exact.exact_scores(d, q, chunk_rows=128)  # the bit-arithmetic blocks
    np.testing.assert_allclose(faiss_scores, converted, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(order(faiss_scores, 30), reference_top(x, q, 30))
    assert np.array_equal(np.load(tmp_path / "d.npy"), x)  # the file is as it was (the header too)


def test_approximate_search_by_faiss_refine_equals_the_numpy_path_ties_by_row(tmp_path):
    x = objects(300, 10, 64, seed=5)
    dup = [7, 500, 1500, 2999]  # exact duplicates: tied scores, ranked by row
    many = list(range(1000, 1025))  # 25 copies: a tie longer than the refine's k + 16
    x[dup] = x[7]
    x[many] = x[1200]
    d = memmap(tmp_path, x)
    params = _approximate.choose_params(len(x), 64)
    params.nprobe, params.shortlist = 32, 200  # cells holding more than the shortlist
    index = drive(_approximate.AnnIndex.build(d, params))
    rng = np.random.default_rng(6)
    q = np.asarray(x[[7, 1200, 42, 2500]], np.float32) + 0.02 * rng.standard_normal((4, 64)).astype(np.float32)
    refine = index._refine(d)
    assert refine is not None and index._refine(np.asarray(d)) is None
    assert index._search_refined(refine, q[[0, 2, 3]], 10) is not None  # faiss answers
    assert index._search_refined(refine, q[1:2], 3) is None  # 25 tied: more than 3 + 16, ranked here
    for k in (1, 3, 10, 30):
        rows, scores = index.search(d, q, k)  # faiss's refine over the file's pages
        rows_np, scores_np = index.search(np.asarray(d), q, k)  # the numpy path (no memory map)
        np.testing.assert_array_equal(rows, rows_np)
        np.testing.assert_allclose(scores, scores_np, rtol=0, atol=2e-6)
    rows, _ = index.search(d, q, 30)
    assert list(rows[0][:4]) == dup and list(rows[1][:25]) == many


def test_a_view_that_reads_other_rows_is_refused(tmp_path):
    a = memmap(tmp_path, objects(50, 10, 32, seed=1), "a.npy")
    b = memmap(tmp_path, objects(50, 10, 32, seed=2), "b.npy")
    view = _exact._flat_view(a)
    assert view is not None and _exact._flat_view_agrees(view, a)
    assert not _exact._flat_view_agrees(view, b)  # faiss would read a's rows for b: not used
