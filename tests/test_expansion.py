"""alpha-QE and DBA (Radenovic et al. 2018) on hand-checked examples."""

import numpy as np
import pytest

from museum_search.core.answer._expansion import AQEReranker, DBAReranker, alpha_qe, dba

# Unit vectors in the plane.
G2 = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]], dtype=np.float32)
Q2 = np.array([[0.8, 0.6]], dtype=np.float32)  # dots with G2: [0.8, 0.96, 0.6, -0.8]


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def rand_unit(rng, n, d=12):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_alpha_qe_hand_example():
    # top-2: d1 (0.96), d0 (0.8); weights 0.96^3 = 0.884736, 0.8^3 = 0.512
    v = [0.8 + 0.884736 * 0.6 + 0.512 * 1.0, 0.6 + 0.884736 * 0.8 + 0.512 * 0.0]
    out = alpha_qe(Q2, G2, None, n=2, alpha=3.0)
    assert out.dtype == np.float32 and out.shape == (1, 2)
    np.testing.assert_allclose(out[0], unit(v), atol=1e-6)
    # the scores only choose the neighbours: same result with precomputed dot products
    np.testing.assert_allclose(alpha_qe(Q2, G2, Q2 @ G2.T, n=2, alpha=3.0), out, atol=1e-7)


def test_alpha_qe_negative_similarity_gets_zero_weight():
    # n=4 also takes d2 (0.6 -> 0.216) and d3 (-0.8 -> weight 0)
    v = [0.8 + 0.884736 * 0.6 + 0.512, 0.6 + 0.884736 * 0.8 + 0.216 * 1.0]
    np.testing.assert_allclose(alpha_qe(Q2, G2, n=4, alpha=3.0)[0], unit(v), atol=1e-6)
    np.testing.assert_array_equal(alpha_qe(Q2, G2, n=4, alpha=3.0), alpha_qe(Q2, G2, n=3, alpha=3.0))
    np.testing.assert_array_equal(alpha_qe(Q2, G2, n=10, alpha=3.0), alpha_qe(Q2, G2, n=3, alpha=3.0))


def test_alpha_zero_is_average_query_expansion():
    v = Q2[0] + G2[1] + G2[0]
    np.testing.assert_allclose(alpha_qe(Q2, G2, n=2, alpha=0.0)[0], unit(v), atol=1e-6)


def test_alpha_qe_neighbours_from_given_scores_weights_from_dots():
    scores = np.array([[0.0, 0.0, 5.0, 4.0]], dtype=np.float32)  # e.g. another reranker's scores
    # neighbours d2, d3 chosen by the scores; weights from the dots 0.6^3 and max(-0.8, 0)^3 = 0
    v = Q2[0] + 0.216 * G2[2]
    np.testing.assert_allclose(alpha_qe(Q2, G2, scores, n=2, alpha=3.0)[0], unit(v), atol=1e-6)
    with pytest.raises(ValueError):
        alpha_qe(Q2, G2, scores[:, :3])


def test_alpha_qe_ties_take_the_lower_index():
    g = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    q = unit([[0.6, 0.8]]).astype(np.float32)
    # d1 and d2 tie (0.8): n=1 takes d1; the result is the same vector either way, so check the
    # choice through the scores argument, where d1 and d2 differ in the score only by index
    out = alpha_qe(q, g, n=1, alpha=1.0)
    np.testing.assert_allclose(out[0], unit(q[0] + 0.8 * g[1]), atol=1e-6)
    g3 = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    tie_scores = np.array([[0.0, 1.0, 1.0]], dtype=np.float32)
    out = alpha_qe(q, g3, tie_scores, n=1, alpha=1.0)  # d1 (index 1) beats d2 (index 2)
    np.testing.assert_allclose(out[0], unit(q[0] + 0.8 * g3[1]), atol=1e-6)


def test_n_zero_is_identity():
    rng = np.random.default_rng(0)
    q, g = rand_unit(rng, 5), rand_unit(rng, 20)
    np.testing.assert_array_equal(alpha_qe(q, g, n=0), q)
    np.testing.assert_array_equal(dba(g, n=0), g)


def test_outputs_are_normalized():
    rng = np.random.default_rng(1)
    q, g = rand_unit(rng, 17), rand_unit(rng, 90)
    for n, a in ((1, 3.0), (5, 3.0), (5, 0.0), (90, 1.0)):
        np.testing.assert_allclose(np.linalg.norm(alpha_qe(q, g, n=n, alpha=a), axis=1), 1, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(dba(g, n=n, alpha=a), axis=1), 1, atol=1e-6)


def test_dba_hand_example():
    g = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    # n=1, alpha=1: d0 -> d1 (0.8); d1 -> d0 (0.8 beats 0.6); d2 -> d1 (0.6); itself excluded
    expected = unit([g[0] + 0.8 * g[1], g[1] + 0.8 * g[0], g[2] + 0.6 * g[1]])
    out = dba(g, n=1, alpha=1.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-6)
    # n=2, alpha=3: d0 -> d1 (0.512), d2 (0); d1 -> d0 (0.512), d2 (0.216); d2 -> d1 (0.216), d0 (0)
    expected = unit([g[0] + 0.512 * g[1], g[1] + 0.512 * g[0] + 0.216 * g[2], g[2] + 0.216 * g[1]])
    np.testing.assert_allclose(dba(g, n=2, alpha=3.0), expected, atol=1e-6)


def test_dba_near_duplicates_and_chunking():
    # d0 == d1: each is the other's neighbour (self masked explicitly, not assumed first)
    g = np.array([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    out = dba(g, n=1, alpha=1.0)
    np.testing.assert_allclose(out[0], [1.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(out[1], [1.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(out[2], unit(g[2] + 0.6 * g[0]), atol=1e-6)  # tie d0/d1: d0
    rng = np.random.default_rng(2)
    big = rand_unit(rng, 57)
    big[3] = big[30]
    for n in (1, 3):
        np.testing.assert_array_equal(dba(big, n=n, chunk=1), dba(big, n=n))
        np.testing.assert_array_equal(dba(big, n=n, chunk=10), dba(big, n=n))


def test_rerankers_share_one_call_signature():
    rng = np.random.default_rng(3)
    q, g = rand_unit(rng, 6), rand_unit(rng, 40)
    scores = q @ g.T
    context = {"descriptors": g, "gallery_ranks": None, "labels": np.arange(40) // 2,
               "query_descriptors": q, "extra": "x"}
    aqe = AQEReranker(n=3, alpha=2.0)
    assert aqe.name == "aqe"
    np.testing.assert_allclose(aqe.rerank(scores, **context), alpha_qe(q, g, scores, 3, 2.0) @ g.T, atol=1e-6)
    d = DBAReranker(n=2, alpha=3.0)
    assert d.name == "dba"
    out = d.rerank(scores, **context)
    np.testing.assert_allclose(out, q @ dba(g, 2, 3.0).T, atol=1e-6)
    assert out.shape == (6, 40) and out.dtype == np.float32
    assert d.augmented(g) is d.augmented(g)  # cached for the same gallery array
    cached = dba(g, 2, 3.0)
    np.testing.assert_array_equal(d.rerank(scores, query_descriptors=q, dba_gallery=cached), q @ cached.T)
    with pytest.raises(ValueError):
        aqe.rerank(scores, descriptors=g)
    with pytest.raises(ValueError):
        AQEReranker(n=-1)
