"""ICFRR (spec 003, section 3.2): the gallery ranks (the tests' oracle), the rank-based update, both
modes, helpers."""

import numpy as np
import pytest
from oracles import gallery_ranks, icfrr_dense, icfrr_loop, prepare_graph, rank_dtype

from museum_search.core.answer import _icfrr as icfrr_mod
from museum_search.core.answer._icfrr import ICFRRParams, ICFRRReranker, icfrr, suggest_params
from museum_search.core.ranking import neg_distance, order

INF8 = 255  # uint8 stand-in for r[i, i] = inf


def unit(rng, n, d=16):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_ranks(desc):
    """Literal definition: sort the other references by (Euclidean distance, index)."""
    g = len(desc)
    d64 = desc.astype(np.float64)
    dist = neg_distance((d64 @ d64.T).astype(np.float32))  # same distance arithmetic
    out = np.full((g, g), np.iinfo(rank_dtype(g)).max, dtype=rank_dtype(g))
    for i in range(g):
        others = [j for j in range(g) if j != i]
        others.sort(key=lambda j: (-dist[i, j], j))
        for r, j in enumerate(others, start=1):
            out[i, j] = r
    return out


def literal_icfrr(s0, ranks, k_q, k_g, beta, n_iter, mode="paper"):
    """Eq. 3-6 written out in float64 for one query, fixed number of iterations."""
    g = len(s0)
    s = np.asarray(s0, dtype=np.float64).copy()
    base = np.sort(s)[::-1].copy()  # j-th best initial score (reference mode)

    def alpha(r):
        return 1 - (r - 1) / (g - 1) if r <= k_g else 0.0

    for _ in range(n_iter):
        order = sorted(range(g), key=lambda i: (-s[i], i))
        top = order[:k_q]
        delta = np.array([sum(alpha(int(ranks[p, i])) for p in top) / k_q for i in range(g)])
        if mode == "paper":
            s = s + beta * delta
        else:
            new = np.empty(g)
            for j, item in enumerate(order):
                new[item] = base[j] + beta * delta[item]
            s = new
    return s


# ------------------------------------------------------------------------------------------
# Gallery ranks
# ------------------------------------------------------------------------------------------


def test_rank_dtype_is_smallest_that_fits():
    assert rank_dtype(2) == np.uint8
    assert rank_dtype(254) == np.uint8
    assert rank_dtype(255) == np.uint8  # ranks 1..254, 255 = inf
    assert rank_dtype(256) == np.uint16
    assert rank_dtype(65535) == np.uint16
    assert rank_dtype(65536) == np.uint32
    rng = np.random.default_rng(0)
    assert gallery_ranks(unit(rng, 10)).dtype == np.uint8
    r = gallery_ranks(unit(rng, 300))
    assert r.dtype == np.uint16
    assert np.all(np.diagonal(r) == 65535)


def test_gallery_ranks_near_duplicate_pair_and_ties():
    # d0 and d1 identical (a near-duplicate pair); d2, d3 orthogonal to everything else.
    desc = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    expected = np.array(
        [
            [INF8, 1, 2, 3],  # d1 at distance 0; d2, d3 tie at sqrt(2): by index
            [1, INF8, 2, 3],  # d0 at distance 0 and a lower index than d1 itself: still rank 1
            [1, 2, INF8, 3],  # three-way tie at sqrt(2): by index
            [1, 2, 3, INF8],
        ],
        dtype=np.uint8,
    )
    r = gallery_ranks(desc)
    assert r.dtype == np.uint8
    np.testing.assert_array_equal(r, expected)
    np.testing.assert_array_equal(gallery_ranks(desc, chunk=1), expected)


def test_gallery_ranks_match_definition_and_chunking():
    rng = np.random.default_rng(1)
    desc = unit(rng, 37, 8)
    desc[5] = desc[20]  # duplicates
    desc[30] = desc[20]
    ref = brute_ranks(desc)
    for chunk in (None, 1, 4, 37, 100):
        np.testing.assert_array_equal(gallery_ranks(desc, chunk=chunk), ref)
    # every row is a permutation of 1..G-1 plus inf on the diagonal
    for i, row in enumerate(ref.astype(int)):
        assert sorted(np.delete(row, i)) == list(range(1, 37))


