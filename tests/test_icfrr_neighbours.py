"""ICFRR without an N x N matrix (issue 12, part 3): neighbour lists, partly scored queries, pipeline.

The dense functions of ``tests/oracles.py`` (``gallery_ranks``, ``prepare_graph``, ``icfrr_loop``)
are the oracle. The
neighbour lists here are derived from the dense ranks (what ``index.neighbour_lists`` must return:
each reference's nearest other references, best first, with the arithmetic and ties of
``gallery_ranks``), so these tests do not depend on the index.
"""

import threading
import weakref

import numpy as np
import pytest
from oracles import gallery_ranks, icfrr_dense, icfrr_loop, prepare_graph

from museum_search.core.answer import _icfrr as icfrr_mod
from museum_search.core.answer._icfrr import ICFRRParams, ICFRRReranker, graph_from_neighbours, icfrr
from museum_search.core.answer._rerank import RerankOptions, build_rerankers, icfrr_graph, icfrr_k_g
from museum_search.core.ranking import neg_distance, order


def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def neighbours_of(ranks):
    """Neighbour lists from dense gallery ranks: row j = the others by rank (self, rank inf, last)."""
    return np.argsort(ranks, axis=1, kind="stable")[:, :-1].astype(np.int32)


def neighbours_by_distance(desc):
    """The same lists from the definition: the others by ascending distance, ties by index."""
    d64 = desc.astype(np.float64)
    s = neg_distance((d64 @ d64.T).astype(np.float32))
    np.fill_diagonal(s, -np.inf)
    return order(s)[:, :-1].astype(np.int32)


@pytest.fixture(scope="module")
def case():
    """A gallery with exact duplicates (ties), near-duplicates and tied query scores."""
    rng = np.random.default_rng(5)
    desc = unit(rng.standard_normal((90, 8)))
    desc[10] = desc[40]
    desc[41] = desc[40]  # three identical references
    desc[60] = unit(desc[59:60] + 1e-4 * rng.standard_normal((1, 8)))[0]  # a near-duplicate
    desc[70:73] = desc[20]
    queries = unit(rng.standard_normal((25, 8)))
    queries[0] = desc[40]
    queries[1] = desc[20]
    scores = queries @ desc.T
    scores[2, 30:35] = scores[2, 30]  # tied query scores
    ranks = gallery_ranks(desc)
    return desc, scores, ranks, neighbours_of(ranks)


# ------------------------------------------------------------------------------------------
# graph_from_neighbours == prepare_graph(gallery_ranks)
# ------------------------------------------------------------------------------------------


def test_neighbour_lists_follow_the_gallery_ranks_definition(case):
    desc, _, ranks, nb = case
    np.testing.assert_array_equal(nb, neighbours_by_distance(desc))
    # rank of neighbours[j, p] is p + 1
    g = len(desc)
    np.testing.assert_array_equal(ranks[np.arange(g)[:, None], nb], np.broadcast_to(np.arange(1, g), (g, g - 1)))


@pytest.mark.parametrize("k_max", [1, 6, 20, 89])
def test_same_weights_as_the_dense_graph(case, k_max):
    _, _, ranks, nb = case
    lists = np.ascontiguousarray(nb[:, :k_max])
    for k_g in range(1, k_max + 1):
        dense, sparse = prepare_graph(ranks, k_g), graph_from_neighbours(lists, k_g)
        assert (sparse.size, sparse.k_g, sparse.gallery_size) == (dense.size, dense.k_g, dense.gallery_size)
        for name in ("indptr", "indices", "data"):
            a, b = getattr(dense.weights, name), getattr(sparse.weights, name)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    # chunked reading (memory-mapped lists) gives the same
    np.testing.assert_array_equal(graph_from_neighbours(lists, k_max, chunk=7).weights.data,
                                  prepare_graph(ranks, k_max).weights.data)


