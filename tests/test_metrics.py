"""Retrieval metrics checked against values printed in the papers and against independent tools.

* Table 1 of paper 001 (MNRO paper): AP, NMRR, MNRO of ranked lists A-E to 4 decimals.
* trec_eval (``pytrec_eval``) and ``ranx``: MAP, P@k, RR, R-precision and nDCG on many random
  queries with distinct scores, truncated runs and relevant references that are not retrieved.
* ``scipy.stats.kendalltau`` (tau-b) with ties; ``sklearn.metrics.ndcg_score``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from museum_search.core.evaluation import _metrics as m
from museum_search.core.ranking import order

# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def rel_from_ranks(rank_lists, n):
    """Boolean (Q, n) matrix with True at the given 1-based ranks."""
    rel = np.zeros((len(rank_lists), n), dtype=bool)
    for q, ranks in enumerate(rank_lists):
        rel[q, np.asarray(ranks) - 1] = True
    return rel


def random_collection(rng, n_queries, n_refs, n_instances, depth, *, graded=False, open_frac=0.1):
    """Random collection + queries; truncated rankings of ``depth`` with distinct scores.

    A fraction ``open_frac`` of the queries asks for an instance without reference (open set).

    Returns scores, rankings, labels, relevant (list of sets or dicts).
    """
    labels = rng.integers(0, n_instances, size=n_refs)
    relevant = []
    for _ in range(n_queries):
        n_inst = int(rng.integers(1, 4))
        inst = rng.choice(n_instances, size=n_inst, replace=False)
        if rng.random() < open_frac:
            inst = np.array([n_instances + 1000])  # no reference image of this instance
        if graded:
            relevant.append({int(i): int(rng.integers(1, 4)) for i in inst})
        else:
            relevant.append({int(i) for i in inst})
    # distinct scores: a random permutation of distinct values per query
    scores = np.stack([rng.permutation(n_refs) for _ in range(n_queries)]).astype(np.float64)
    scores = scores / n_refs + rng.uniform(0, 1e-6, size=scores.shape)
    rankings = order(scores, depth).astype(np.int64)
    return scores, rankings, labels, relevant


def trec_dicts(scores, rankings, labels, relevant):
    """qrels/run dicts for trec_eval/ranx: documents are reference indices."""
    qrels, run = {}, {}
    for q in range(rankings.shape[0]):
        rset = relevant[q]
        grades = rset if isinstance(rset, dict) else {lab: 1 for lab in rset}
        qr = {f"d{j}": grades[int(lab)] for j, lab in enumerate(labels) if int(lab) in grades}
        qrels[f"q{q}"] = qr
        run[f"q{q}"] = {f"d{j}": float(scores[q, j]) for j in rankings[q]}
    return qrels, run


# ----------------------------------------------------------------------------------------------
# Table 1 of paper 001
# ----------------------------------------------------------------------------------------------

# Fig. 9: 1-based ranks of the NG = 5 relevant images, N = 100.
TABLE1_RANKS = {
    "A": [1, 2, 3, 4, 5],
    "B": [1, 3, 4, 5, 6],
    "C": [1, 2, 3, 4, 100],
    "D": [1, 2, 3, 30, 31],
    "E": [1, 2, 3, 40, 41],
}
# Table 1 as printed: AP(q), NMRR(q), MNRO(q)
TABLE1 = {
    "A": (1.0000, 0.0000, 0.0000),
    "B": (0.8100, 0.0364, 0.0314),
    "C": (0.8100, 0.1818, 0.2000),
    "D": (0.6589, 0.3727, 0.3988),
    "E": (0.6444, 0.3727, 0.3999),
}


@pytest.fixture
def table1():
    rel = rel_from_ranks(list(TABLE1_RANKS.values()), 100)
    n_rel = np.full(len(TABLE1_RANKS), 5)
    expected = np.array(list(TABLE1.values()))
    return rel, n_rel, expected


def test_table1_average_precision(table1):
    rel, n_rel, expected = table1
    np.testing.assert_array_equal(np.round(m.average_precision(rel, n_rel), 4), expected[:, 0])


def test_table1_nmrr_with_k_20(table1):
    # README: Table 1 reproduces with K = 4·NG = 20 (GTM large enough not to bind).
    rel, n_rel, expected = table1
    got = m.nmrr(rel, n_rel, gtm=np.inf)
    np.testing.assert_array_equal(np.round(got, 4), expected[:, 1])
    # The same with X fixed to 4 and GTM = 10 (2·GTM = 20 = 4·NG).
    np.testing.assert_allclose(m.nmrr(rel, n_rel, x=4, gtm=10), got, rtol=0, atol=1e-15)
    # With the paper's default GTM = max NG = 5 of this one-query "data set", K = 10 and the
    # printed values do not come out: that is why the README fixes K = 20 for this table.
    assert not np.allclose(np.round(m.nmrr(rel, n_rel), 4), expected[:, 1])


@pytest.mark.parametrize("literal", [False, True])
def test_table1_mnro(table1, literal):
    # g = NG/N = 0.05 >= 0.01, so K = 4·NG = 20 under both readings of Eq. 15.
    rel, n_rel, expected = table1
    got = m.mnro(rel, n_rel, literal_eq15=literal)
    np.testing.assert_array_equal(np.round(got, 4), expected[:, 2])


def test_table1_orderings_match_paper(table1):
    # The "Rank" columns of Table 1: AP ties B/C, NMRR ties D/E, MNRO separates all five.
    rel, n_rel, _ = table1
    ap = m.average_precision(rel, n_rel)
    nm = m.nmrr(rel, n_rel, gtm=np.inf)
    mn = m.mnro(rel, n_rel)
    assert ap[1] == pytest.approx(ap[2])
    assert nm[3] == pytest.approx(nm[4])
    assert np.all(np.diff(mn) > 0)


def test_table1_via_summarize(table1):
    rel, n_rel, expected = table1
    s = m.summarize(rel, n_rel, gtm=np.inf)
    assert s["queries"] == 5 and s["open_set_queries"] == 0
    np.testing.assert_array_equal(np.round(s["per_query"]["map"], 4), expected[:, 0])
    np.testing.assert_array_equal(np.round(s["per_query"]["anmrr"], 4), expected[:, 1])
    np.testing.assert_array_equal(np.round(s["per_query"]["amnro"], 4), expected[:, 2])
    assert s["map"] == pytest.approx(expected[:, 0].mean(), abs=5e-5)
    assert s["amnro"] == pytest.approx(m.amnro(rel, n_rel))


# ----------------------------------------------------------------------------------------------
# MNRO details: NRO curve, K, literal vs continuous Eq. 15
# ----------------------------------------------------------------------------------------------


def test_nro_design_points():
    # Paper 001: NRO = 0.95 at position K, 0.5 at ARANK = 0.5, 0 when Rank(k) = k.
    k_cut = 20.0
    assert m.nro(20, 1, k_cut) == pytest.approx(0.95, abs=1e-4)
    assert m.nro(1 + 0.5 * (k_cut - 1), 1, k_cut) == pytest.approx(0.5, abs=1e-4)
    assert m.nro(3, 3, k_cut) == 0.0
    assert 0 < m.nro(2, 1, k_cut) < 1e-3
    assert m.nro(10_000, 1, k_cut) == pytest.approx(1.0)
    # the printed constants solve the two design conditions to 4 decimals
    c = 2 * math.log(math.log(0.95) / math.log(0.5))
    b = math.log(0.5) / math.exp(c / 2)
    assert round(b, 4) == m.MNRO_B and round(c, 4) == m.MNRO_C


def test_mnro_cutoff_readings():
    ng = np.array([1, 5, 5, 5, 5])
    # g >= 0.01: both readings give 4·NG
    np.testing.assert_array_equal(m.mnro_cutoff([5], 500), [20.0])
    np.testing.assert_array_equal(m.mnro_cutoff([5], 500, literal_eq15=True), [20.0])
    # below g = 0.01: continuous 0.04·N, literal 0.04·N·NG
    np.testing.assert_allclose(m.mnro_cutoff([5], 1000), [40.0])
    np.testing.assert_allclose(m.mnro_cutoff([5], 1000, literal_eq15=True), [200.0])
    # continuity at g = 0.01 for the default, jump for the literal reading
    assert m.mnro_cutoff([5], 501)[0] == pytest.approx(20.04)
    assert m.mnro_cutoff([5], 501, literal_eq15=True)[0] == pytest.approx(100.2)
    # NG = 1: the readings coincide
    np.testing.assert_allclose(
        m.mnro_cutoff([1], 10_000), m.mnro_cutoff([1], 10_000, literal_eq15=True)
    )
    assert np.isnan(m.mnro_cutoff([0], 100)[0])
    assert m.mnro_cutoff(ng, 100).shape == (5,)


def test_literal_and_continuous_mnro_differ_only_where_expected():
    n = 1000
    rel = rel_from_ranks(
        [
            [1, 2, 3, 4, 5],  # perfect: 0 under both
            [1, 30, 60, 90, 120],  # NG = 5, g = 0.005: K = 40 vs 200 -> differ
            [25],  # NG = 1: readings coincide
        ],
        n,
    )
    n_rel = np.array([5, 5, 1])
    cont = m.mnro(rel, n_rel)
    lit = m.mnro(rel, n_rel, literal_eq15=True)
    assert cont[0] == lit[0] == 0.0
    assert lit[1] < cont[1]  # larger K -> later ranks are penalised less
    # by hand: k-th relevant at rank r, K = 40 (continuous) / 200 (literal)
    for big_k, got in ((40.0, cont[1]), (200.0, lit[1])):
        ranks = [30, 60, 90, 120]
        hand = sum(math.exp(-9.3668 * math.exp(-5.2074 * (r - 1) / (big_k - 1))) for r in ranks) / 5
        assert got == pytest.approx(hand, rel=1e-12)
    assert cont[2] == pytest.approx(lit[2], rel=1e-15)
    # at g >= 0.01 the readings agree
    rel2 = rel_from_ranks([[1, 30, 60, 90, 120]], 200)
    assert m.mnro(rel2, [5])[0] == m.mnro(rel2, [5], literal_eq15=True)[0]


def test_mnro_uses_collection_size_for_generality():
    # the same ranks in a larger collection: K grows (0.04·N), MNRO falls
    rel_small = rel_from_ranks([[50]], 1000)  # g = 0.001, K = 40
    rel_big = rel_from_ranks([[50]], 10_000)  # g = 0.0001, K = 400
    assert m.mnro(rel_big, [1])[0] < m.mnro(rel_small, [1])[0]
    assert m.mnro(rel_small, [1])[0] == pytest.approx(
        math.exp(-9.3668 * math.exp(-5.2074 * 49 / 39))
    )


# ----------------------------------------------------------------------------------------------
# NMRR and NAR details
# ----------------------------------------------------------------------------------------------


def test_nmrr_by_hand_and_x_rule():
    # NG = 2, GTM = 2 -> K = min(8, 4) = 4: rank 3 counts 3, rank 7 counts 1.25·4 = 5
    rel = rel_from_ranks([[3, 7]], 20)
    avr = (3 + 5) / 2
    hand = (avr - 0.5 * 3) / (1.25 * 4 - 0.5 * 3)
    assert m.nmrr(rel, [2])[0] == pytest.approx(hand)
    # all beyond K: NMRR = 1 exactly; perfect: 0
    assert m.nmrr(rel_from_ranks([[15, 20]], 20), [2], gtm=np.inf)[0] == pytest.approx(1.0)
    assert m.nmrr(rel_from_ranks([[1, 2]], 20), [2])[0] == 0.0
    # NG > 50 -> X = 2 (MPEG-7): K = 2·60 = 120; with gtm huge only X binds
    ranks = list(range(1, 60)) + [125]
    rel = rel_from_ranks([ranks], 200)
    k_cut = 120
    eff = list(range(1, 60)) + [1.25 * k_cut]
    hand = (np.mean(eff) - 0.5 * 61) / (1.25 * k_cut - 0.5 * 61)
    assert m.nmrr(rel, [60], gtm=np.inf)[0] == pytest.approx(hand)
    with pytest.raises(ValueError, match="gtm"):
        m.nmrr(rel, [60], gtm=10)


def test_nar_by_hand():
    rel = rel_from_ranks([[1, 3, 4, 5, 6], [1, 2, 3, 4, 5], [100]], 100)
    got = m.nar(rel, [5, 5, 1])
    np.testing.assert_allclose(got, [(19 - 15) / 500, 0.0, 99 / 100])
    assert m.anar(rel, [5, 5, 1]) == pytest.approx(np.mean(got))


def test_truncated_rankings_match_pessimistic_completion():
    rng = np.random.default_rng(5)
    n_col = 300
    full = np.zeros((40, n_col), dtype=bool)
    n_rel = rng.integers(1, 12, size=40)
    for q in range(40):
        full[q, rng.choice(n_col, n_rel[q], replace=False)] = True
    depth = 60
    trunc = full[:, :depth].copy()
    # pessimistic completion: the relevant references beyond depth go to the very end
    completed = np.zeros_like(full)
    completed[:, :depth] = trunc
    for q in range(40):
        missing = n_rel[q] - trunc[q].sum()
        if missing:
            completed[q, n_col - missing :] = True
    kw = dict(n_collection=n_col)
    np.testing.assert_allclose(m.nar(trunc, n_rel, **kw), m.nar(completed, n_rel))
    np.testing.assert_allclose(m.mnro(trunc, n_rel, **kw), m.mnro(completed, n_rel))
    np.testing.assert_allclose(
        m.nmrr(trunc, n_rel, gtm=20, **kw), m.nmrr(completed, n_rel, gtm=20)
    )
    # P@k within the row does not depend on the completion; AP counts the missing ones as 0
    np.testing.assert_allclose(
        m.precision_at_k(trunc, n_rel, 10), m.precision_at_k(completed, n_rel, 10)
    )
    assert np.all(m.average_precision(trunc, n_rel) <= m.average_precision(completed, n_rel))
    # a truncated ranking without n_collection is inconsistent with n_rel
    with pytest.raises(ValueError, match="n_collection"):
        m.mnro(trunc, n_rel)


# ----------------------------------------------------------------------------------------------
# Against trec_eval (pytrec_eval) and ranx on random rankings
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_binary():
    rng = np.random.default_rng(20240611)
    scores, rankings, labels, relevant = random_collection(
        rng, n_queries=300, n_refs=400, n_instances=60, depth=80
    )
    rel, n_rel = m.relevance_matrix(rankings, labels, relevant)
    keep = n_rel > 0  # trec_eval/ranx only see queries with relevant documents
    return scores, rankings, labels, relevant, rel, n_rel, keep


def test_random_fixture_has_the_hard_cases(random_binary):
    *_, rel, n_rel, keep = random_binary
    found = rel.sum(axis=1)
    assert (found < n_rel).sum() > 50  # relevant references not retrieved
    assert len(np.unique(n_rel[keep])) > 10  # varying numbers of relevant references
    assert (found == 0).sum() > 0 and (n_rel == 0).sum() > 0  # nothing retrieved / open set


def test_against_trec_eval(random_binary):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    scores, rankings, labels, relevant, rel, n_rel, keep = random_binary
    qrels, run = trec_dicts(scores, rankings, labels, relevant)
    qrels = {q: d for q, d in qrels.items() if d}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"map", "P", "recip_rank", "Rprec", "num_rel"})
    res = ev.evaluate(run)
    idx = np.flatnonzero(keep)
    assert len(res) == idx.size

    def col(name):
        return np.array([res[f"q{q}"][name] for q in idx])

    np.testing.assert_array_equal(col("num_rel"), n_rel[idx])
    np.testing.assert_allclose(m.average_precision(rel, n_rel)[idx], col("map"), atol=1e-12)
    for k in (5, 10, 20, 100):
        np.testing.assert_allclose(m.precision_at_k(rel, n_rel, k)[idx], col(f"P_{k}"), atol=1e-12)
    np.testing.assert_allclose(m.reciprocal_rank(rel, n_rel)[idx], col("recip_rank"), atol=1e-12)
    np.testing.assert_allclose(m.r_precision(rel, n_rel)[idx], col("Rprec"), atol=1e-12)
    # the means: MAP over evaluated queries is trec_eval's map over its queries
    assert m.mean_average_precision(rel, n_rel) == pytest.approx(col("map").mean(), abs=1e-12)
    s = m.summarize(rel, n_rel, ks=(5, 10), n_collection=labels.size)
    assert s["queries"] == idx.size
    assert s["open_set_queries"] == (~keep).sum()
    assert s["map"] == pytest.approx(col("map").mean(), abs=1e-12)
    assert s["p@10"] == pytest.approx(col("P_10").mean(), abs=1e-12)


def test_against_ranx(random_binary):
    ranx = pytest.importorskip("ranx")
    scores, rankings, labels, relevant, rel, n_rel, keep = random_binary
    qrels, run = trec_dicts(scores, rankings, labels, relevant)
    qrels = {q: d for q, d in qrels.items() if d}
    run = {q: d for q, d in run.items() if q in qrels}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ranx.evaluate(
            ranx.Qrels(qrels),
            ranx.Run(run),
            ["map", "precision@1", "precision@5", "precision@20", "mrr", "r-precision"],
            return_mean=False,
        )
    # ranx returns queries in its own (sorted qrels) order
    order = [int(q[1:]) for q in ranx.Qrels(qrels).keys()]
    np.testing.assert_allclose(m.average_precision(rel, n_rel)[order], res["map"], atol=1e-12)
    for k in (1, 5, 20):
        ours = m.precision_at_k(rel, n_rel, k)[order]
        np.testing.assert_allclose(ours, res[f"precision@{k}"], atol=1e-12)
    np.testing.assert_allclose(m.reciprocal_rank(rel, n_rel)[order], res["mrr"], atol=1e-12)
    np.testing.assert_allclose(m.r_precision(rel, n_rel)[order], res["r-precision"], atol=1e-12)
    assert m.mean_precision_at_1(rel, n_rel) == pytest.approx(np.mean(res["precision@1"]))


# ----------------------------------------------------------------------------------------------
# nDCG (paper 002) against scikit-learn, trec_eval and ranx
# ----------------------------------------------------------------------------------------------


def test_ndcg_against_sklearn_full_rankings():
    # Definitions agree when: sklearn is given gains 2**V - 1 as y_true (it uses y_true as the
    # gain), the scores have no ties (sklearn averages tied gains), the ranking covers the whole
    # collection (both take the ideal DCG over all documents), and every query has a relevant
    # document (sklearn gives 0 for an all-zero y_true, here it is NaN and excluded).
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(7)
    q, n = 200, 60
    grades = rng.choice(4, size=(q, n), p=[0.7, 0.1, 0.1, 0.1])
    grades[grades.sum(axis=1) == 0, 0] = 3
    scores = rng.permutation(q * n).reshape(q, n).astype(float)  # distinct
    ranked = order(scores)
    rel = np.take_along_axis(grades, ranked, axis=1)
    for p in (1, 5, 10, 60):
        ours = m.ndcg_at_p(rel, p)
        theirs = np.array(
            [ndcg_score([2.0 ** grades[i] - 1], [scores[i]], k=p) for i in range(q)]
        )
        np.testing.assert_allclose(ours, theirs, atol=1e-12)
        assert m.mean_ndcg_at_p(rel, p) == pytest.approx(
            ndcg_score(2.0 ** grades - 1, scores, k=p), abs=1e-12
        )
    # where they differ: sklearn's default linear gain
    lin = np.array([ndcg_score([grades[i]], [scores[i]], k=10) for i in range(q)])
    assert not np.allclose(m.ndcg_at_p(rel, 10), lin)


def test_ndcg_truncated_against_trec_eval_and_ranx():
    rng = np.random.default_rng(11)
    scores, rankings, labels, relevant = random_collection(
        rng, n_queries=150, n_refs=300, n_instances=40, depth=50, graded=True
    )
    rel, n_rel = m.relevance_matrix(rankings, labels, relevant)
    ideal = m.ideal_relevance(labels, relevant)
    keep = n_rel > 0
    idx = np.flatnonzero(keep)
    assert np.all(np.isnan(m.ndcg_at_p(rel, 10, ideal)[~keep]))
    qrels, run = trec_dicts(scores, rankings, labels, relevant)
    qrels = {q: d for q, d in qrels.items() if d}
    # ranx "ndcg_burges" is the 2**V - 1 gain form of paper 002
    ranx = pytest.importorskip("ranx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ranx.evaluate(
            ranx.Qrels(qrels),
            ranx.Run({q: d for q, d in run.items() if q in qrels}),
            ["ndcg_burges@5", "ndcg_burges@20"],
            return_mean=False,
        )
    order = [int(q[1:]) for q in ranx.Qrels(qrels).keys()]
    for p in (5, 20):
        ours = m.ndcg_at_p(rel, p, ideal)[order]
        np.testing.assert_allclose(ours, res[f"ndcg_burges@{p}"], atol=1e-12)
    # trec_eval uses the qrel value as the gain: give it 2**V - 1
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels_gain = {q: {d: 2**v - 1 for d, v in qd.items()} for q, qd in qrels.items()}
    res = pytrec_eval.RelevanceEvaluator(qrels_gain, {"ndcg_cut"}).evaluate(run)
    for p in (5, 10, 30):
        theirs = np.array([res[f"q{q}"][f"ndcg_cut_{p}"] for q in idx])
        np.testing.assert_allclose(m.ndcg_at_p(rel, p, ideal)[idx], theirs, atol=1e-12)
    # without the collection-wide ideal, a truncated row overestimates nDCG
    assert np.nanmean(m.ndcg_at_p(rel, 30)) > np.nanmean(m.ndcg_at_p(rel, 30, ideal))


def test_ndcg_by_hand():
    rel = np.array([[3, 0, 2, 1]])
    dcg = 7 + 0 + 3 / math.log2(4) + 1 / math.log2(5)
    idcg = 7 + 3 / math.log2(3) + 1 / math.log2(4)
    assert m.ndcg_at_p(rel, 4)[0] == pytest.approx(dcg / idcg)
    assert np.isnan(m.ndcg_at_p(np.zeros((1, 4), int), 4)[0])


# ----------------------------------------------------------------------------------------------
# mAP@p (paper 002), MP@1 and P@k by hand
# ----------------------------------------------------------------------------------------------


def test_map_at_p_by_hand():
    # ranks 1, 3, 6 relevant, 10 relevant in the collection
    rel = rel_from_ranks([[1, 3, 6], [4], [2, 3]], 8)
    n_rel = np.array([10, 1, 2])
    # p = 5: query 0 has ranks 1, 3 in the top 5 -> (1/1 + 2/3) / 2 (denominator: relevant in top p)
    got = m.average_precision_at_p(rel, n_rel, 5)
    np.testing.assert_allclose(got, [(1 + 2 / 3) / 2, 1 / 4, (1 / 2 + 2 / 3) / 2])
    # nothing relevant in the top p -> 0
    assert m.average_precision_at_p(rel, n_rel, 3)[1] == 0.0
    assert m.map_at_p(rel, n_rel, 5) == pytest.approx(np.mean(got))
    # differs from AP (which divides by all 10 relevant references)
    assert m.average_precision(rel, n_rel)[0] == pytest.approx((1 + 2 / 3 + 3 / 6) / 10)
    # with p >= N and everything retrieved, AP@p equals AP
    np.testing.assert_allclose(
        m.average_precision_at_p(rel[1:], n_rel[1:], 8), m.average_precision(rel[1:], n_rel[1:])
    )


def test_mp1_by_hand():
    rel = np.array(
        [
            [1, 0, 0],
            [0, 1, 0],
            [1, 1, 1],
            [0, 0, 0],  # relevant exists but not retrieved: P@1 = 0
            [0, 0, 0],  # open set: excluded
        ],
        dtype=bool,
    )
    n_rel = np.array([1, 2, 3, 4, 0])
    p1 = m.precision_at_k(rel, n_rel, 1)
    np.testing.assert_array_equal(p1[:4], [1, 0, 1, 0])
    assert np.isnan(p1[4])
    assert m.mean_precision_at_1(rel, n_rel) == 0.5  # 2 of 4 evaluated queries
    np.testing.assert_allclose(m.precision_at_k(rel, n_rel, 2)[:4], [0.5, 0.5, 1.0, 0.0])
    # k beyond the row: the denominator stays k (trec_eval)
    assert m.precision_at_k(rel, n_rel, 10)[2] == pytest.approx(0.3)
    np.testing.assert_allclose(m.reciprocal_rank(rel, n_rel)[:4], [1, 0.5, 1, 0])


def test_graded_input_is_binarized_for_binary_metrics():
    grades = np.array([[0, 2, 3, 0, 1]])
    assert m.average_precision(grades, [3])[0] == pytest.approx((1 / 2 + 2 / 3 + 3 / 5) / 3)
    assert m.precision_at_k(grades, [3], 3)[0] == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------------------------
# Open-set queries and the per-instance relevance rule
# ----------------------------------------------------------------------------------------------


def test_open_set_queries_are_excluded_and_counted():
    labels = np.array(["a", "a", "b", "c", "c", "c"])
    rankings = np.array(
        [
            [0, 2, 1, 3, 4, 5],  # query of instance a: rank 1 and 3 relevant
            [2, 0, 1, 3, 4, 5],  # query of instance c: ranks 4-6
            [3, 0, 1, 2, 4, 5],  # query of instance z: no reference -> open set
            [5, 0, 1, 2, 3, 4],  # query showing both a and b (a cabinet)
        ]
    )
    relevant = [{"a"}, {"c"}, {"z"}, {"a", "b"}]
    rel, n_rel = m.relevance_matrix(rankings, labels, relevant)
    np.testing.assert_array_equal(n_rel, [2, 3, 0, 3])
    np.testing.assert_array_equal(rel[3], [False, True, True, True, False, False])
    s = m.summarize(rel, n_rel)
    assert s["queries"] == 3 and s["open_set_queries"] == 1
    for key, per in s["per_query"].items():
        assert np.isnan(per[2]), key
        assert not np.isnan(per[[0, 1, 3]]).any(), key
        assert s[key] == pytest.approx(per[[0, 1, 3]].mean()), key
    assert s["mp@1"] == pytest.approx(1 / 3)
    ap = [(1 + 2 / 3) / 2, (1 / 4 + 2 / 5 + 3 / 6) / 3, (1 / 2 + 2 / 3 + 3 / 4) / 3]
    assert s["map"] == pytest.approx(np.mean(ap))
    # including the open-set query as a 0 would have given a lower, wrong MAP
    assert s["map"] > np.mean(ap + [0.0])


def test_all_open_set_gives_nan_without_warning():
    rel = np.zeros((3, 5), dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = m.summarize(rel, np.zeros(3, int))
    assert s["queries"] == 0 and s["open_set_queries"] == 3
    assert math.isnan(s["map"]) and math.isnan(s["amnro"])


def test_relevance_matrix_counts_unretrieved_references_and_grades():
    labels = np.array([10, 11, 10, 12, 10])
    rel, n_rel = m.relevance_matrix(np.array([[1, 0]]), labels, [{10}])
    np.testing.assert_array_equal(rel, [[False, True]])
    assert n_rel[0] == 3  # all three references of instance 10, not only the ranked one
    rel_g, n_rel_g = m.relevance_matrix(np.array([[3, 1, 0]]), labels, [{10: 2, 11: 1, 99: 3}])
    np.testing.assert_array_equal(rel_g, [[0, 1, 2]])
    assert n_rel_g[0] == 4
    np.testing.assert_array_equal(m.ideal_relevance(labels, [{10: 2, 11: 1}], 5), [[2, 2, 2, 1, 0]])


def test_inconsistent_inputs_are_rejected():
    with pytest.raises(ValueError, match="n_rel"):
        m.average_precision(np.array([[1, 1, 0]], bool), [1])
    with pytest.raises(ValueError):
        m.average_precision(np.array([1, 0, 1], bool), [1])
    with pytest.raises(ValueError):
        m.relevance_matrix(np.array([[0, 7]]), np.array([1, 2]), [{1}])


# ----------------------------------------------------------------------------------------------
# Kendall tau-B (paper 000)
# ----------------------------------------------------------------------------------------------


def _tau_b_by_pairs(x, y):
    """Paper 000's pair classification, literally."""
    c = d = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx != 0 and dy != 0:
                if (dx > 0) == (dy > 0):
                    c += 1
                else:
                    d += 1
            elif dx == 0 and dy != 0:
                tx += 1
            elif dx != 0 and dy == 0:
                ty += 1
    return (c - d) / math.sqrt((c + d + tx) * (c + d + ty))