# ------------------------------------------------------------------------------------------
# Hand-checked ICFRR
# ------------------------------------------------------------------------------------------

# G = 4, K_q = K_g = 2, beta = 0.5: alpha[1] = 1, alpha[2] = 1 - 1/3 = 2/3, alpha[3] = 0 (Eq. 5).
# Items 0, 1, 2 belong together, 3 is a distractor that starts second.
R4 = np.array(
    [
        [INF8, 2, 1, 3],
        [1, INF8, 2, 3],
        [1, 2, INF8, 3],
        [3, 1, 2, INF8],
    ],
    dtype=np.uint8,
)
S0_4 = np.array([[-0.1, -0.3, -0.4, -0.2]], dtype=np.float32)  # ranking 0, 3, 1, 2


def run(scores, ranks, max_iter, mode="paper", stop=True, k_q=2, k_g=2, beta=0.5, **kw):
    p = ICFRRParams(k_q=k_q, k_g=k_g, beta=beta, max_iter=max_iter, mode=mode, stop_when_stable=stop)
    res = icfrr_dense(scores, ranks, p, **kw)
    loop = icfrr_loop(scores, ranks, p, scores_are=kw.get("scores_are", "dot"))
    np.testing.assert_array_equal(res.scores, loop.scores)
    np.testing.assert_array_equal(res.iterations, loop.iterations)
    np.testing.assert_array_equal(res.converged, loop.converged)
    return res


def test_hand_example_paper_mode():
    third = 1 / 3
    # t=0 top {0, 3}: Delta = 1/2 [a(inf)+a(3), a(2)+a(1), a(1)+a(2), a(3)+a(inf)] = [0, 5/6, 5/6, 0]
    s1 = [-0.1, -0.3 + 5 / 12, -0.4 + 5 / 12, -0.2]  # ranking 1, 2, 0, 3
    # t=1 top {1, 2}: Delta = 1/2 [a(1)+a(1), a(inf)+a(2), a(2)+a(inf), a(3)+a(3)] = [1, 1/3, 1/3, 0]
    s2 = [s1[0] + 0.5, s1[1] + third / 2, s1[2] + third / 2, -0.2]  # ranking 0, 1, 2, 3
    # t=2 top {0, 1}: Delta = 1/2 [a(inf)+a(1), a(2)+a(inf), a(1)+a(2), a(3)+a(3)] = [1/2, 1/3, 5/6, 0]
    s3 = [s2[0] + 0.25, s2[1] + third / 2, s2[2] + 5 / 12, -0.2]  # ranking 0, 2, 1, 3
    # t=3 top {0, 2}: Delta = 1/2 [a(inf)+a(1), a(2)+a(2), a(1)+a(inf), 0] = [1/2, 2/3, 1/2, 0]
    s4 = [s3[0] + 0.25, s3[1] + third, s3[2] + 0.25, -0.2]  # ranking 0, 2, 1, 3: unchanged
    for t, expected in enumerate([s1, s2, s3, s4], start=1):
        res = run(S0_4, R4, max_iter=t, scores_are="neg_distance")
        np.testing.assert_allclose(res.scores[0], expected, atol=1e-6)
        assert res.iterations[0] == t
        assert res.converged[0] == (t == 4)
    np.testing.assert_allclose(s4, [0.9, 0.78333333, 0.85, -0.2], atol=1e-7)
    assert list(order(np.array([s4], np.float32))[0]) == [0, 2, 1, 3]