@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.parametrize("stop", [True, False])
@pytest.mark.parametrize("k_q,k_g,k_max", [(1, 1, 1), (2, 2, 10), (3, 5, 5), (8, 4, 12), (40, 30, 30), (200, 300, 89)])
def test_icfrr_from_neighbour_lists_is_identical_to_dense(case, mode, stop, k_q, k_g, k_max):
    _, scores, ranks, nb = case
    p = ICFRRParams(k_q=k_q, k_g=k_g, beta=0.5, max_iter=6, mode=mode, stop_when_stable=stop)
    dense = icfrr(scores, prepare_graph(ranks, k_g), p)
    graph = graph_from_neighbours(nb[:, :k_max], k_g, size=len(ranks))
    for chunk in (None, 4):
        res = icfrr(scores, graph, p, chunk_size=chunk)
        np.testing.assert_array_equal(res.scores, dense.scores)
        np.testing.assert_array_equal(res.iterations, dense.iterations)
        np.testing.assert_array_equal(res.converged, dense.converged)
    assert dense.iterations.max() > 1  # the ranking actually moved


def test_k_g_beyond_the_lists_is_refused(case):
    _, scores, ranks, nb = case
    g = len(ranks)
    with pytest.raises(ValueError, match=r"K_g = 6 needs each reference's 6 nearest neighbours.*hold 5"):
        graph_from_neighbours(nb[:, :5], 6)
    # complete lists (K_max = G - 1): any K_g, capped at G - 1 as prepare_graph does
    big = graph_from_neighbours(nb, 1000)
    assert big.k_g == g - 1
    np.testing.assert_array_equal(big.weights.data, prepare_graph(ranks, 1000).weights.data)
    with pytest.raises(ValueError, match="k_g"):  # a graph for another K_g
        icfrr(scores, graph_from_neighbours(nb, 3), ICFRRParams(k_q=2, k_g=4))


def test_bad_neighbour_lists_are_refused(case):
    _, _, _, nb = case
    g = len(nb)
    with pytest.raises(ValueError, match="rows"):
        graph_from_neighbours(nb, 3, size=g + 1)
    bad = nb[:, :4].copy()
    bad[3, 1] = 3
    with pytest.raises(ValueError, match="own neighbour"):
        graph_from_neighbours(bad, 4)
    bad = nb[:, :4].copy()
    bad[5, 2] = bad[5, 0]
    with pytest.raises(ValueError, match="twice"):
        graph_from_neighbours(bad, 4)
    bad = nb[:, :4].copy()
    bad[0, 0] = g
    with pytest.raises(ValueError, match="outside"):
        graph_from_neighbours(bad, 4)
    with pytest.raises(ValueError, match="integers"):
        graph_from_neighbours(nb.astype(np.float32), 2)
    # columns past K_g are not read
    tail = nb[:, :4].copy()
    tail[:, 3] = np.arange(g)
    np.testing.assert_array_equal(graph_from_neighbours(tail, 3).weights.indices,
                                  graph_from_neighbours(nb, 3).weights.indices)


def test_neighbour_lists_in_the_reranker(case):
    _, scores, ranks, nb = case
    p = ICFRRParams(k_q=3, k_g=4)
    expected = icfrr_dense(scores, ranks, p).scores
    rr = ICFRRReranker(p)
    np.testing.assert_array_equal(rr.rerank(scores, graph=graph_from_neighbours(nb, 4)), expected)


# ------------------------------------------------------------------------------------------
# Partly scored queries (-inf: not scored by the approximate search)
# ------------------------------------------------------------------------------------------


def shortlisted(scores, m):
    """Keep the best ``m`` scores of each row (ties by index), -inf elsewhere."""
    out = np.full_like(scores, -np.inf)
    top = order(scores)[:, :m]
    np.put_along_axis(out, top, np.take_along_axis(scores, top, axis=1), axis=1)
    return out


def test_all_finite_scores_take_the_full_path_bit_identically(case, monkeypatch):
    _, scores, ranks, nb = case
    calls = []
    run_scored = icfrr_mod._run_scored
    monkeypatch.setattr(icfrr_mod, "_run_scored", lambda *a: (calls.append(1), run_scored(*a))[1])
    for mode in ("paper", "reference"):
        p = ICFRRParams(k_q=4, k_g=6, mode=mode)
        res = icfrr(scores, graph_from_neighbours(nb, 6), p)
        loop = icfrr_loop(scores, ranks, p)
        np.testing.assert_array_equal(res.scores, loop.scores)
        np.testing.assert_array_equal(res.iterations, loop.iterations)
    assert not calls