def test_kendall_tau_b_against_scipy_with_ties():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(3)
    gt = rng.integers(0, 5, size=(31, 40)).astype(float)  # 31 groups of 40 images, many ties
    sys_scores = np.round(gt + rng.normal(0, 1.5, size=gt.shape), 1)  # ties too
    ours = m.kendall_tau_b(sys_scores, gt)
    for i in range(31):
        ref = kendalltau(gt[i], sys_scores[i], variant="b").statistic
        assert ours[i] == pytest.approx(ref, abs=1e-12)
        assert m.kendall_tau_b(sys_scores[i], gt[i]) == pytest.approx(ref, abs=1e-12)
    assert ours[0] == pytest.approx(_tau_b_by_pairs(gt[0], sys_scores[0]), abs=1e-12)
    # small blocks give the same result
    np.testing.assert_allclose(m.kendall_tau_b(sys_scores, gt, max_block_elements=50), ours)


def test_kendall_tau_b_rank_input_and_degenerate():
    from scipy.stats import kendalltau, rankdata

    rng = np.random.default_rng(4)
    gt = rng.integers(0, 4, size=25).astype(float)
    scores = rng.normal(size=25)
    ranks = rankdata(-scores, method="ordinal")  # 1 = best
    assert m.kendall_tau_b(ranks, gt, system_is_rank=True) == pytest.approx(
        kendalltau(gt, scores, variant="b").statistic, abs=1e-12
    )
    assert m.kendall_tau_b(scores, scores) == pytest.approx(1.0)
    assert m.kendall_tau_b(-scores, scores) == pytest.approx(-1.0)
    assert math.isnan(m.kendall_tau_b(scores, np.ones(25)))