def test_hand_example_reference_mode():
    base = [-0.1, -0.2, -0.3, -0.4]  # initial scores by position
    third = 1 / 3
    s1 = [-0.1, -0.3 + 5 / 12, -0.4 + 5 / 12, -0.2]  # = paper mode; ranking 1, 2, 0, 3
    # t=1 top {1, 2}, Delta = [1, 1/3, 1/3, 0]; positions 1..4 hold items 1, 2, 0, 3
    s2 = [base[2] + 0.5, base[0] + third / 2, base[1] + third / 2, base[3]]  # ranking 0, 1, 2, 3
    # t=2 top {0, 1}, Delta = [1/2, 1/3, 5/6, 0]; positions hold 0, 1, 2, 3
    s3 = [base[0] + 0.25, base[1] + third / 2, base[2] + 5 / 12, base[3]]  # ranking 0, 2, 1, 3
    # t=3 top {0, 2}, Delta = [1/2, 2/3, 1/2, 0]; positions hold 0, 2, 1, 3
    s4 = [base[0] + 0.25, base[2] + third, base[1] + 0.25, base[3]]  # ranking 0, 2, 1, 3
    for t, expected in enumerate([s1, s2, s3, s4], start=1):
        res = run(S0_4, R4, max_iter=t, mode="reference", scores_are="neg_distance")
        np.testing.assert_allclose(res.scores[0], expected, atol=1e-6)
    np.testing.assert_allclose(s2, [0.2, 0.0666667, -0.0333333, -0.4], atol=1e-6)


def test_paper_and_reference_equal_after_one_iteration_then_differ():
    p1 = run(S0_4, R4, 1, "paper", scores_are="neg_distance")
    r1 = run(S0_4, R4, 1, "reference", scores_are="neg_distance")
    np.testing.assert_array_equal(p1.scores, r1.scores)  # bit-identical
    p2 = run(S0_4, R4, 2, "paper", scores_are="neg_distance")
    r2 = run(S0_4, R4, 2, "reference", scores_are="neg_distance")
    assert not np.allclose(p2.scores, r2.scores)
    # On random galleries: identical after one update, different rankings later.
    rng = np.random.default_rng(7)
    desc = unit(rng, 60, 8)
    scores = unit(rng, 30, 8) @ desc.T
    ranks = gallery_ranks(desc)
    a = run(scores, ranks, 1, "paper", k_q=6, k_g=6)
    b = run(scores, ranks, 1, "reference", k_q=6, k_g=6)
    np.testing.assert_array_equal(a.scores, b.scores)
    a = run(scores, ranks, 5, "paper", stop=False, k_q=6, k_g=6)
    b = run(scores, ranks, 5, "reference", stop=False, k_q=6, k_g=6)
    differ = np.any(order(a.scores) != order(b.scores), axis=1)
    assert differ.sum() >= 1


def test_convergence_stops_when_ranking_is_stable():
    res = run(S0_4, R4, max_iter=10, scores_are="neg_distance")
    assert res.iterations[0] == 4 and res.converged[0]
    res = run(S0_4, R4, max_iter=3, scores_are="neg_distance")
    assert res.iterations[0] == 3 and not res.converged[0]
    # Paper mode: a stable ranking is not a fixed point (the same Delta is added again).
    # t=4 top {0, 2} again: s5 = s4 + [1/4, 1/3, 1/4, 0] -> ranking 0, 1, 2, 3 (changed).
    res = run(S0_4, R4, max_iter=5, stop=False, scores_are="neg_distance")
    assert res.iterations[0] == 5 and not res.converged[0]
    np.testing.assert_allclose(res.scores[0], [1.15, 0.78333333 + 1 / 3, 1.1, -0.2], atol=1e-6)
    # Reference mode: a stable ranking is a fixed point.
    r4 = run(S0_4, R4, max_iter=4, mode="reference", scores_are="neg_distance")
    r8 = run(S0_4, R4, max_iter=8, mode="reference", stop=False, scores_are="neg_distance")
    np.testing.assert_array_equal(r4.scores, r8.scores)
    assert r8.iterations[0] == 8 and r8.converged[0]
    # max_iter = 0: initial scores.
    res = run(S0_4, R4, max_iter=0, scores_are="neg_distance")
    np.testing.assert_array_equal(res.scores, S0_4)
    assert res.iterations[0] == 0