@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.parametrize("stop", [True, False])
@pytest.mark.parametrize("k_q,k_g", [(1, 1), (3, 5), (8, 4), (30, 12)])
def test_partly_scored_equals_the_whole_gallery_update_with_minus_inf(case, mode, stop, k_q, k_g):
    """Sub-gallery ICFRR == Eq. 3-6 run literally on all G references with the -inf scores
    (normalizer G - 1, K_q capped at the scored count): bit-identical, iterations included."""
    _, scores, ranks, nb = case
    rng = np.random.default_rng(k_q * 31 + k_g)
    part = shortlisted(scores, 20)
    part[3] = scores[3]  # a fully scored row in the same batch
    part[4] = -np.inf  # nothing scored
    part[5] = -np.inf
    part[5, 17] = scores[5, 17]  # one scored reference
    part[6, rng.choice(90, 60, replace=False)] = -np.inf  # a random subset of a full row
    part[7] = shortlisted(scores[7:8], 5)[0]  # fewer scored than K_q (for the larger K_q)
    p = ICFRRParams(k_q=k_q, k_g=k_g, beta=0.5, max_iter=6, mode=mode, stop_when_stable=stop)
    loop = icfrr_loop(part, ranks, p)
    graph = graph_from_neighbours(nb[:, :k_g], k_g)
    for chunk in (None, 3):
        res = icfrr(part, graph, p, chunk_size=chunk)
        np.testing.assert_array_equal(res.scores, loop.scores)
        np.testing.assert_array_equal(res.iterations, loop.iterations)
        np.testing.assert_array_equal(res.converged, loop.converged)
    unscored = np.isneginf(part)
    assert np.all(np.isneginf(res.scores[unscored])) and np.all(np.isfinite(res.scores[~unscored]))
    assert res.iterations[4] == 0 and res.converged[4]
    np.testing.assert_array_equal(res.scores[3], icfrr_dense(scores[3:4], ranks, p).scores[0])
    # the scored part moved (ICFRR did something on the sub-gallery)
    assert not np.array_equal(res.scores[0][~unscored[0]], neg_distance(part[0][~unscored[0]]))


def test_partly_scored_uses_the_whole_gallery_normalizer(case):
    _, scores, ranks, nb = case
    g = len(ranks)
    part = shortlisted(scores[:1], 10)
    p = ICFRRParams(k_q=2, k_g=3, max_iter=1)
    res = icfrr(part, graph_from_neighbours(nb, 3), p)
    s0 = neg_distance(part[0])
    top = order(s0[None])[0, :2]
    delta = np.zeros(g)
    for t in top:
        for r, i in enumerate(nb[t, :3], start=1):
            delta[i] += (g - r) / (g - 1) / 2  # alpha[r] = 1 - (r - 1)/(G - 1), mean over K_q = 2
    scored = np.isfinite(s0)
    np.testing.assert_allclose(res.scores[0][scored], (s0 + 0.5 * delta)[scored], atol=1e-6)


def clustered(rng, objects, views, dim, noise):
    centres = unit(rng.standard_normal((objects, dim)))
    desc = unit(np.repeat(centres, views, axis=0) + noise * rng.standard_normal((objects * views, dim)))
    return centres, desc


@pytest.mark.parametrize("mode", ["paper", "reference"])
def test_shortlist_gives_the_full_gallery_top_10(mode):
    """ANN-style shortlist (the best 40 of 1200 references scored, -inf elsewhere) vs ICFRR on the
    true scores of the whole gallery: the same top 10 when the shortlist holds the true neighbours."""
    rng = np.random.default_rng(21)
    objects, views = 200, 6
    centres, desc = clustered(rng, objects, views, 48, 0.1)
    labels = np.repeat(np.arange(objects), views)
    targets = rng.choice(objects, 30, replace=False)
    queries = unit(centres[targets] + 0.1 * rng.standard_normal((30, 48)))
    scores = queries @ desc.T
    ranks = gallery_ranks(desc)
    nb = neighbours_of(ranks)[:, :10]
    p = ICFRRParams(k_q=3, k_g=3, mode=mode)
    full = icfrr_dense(scores, ranks, p)
    part_scores = shortlisted(scores, 40)
    part = icfrr(part_scores, graph_from_neighbours(nb, 3), p)
    for qi in range(30):
        # precondition: every view of the object is shortlisted
        assert np.all(np.isfinite(part_scores[qi, labels == targets[qi]]))
        np.testing.assert_array_equal(order(part.scores[qi : qi + 1])[0, :10],
                                      order(full.scores[qi : qi + 1])[0, :10])
    # here the runs even agree on every scored reference (same top-K_q sets, same stopping)
    scored = np.isfinite(part_scores)
    np.testing.assert_array_equal(part.scores[scored], full.scores[scored])
    np.testing.assert_array_equal(part.iterations, full.iterations)
    # ICFRR changed the top 10 of most queries (the comparison is not vacuous)
    before = order(scores)[:, :10]
    assert np.sum(np.any(before != order(full.scores)[:, :10], axis=1)) > 20