# G = 5, K_q = K_g = 2, beta = 0.5: alpha[1] = 1, alpha[2] = 3/4; beta * Delta = (sum of alpha) / 4.
# Scores are multiples of 1/16, exact in float32: ties are exact and broken by index.
R5 = np.array(
    [
        [INF8, 3, 4, 1, 2],
        [3, INF8, 4, 2, 1],
        [2, 1, INF8, 3, 4],
        [4, 2, 1, INF8, 3],
        [3, 1, 2, 4, INF8],
    ],
    dtype=np.uint8,
)


def test_ties_are_broken_by_index():
    s0 = np.array([[-0.25, -0.5, -0.5, -0.75, -1.0]], dtype=np.float32)
    # t=0: items 1 and 2 tie at the K_q boundary -> top {0, 1} (not {0, 2}).
    # sums of alpha: item3 a(1)+a(2) = 1.75, item4 a(2)+a(1) = 1.75, others 0
    s1 = [-0.25, -0.5, -0.5, -0.3125, -0.5625]  # ranking 0, 3, 1, 2, 4 -> top {0, 3}
    # sums: [0, a(3)+a(2), a(4)+a(1), a(1)+inf, a(2)+a(3)] = [0, .75, 1, 1, .75]
    s2 = [-0.25, -0.3125, -0.25, -0.0625, -0.375]  # 0 and 2 tie at the boundary -> top {3, 0}
    s3 = [-0.25, -0.125, 0.0, 0.1875, -0.1875]  # same top set, same Delta; ranking 3, 2, 1, 4, 0
    # top {3, 2}: sums [a(4)+a(2), a(2)+a(1), a(1)+inf, inf+a(3), a(3)+a(4)] = [.75, 1.75, 1, 0, 0]
    s4 = [-0.0625, 0.3125, 0.25, 0.1875, -0.1875]
    for t, expected in enumerate([s1, s2, s3, s4], start=1):
        res = run(s0, R5, max_iter=t, scores_are="neg_distance")
        np.testing.assert_array_equal(res.scores[0], np.array(expected, np.float32))
    assert list(order(np.array([s2], np.float32))[0]) == [3, 0, 2, 1, 4]


def test_near_duplicate_gallery_with_dot_products():
    desc = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    ranks = gallery_ranks(desc)  # rows as in test_gallery_ranks_near_duplicate_pair_and_ties
    q = np.array([[0.6, 0.8, 0.0]], dtype=np.float32)
    dots = q @ desc.T  # [0.6, 0.6, 0.8, 0]
    s0 = -np.sqrt(2 - 2 * np.array([0.6, 0.6, 0.8, 0.0]))  # [-0.894, -0.894, -0.632, -1.414]
    # ranking 2, 0, 1, 3 (0 and 1 tie: by index); top {2, 0}
    # Delta = 1/2 [a(r20=1)+inf, a(r21=2)+a(r01=1), inf+a(r02=2), a(3)+a(3)] = [1/2, 5/6, 1/3, 0]
    s1 = s0 + 0.5 * np.array([0.5, 5 / 6, 1 / 3, 0])  # ranking 2, 1, 0, 3
    # top {2, 1}: Delta = 1/2 [a(r20=1)+a(r10=1), a(r21=2)+inf, inf+a(r12=2), 0] = [1, 1/3, 1/3, 0]
    s2 = s1 + 0.5 * np.array([1, 1 / 3, 1 / 3, 0])
    r1 = run(dots, ranks, 1)
    np.testing.assert_allclose(r1.scores[0], s1, atol=1e-6)
    assert list(order(r1.scores)[0]) == [2, 1, 0, 3]
    r2 = run(dots, ranks, 2)
    np.testing.assert_allclose(r2.scores[0], s2, atol=1e-6)
    np.testing.assert_array_equal(run(dots, ranks, 0).scores, neg_distance(dots))


def test_scores_that_are_not_dot_products_are_refused():
    scores = np.array([[1.8, 0.5, 0.2, 0.1]], dtype=np.float32)  # e.g. after a verification bonus
    p = ICFRRParams(k_q=2, k_g=2)
    with pytest.raises(ValueError, match="not dot products"):
        icfrr_dense(scores, R4, p)
    icfrr_dense(np.array([[1.0000001, 0.5, -1.0000001, 0.1]], np.float32), R4, p)  # rounding is fine
    res = icfrr_dense(scores, R4, p, scores_are="neg_distance")  # used as s(0) as they are
    np.testing.assert_array_equal(res.scores, icfrr_loop(scores, R4, p, scores_are="neg_distance").scores)
    out = ICFRRReranker(p, scores_are="neg_distance").rerank(scores, graph=prepare_graph(R4, 2))
    np.testing.assert_array_equal(out, res.scores)


def test_neg_distance():
    d = neg_distance(np.array([1.0, 1.0000001, 0.0, -1.0, 0.5], dtype=np.float32))
    assert d.dtype == np.float32
    np.testing.assert_allclose(d, [0, 0, -np.sqrt(2), -2, -1], atol=1e-7)
    assert not np.signbit(d[0]) and not np.signbit(d[1])  # +0.0, ties with 0.0


# ------------------------------------------------------------------------------------------
# Vectorized implementation == per-query loop == literal formulas; chunking; code paths
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_case():
    rng = np.random.default_rng(11)
    desc = unit(rng, 80, 8)
    desc[10] = desc[40]
    desc[41] = desc[40]
    queries = unit(rng, 33, 8)
    queries[0] = desc[40]
    return queries @ desc.T, gallery_ranks(desc)


@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.parametrize("stop", [True, False])
@pytest.mark.parametrize("k_q,k_g", [(1, 1), (3, 5), (8, 4), (80, 79), (200, 300)])
def test_vectorized_equals_loop_and_chunking(random_case, mode, stop, k_q, k_g):
    scores, ranks = random_case
    p = ICFRRParams(k_q=k_q, k_g=k_g, beta=0.5, max_iter=6, mode=mode, stop_when_stable=stop)
    loop = icfrr_loop(scores, ranks, p)
    for chunk in (None, 1, 7):
        res = icfrr_dense(scores, ranks, p, chunk_size=chunk)
        np.testing.assert_array_equal(res.scores, loop.scores)
        np.testing.assert_array_equal(res.iterations, loop.iterations)
        np.testing.assert_array_equal(res.converged, loop.converged)
        assert res.scores.dtype == np.float32


def test_loop_matches_literal_equations(random_case):
    scores, ranks = random_case
    s0 = neg_distance(scores)
    for mode in ("paper", "reference"):
        for k_q, k_g, beta in ((3, 5, 0.5), (6, 2, 0.3)):
            p = ICFRRParams(k_q=k_q, k_g=k_g, beta=beta, max_iter=3, mode=mode, stop_when_stable=False)
            res = icfrr_dense(scores, ranks, p)
            for qi in range(0, 33, 4):
                expected = literal_icfrr(s0[qi], ranks, k_q, k_g, beta, 3, mode)
                np.testing.assert_allclose(res.scores[qi], expected, atol=2e-6)


def test_dense_and_sparse_products_agree(random_case, monkeypatch):
    scores, ranks = random_case
    p = ICFRRParams(k_q=8, k_g=8, beta=0.5, max_iter=5, stop_when_stable=False)
    monkeypatch.setattr(icfrr_mod, "_DENSE_FLOPS", 1e30)  # dense always looks cheaper
    dense = icfrr(scores, prepare_graph(ranks, 8), p)
    monkeypatch.setattr(icfrr_mod, "_DENSE_FLOPS", 1e-30)  # sparse always
    sparse = icfrr(scores, prepare_graph(ranks, 8), p)
    np.testing.assert_array_equal(dense.scores, sparse.scores)
    np.testing.assert_array_equal(dense.scores, icfrr_loop(scores, ranks, p).scores)