def test_scores_other_than_minus_inf_are_refused(case):
    _, scores, ranks, nb = case
    graph = graph_from_neighbours(nb, 2)
    p = ICFRRParams(k_q=2, k_g=2)
    for bad in (np.nan, np.inf):
        s = scores.copy()
        s[1, 4] = bad
        with pytest.raises(ValueError, match=r"NaN or \+inf"):
            icfrr(s, graph, p)
    s = scores.copy()
    s[0, :3] = -np.inf
    s[0, 5] = 1.5  # the range check still applies to the scored references
    with pytest.raises(ValueError, match="not dot products"):
        icfrr(s, graph, p)


# ------------------------------------------------------------------------------------------
# The re-ranking pipeline and the evaluation's waiting
# ------------------------------------------------------------------------------------------


class FakeIndex:
    """An index as the pipeline sees it: labels, neighbour lists; descriptors counted."""

    def __init__(self, desc, labels, nb):
        self._desc, self.labels, self._nb = desc, np.asarray(labels), nb
        self.neighbour_calls: list[int] = []
        self.descriptor_reads = 0

    def __len__(self):
        return len(self._desc)

    @property
    def descriptors(self):
        self.descriptor_reads += 1
        return self._desc.astype(np.float16)

    def neighbour_lists(self, k):
        self.neighbour_calls.append(k)
        return self._nb

    def has_neighbours(self, k):
        return self._nb.shape[1] >= min(k, len(self) - 1)


def test_pipeline_icfrr_reads_neighbour_lists_not_descriptors(case):
    desc, scores, ranks, nb = case
    labels = np.arange(90) // 6  # 6 photos per object: K_q = K_g = 3 suggested
    index = FakeIndex(desc, labels, nb[:, :8])
    pipe = build_rerankers("icfrr")
    out = pipe.apply(index, scores, desc[:25])
    np.testing.assert_array_equal(out, icfrr_dense(scores, ranks, ICFRRParams(k_q=3, k_g=3)).scores)
    assert index.descriptor_reads == 0 and index.neighbour_calls == [3]
    pipe.apply(index, scores, desc[:25])
    build_rerankers("icfrr").apply(index, scores, desc[:25])
    assert index.neighbour_calls == [3]  # the graph is cached per index and K_g
    # partly scored queries through the pipeline
    part = shortlisted(scores, 15)
    np.testing.assert_array_equal(pipe.apply(index, part, desc[:25]),
                                  icfrr_loop(part, ranks, ICFRRParams(k_q=3, k_g=3)).scores)
    # K_g beyond the stored lists: the index is asked for longer lists (and the error if not)
    with pytest.raises(ValueError, match="K_g = 9"):
        build_rerankers("icfrr", RerankOptions(k_q=2, k_g=9)).apply(index, scores, desc[:25])
    assert index.neighbour_calls == [3, 9]
    # the cache goes with the index
    ref = weakref.ref(index)
    del index
    assert ref() is None


def test_pipeline_reads_descriptors_once_for_expansion(case):
    desc, scores, ranks, nb = case
    index = FakeIndex(desc, np.arange(90) // 6, nb[:, :8])
    build_rerankers("dba,icfrr", RerankOptions(k_q=2, k_g=2)).apply(index, scores, desc[:25])
    assert index.descriptor_reads == 1 and index.neighbour_calls == [2]
    index = FakeIndex(desc, np.arange(90) // 6, nb[:, :8])
    build_rerankers("aqe,dba", RerankOptions()).apply(index, scores, desc[:25])
    assert index.descriptor_reads == 1 and index.neighbour_calls == []


def test_icfrr_graph_cache_and_tiny_galleries(case):
    desc, _, ranks, nb = case
    index = FakeIndex(desc, np.arange(90), nb[:, :8])
    g2, g3 = icfrr_graph(index, 2, 90), icfrr_graph(index, 3, 90)
    assert icfrr_graph(index, 2, 90) is g2 and icfrr_graph(index, 3, 90) is g3
    icfrr_graph(index, 4, 90)  # a third K_g drops the oldest (memory: N x K_g each)
    assert icfrr_graph(index, 3, 90) is g3 and icfrr_graph(index, 2, 90) is not g2
    one = FakeIndex(desc[:1], ["a"], np.empty((1, 0), np.int32))
    assert icfrr_graph(one, 5, 1).k_g == 0 and one.neighbour_calls == []
    out = build_rerankers("icfrr", RerankOptions(k_q=2, k_g=2)).apply(one, np.array([[0.5]], np.float32), desc[:1])
    np.testing.assert_array_equal(out, neg_distance(np.array([[0.5]], np.float32)))


class _Pipe:
    def __init__(self, rerank, options):
        from museum_search.core.answer._pipeline import QuerySettings

        self.settings = QuerySettings(rerank=rerank, options=options)


def _drain(gen):
    items = []
    while True:
        try:
            items.append(next(gen))
        except StopIteration as stop:
            return items, stop.value


def test_the_evaluation_waits_for_the_neighbour_lists(case):
    from museum_search.core.evaluation import _runner as runner

    desc, _, _, nb = case
    index = FakeIndex(desc, np.arange(90) // 8, nb[:, :3])  # 8 per object: K_g = 4 suggested
    release = threading.Event()
    lists = index.neighbour_lists

    def slow(k):
        release.wait(5)
        return lists(k)

    index.neighbour_lists = slow
    pipe = _Pipe("icfrr", RerankOptions())
    gen = runner.query_pipeline(index, pipeline=pipe)
    first = next(gen)
    assert first.stage == runner.NEIGHBOURS == "finding each reference's nearest neighbours (for ICFRR, once per index)"
    release.set()
    items, out = _drain(gen)
    assert out is pipe and index.neighbour_calls == [icfrr_k_g(index.labels, RerankOptions())] == [4]
    assert all(i.stage == runner.NEIGHBOURS for i in items)
    # lists long enough: no waiting; no ICFRR: no lists; neighbours= asks for more (a sweep's largest K)
    index.neighbour_calls.clear()
    assert _drain(runner.query_pipeline(index, pipeline=_Pipe("icfrr", RerankOptions(k_q=3, k_g=3))))[0] == []
    assert _drain(runner.query_pipeline(index, pipeline=_Pipe("dba", RerankOptions())))[0] == []
    assert index.neighbour_calls == []
    _drain(runner.query_pipeline(index, pipeline=_Pipe("icfrr", RerankOptions(k_q=3, k_g=3)), neighbours=7))
    assert index.neighbour_calls == [7]


def test_a_sweep_of_k_asks_for_its_largest_k(case, monkeypatch):
    from museum_search.core.evaluation import _sweep as sweep_mod

    desc, _, _, nb = case
    index = FakeIndex(desc, np.arange(90) // 6, nb)
    seen = {}

    class Stop(Exception):
        pass

    def fake(index, settings, **kw):
        seen.update(kw, k_g=settings.options.k_g)
        raise Stop
        yield  # a generator, as query_pipeline

    monkeypatch.setattr(sweep_mod, "query_pipeline", fake)
    with pytest.raises(Stop):
        next(sweep_mod.sweep(index, None, "k", [2, 7, 3]))
    assert seen["neighbours"] == 7 and seen["k_g"] == 2
    with pytest.raises(Stop):
        next(sweep_mod.sweep(index, None, "beta", [0.1, 0.5], RerankOptions()))
    assert seen["neighbours"] == 3  # suggested K_g (6 photos per object), the same at every beta