def test_prepared_graph_is_reusable_and_checked(random_case):
    scores, ranks = random_case
    p = ICFRRParams(k_q=4, k_g=4)
    graph = prepare_graph(ranks, 4)
    np.testing.assert_array_equal(icfrr(scores, graph, p).scores, icfrr_dense(scores, ranks, p).scores)
    with pytest.raises(ValueError, match="k_g"):
        icfrr(scores, graph, ICFRRParams(k_q=4, k_g=5))
    with pytest.raises(TypeError, match="ICFRRGraph"):
        icfrr(scores, ranks, p)  # a dense matrix: the product builds graphs from neighbour lists
    with pytest.raises(ValueError, match="columns"):
        icfrr(scores[:, :-1], graph, p)
    with pytest.raises(ValueError):
        ICFRRParams(k_q=0, k_g=1)
    with pytest.raises(ValueError):
        ICFRRParams(k_q=1, k_g=1, mode="other")


def test_degenerate_sizes():
    p = ICFRRParams(k_q=2, k_g=2)
    one = gallery_ranks(np.array([[1.0, 0.0]], np.float32))
    assert one.shape == (1, 1) and one[0, 0] == 255
    res = icfrr_dense(np.array([[0.5], [1.0]], np.float32), one, p)
    np.testing.assert_array_equal(res.scores, neg_distance(np.array([[0.5], [1.0]], np.float32)))
    assert res.converged.all()
    res = icfrr_dense(np.empty((0, 4), np.float32), R4, p)
    assert res.scores.shape == (0, 4)


# ------------------------------------------------------------------------------------------
# Helpers: deterministic orderings, parameters, reranker
# ------------------------------------------------------------------------------------------


def test_order_breaks_ties_by_index():
    rng = np.random.default_rng(12)
    s = rng.integers(-3, 3, size=(20, 50)).astype(np.float32)
    s[0, :5] = -0.0
    s[0, 5:10] = 0.0
    expected = np.argsort(-s, axis=1, kind="stable")
    np.testing.assert_array_equal(order(s), expected)
    for k in (0, 1, 3, 10, 13, 50, 60):
        np.testing.assert_array_equal(order(s, k), expected[:, : min(k, 50)])


def test_suggest_params_rule_of_thumb():
    labels = ["a"] * 4 + ["b"] * 4 + ["c"] * 6 + ["d"] * 2 + ["e"] * 9  # median 4 images
    p = suggest_params(labels)
    assert (p.k_q, p.k_g, p.beta, p.mode) == (2, 2, 0.5, "paper")
    assert suggest_params([1, 2, 3]).k_q == 1  # one image per instance: at least 1
    assert suggest_params([1, 1, 1, 2, 2, 2]).k_q == 2  # 1.5 rounds half up
    with pytest.raises(ValueError):
        suggest_params([])


def test_reranker_protocol(random_case):
    scores, ranks = random_case
    labels = np.arange(80) // 4  # 4 images per instance -> K_q = K_g = 2
    expected = icfrr_dense(scores, ranks, ICFRRParams(k_q=2, k_g=2)).scores
    rr = ICFRRReranker()
    assert rr.name == "icfrr"
    out = rr.rerank(scores, graph=prepare_graph(ranks, 2), labels=labels, descriptors=None,
                    query_descriptors=None, anything_else=1)
    np.testing.assert_array_equal(out, expected)
    explicit = ICFRRReranker(ICFRRParams(k_q=3, k_g=3, mode="reference"))
    np.testing.assert_array_equal(
        explicit.rerank(scores, graph=prepare_graph(ranks, 3)),
        icfrr_dense(scores, ranks, ICFRRParams(k_q=3, k_g=3, mode="reference")).scores,
    )
    with pytest.raises(ValueError, match="labels"):
        ICFRRReranker().rerank(scores, graph=prepare_graph(ranks, 2))
    with pytest.raises(ValueError, match="graph"):
        ICFRRReranker(ICFRRParams(k_q=2, k_g=2)).rerank(scores, labels=labels)
