"""GAP (Global Average Precision, micro-AP) of the Met dataset and Google Landmark Recognition.

* Against two independent, published implementations, re-written below as plain-Python loops:
  the Met dataset's own evaluation code and the GLR Kaggle ``GAP_vector`` kernel, on random
  inputs with ties, unknown (open-set) queries and queries without a prediction.
* Small hand-computed cases (every value worked out in the comments).
* ``sklearn.metrics.average_precision_score``: GAP = (R / M) * AP(rel, confidence), valid only
  without confidence ties (see the comment of that test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from museum_search.core.evaluation._metrics import gap_known, global_average_precision

# ----------------------------------------------------------------------------------------------
# Independent reference implementations (plain Python, no numpy in the computation)
# ----------------------------------------------------------------------------------------------


def met_gap_reference(pred, score, class_ids, *, non_distr=False):
    """The Met dataset's GAP, re-written as a loop.

    Source: github.com/nikosips/met, ``code/utils/utils.py`` (commit ab0462a7), functions
    ``gap(pred, score, class_ids)`` and ``gap_non_distr`` ("Same as GAP, but doesn't take
    distractors into account"). There: rel = (pred == class_ids); rel is sorted by descending
    score (``np.argsort(-score)``); nq_object = number of queries minus the distractors, whose
    label is -1; prec = cumsum(rel) / (1..Q); GAP = sum(prec * rel) / nq_object.
    ``gap_non_distr`` first drops the distractors (label -1) and divides by the remaining count.

    One deliberate difference: ``np.argsort``'s default quicksort is not stable, so the published
    code leaves the order of tied scores unspecified; Python's ``sorted`` is stable, which pins it
    to query order (the convention of the function under test).
    """
    idx = list(range(len(pred)))
    if non_distr:
        idx = [i for i in idx if class_ids[i] != -1]
    rel = [1 if pred[i] == class_ids[i] else 0 for i in idx]
    n_distr = sum(1 for i in idx if class_ids[i] == -1)
    nq_object = len(idx) - n_distr
    order = sorted(range(len(idx)), key=lambda j: -score[idx[j]])
    hits = 0
    total = 0.0
    for position, j in enumerate(order, start=1):
        hits += rel[j]
        total += (hits / position) * rel[j]
    return total / nq_object


def kaggle_gap_reference(pred, conf, true):
    """GLR's GAP, ``GAP_vector(pred, conf, true)`` of the Kaggle kernel "GAP metric" by David
    Thaler (https://www.kaggle.com/davidthaler/gap-metric, copied into many GLR solutions), as a
    loop.

    There, with None/NaN for "no label" in both ``pred`` and ``true``: the rows are sorted by
    ``conf`` descending with ``na_position='last'``; correct = (true == pred) (NaN never equals);
    prec_k = cumsum(correct) / (1..Q); GAP = sum(prec_k * correct) / true.count(), i.e. divided
    by the number of queries with a ground-truth label (M). Same stable-sort difference as above
    (pandas' default quicksort does not fix the order of ties).
    """
    rows = range(len(pred))
    with_conf = [i for i in rows if not math.isnan(conf[i])]
    without_conf = [i for i in rows if math.isnan(conf[i])]
    order = sorted(with_conf, key=lambda i: -conf[i]) + without_conf  # na_position='last'
    hits = 0
    total = 0.0
    for k, i in enumerate(order, start=1):
        correct = 1 if true[i] == pred[i] else 0  # NaN == x is False
        hits += correct
        total += (hits / k) * correct
    count = sum(1 for t in true if not math.isnan(t))
    return total / count


def random_queries(seed, *, ties, no_prediction=0.0):
    """Random open-set recognition run.

    Returns (pred, conf, true) with true = -1 for unknown queries and pred = -1 / conf = NaN for
    a query that makes no prediction; at least one known query.
    """
    rng = np.random.default_rng(seed)
    q = int(rng.integers(1, 80))
    n_classes = int(rng.integers(1, 8))
    known = rng.random(q) < rng.uniform(0.2, 1.0)
    if not known.any():
        known[rng.integers(q)] = True
    true = np.where(known, rng.integers(0, n_classes, q), -1)
    right = rng.random(q) < rng.uniform(0.0, 1.0)
    pred = np.where(known & right, true, rng.integers(0, n_classes, q))
    if ties:
        conf = rng.integers(0, 4, q) / 4.0  # many exact ties
    else:
        conf = rng.random(q)
    missing = rng.random(q) < no_prediction
    pred = np.where(missing, -1, pred)
    conf = np.where(missing, np.nan, conf)
    return pred, conf, true


SEEDS = range(60)


# ----------------------------------------------------------------------------------------------
# (1) against the published reference codes
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ties", [False, True])
def test_matches_met_reference(ties):
    for seed in SEEDS:
        pred, conf, true = random_queries(seed, ties=ties)
        known = true != -1
        correct = pred == true
        args = (pred.tolist(), conf.tolist(), true.tolist())
        assert global_average_precision(conf, correct, known) == pytest.approx(
            met_gap_reference(*args), rel=1e-12, abs=1e-15
        ), seed
        assert gap_known(conf, correct, known) == pytest.approx(
            met_gap_reference(*args, non_distr=True), rel=1e-12, abs=1e-15
        ), seed


@pytest.mark.parametrize("ties", [False, True])
def test_matches_kaggle_glr_reference(ties):
    # Queries without a prediction: NaN prediction *and* NaN confidence in the Kaggle convention
    # (a valid prediction with a NaN confidence would still count as right there, placed last;
    # here a NaN confidence means "no prediction", rel = 0 — so the inputs keep them together).
    for seed in SEEDS:
        pred, conf, true = random_queries(seed, ties=ties, no_prediction=0.15)
        pred_f = np.where(pred == -1, np.nan, pred.astype(float))
        true_f = np.where(true == -1, np.nan, true.astype(float))
        known = true != -1
        correct = pred == true  # -1 == -1 cannot happen for a known query
        expected = kaggle_gap_reference(pred_f.tolist(), conf.tolist(), true_f.tolist())
        got = global_average_precision(conf, correct, known)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), seed
        # None works like NaN.
        conf_none = [None if math.isnan(c) else c for c in conf.tolist()]
        assert global_average_precision(conf_none, correct, known) == got


def test_gap_known_is_never_below_gap():
    for seed in SEEDS:
        pred, conf, true = random_queries(seed, ties=True, no_prediction=0.1)
        known = true != -1
        correct = pred == true
        assert gap_known(conf, correct, known) >= global_average_precision(conf, correct, known)


# ----------------------------------------------------------------------------------------------
# (2) hand-computed cases
# ----------------------------------------------------------------------------------------------


def test_all_right_is_one():
    assert global_average_precision([0.9, 0.2, 0.5], [True] * 3, [True] * 3) == 1.0
    assert gap_known([0.9, 0.2, 0.5], [True] * 3, [True] * 3) == 1.0
    # An unknown query ranked after every known one changes nothing.
    assert global_average_precision([0.9, 0.2, 0.5, 0.1], [1, 1, 1, 0], [1, 1, 1, 0]) == 1.0


def test_wrong_confident_known_query_first():
    # Order 0.9 (wrong), 0.8 (right), 0.7 (right): rel = 0, 1, 1; P(2) = 1/2, P(3) = 2/3;
    # M = 3 -> GAP = (1/2 + 2/3) / 3 = 7/18.
    conf = [0.7, 0.9, 0.8]
    correct = [True, False, True]
    known = [True, True, True]
    assert global_average_precision(conf, correct, known) == pytest.approx(7 / 18)
    assert gap_known(conf, correct, known) == pytest.approx(7 / 18)
    # The same wrong query least confident: rel = 1, 1, 0 -> (1 + 1) / 3 = 2/3.
    assert global_average_precision([0.7, 0.1, 0.8], correct, known) == pytest.approx(2 / 3)


def test_confident_unknown_query_lowers_gap():
    correct = [True, True, False]
    known = [True, True, False]
    # Unknown query the most confident: rel = 0, 1, 1; M = 2 -> (1/2 + 2/3) / 2 = 7/12.
    assert global_average_precision([0.8, 0.7, 0.9], correct, known) == pytest.approx(7 / 12)
    # Least confident: no effect.
    assert global_average_precision([0.8, 0.7, 0.1], correct, known) == 1.0
    # Without distractors, its confidence does not matter.
    assert gap_known([0.8, 0.7, 0.9], correct, known) == 1.0
    # "correct" is ignored for an unknown query (it has no right instance).
    assert global_average_precision([0.8, 0.7, 0.9], [True] * 3, known) == pytest.approx(7 / 12)


def test_tie_order_is_query_order():
    # Two known queries with the same confidence, one wrong, one right; M = 2.
    # wrong first: rel = 0, 1 -> P(2) = 1/2 -> GAP = (1/2) / 2 = 1/4
    # right first: rel = 1, 0 -> P(1) = 1   -> GAP = 1 / 2       = 1/2
    known = [True, True]
    assert global_average_precision([0.5, 0.5], [False, True], known) == 0.25
    assert global_average_precision([0.5, 0.5], [True, False], known) == 0.5
    # Same with an unknown query tied with a right known one (M = 1).
    assert global_average_precision([0.5, 0.5], [False, True], [False, True]) == 0.5
    assert global_average_precision([0.5, 0.5], [True, False], [True, False]) == 1.0
    # Large enough (> 16 elements) for numpy's default quicksort to be introsort: still stable.
    n = 40
    conf = np.full(n, 0.5)
    correct = np.arange(n) % 2 == 1  # wrong, right, wrong, right, ...
    expected = sum((k / (2 * k)) for k in range(1, n // 2 + 1)) / n  # P(2k) = k / 2k = 1/2
    assert global_average_precision(conf, correct, np.ones(n, bool)) == pytest.approx(expected)


def test_no_prediction_counts_as_wrong_and_last():
    # 0.9 right, no prediction (its "correct" says True: ignored), 0.5 right; M = 3.
    # Order 0.9, 0.5, none: rel = 1, 1, 0 -> (1 + 1) / 3 = 2/3.
    for missing in (None, float("nan")):
        conf = [0.9, missing, 0.5]
        assert global_average_precision(conf, [True] * 3, [True] * 3) == pytest.approx(2 / 3)
        assert gap_known(conf, [True] * 3, [True] * 3) == pytest.approx(2 / 3)
    # An unknown query without prediction changes nothing; -inf is an ordinary confidence.
    assert global_average_precision([float("-inf"), None], [True, False], [True, False]) == 1.0
    assert global_average_precision([np.inf, 1e300], [True, True], [True, True]) == 1.0


def test_no_known_query_is_nan():
    assert math.isnan(global_average_precision([0.9, 0.1], [False, False], [False, False]))
    assert math.isnan(gap_known([0.9, 0.1], [True, False], [False, False]))
    assert math.isnan(global_average_precision([], [], []))
    assert math.isnan(gap_known(np.zeros(0), np.zeros(0, bool), np.zeros(0, bool)))


def test_known_but_nothing_right_is_zero():
    assert global_average_precision([0.9, 0.1, 0.3], [False] * 3, [True, True, False]) == 0.0


def test_input_validation():
    with pytest.raises(ValueError, match="1-D"):
        global_average_precision([[0.5]], [[True]], [[True]])
    with pytest.raises(ValueError, match="correct must have shape"):
        global_average_precision([0.5, 0.4], [True], [True, True])
    with pytest.raises(ValueError, match="known must have shape"):
        gap_known([0.5, 0.4], [True, True], [True])
    with pytest.raises(ValueError, match="boolean"):
        global_average_precision([0.5, 0.4], [2, 1], [1, 1])
    with pytest.raises(ValueError, match="confidence must be numbers"):
        global_average_precision(["high", "low"], [1, 1], [1, 1])
    # 0/1 integers are accepted like booleans.
    assert global_average_precision([0.5, 0.4], [0, 1], [1, 1]) == pytest.approx(0.25)


# ----------------------------------------------------------------------------------------------
# (3) sklearn's average precision
# ----------------------------------------------------------------------------------------------


def test_relation_to_sklearn_average_precision():
    # sklearn's AP(y, s) = sum_n (R_n - R_{n-1}) P_n over the distinct score thresholds, with
    # recall over the positives of y. Take y = rel (known and right, R of them) and s = the
    # confidences. With *distinct* confidences every threshold adds exactly one query, so
    # P_n = P(i) of the query at position i and R_n - R_{n-1} = rel(i) / R:
    #     AP = (1/R) sum_i rel(i) P(i)   and   GAP = (1/M) sum_i rel(i) P(i) = (R/M) AP.
    # Hence GAP == AP only when R = M, i.e. every known query is predicted right ("all positives
    # retrieved"); a wrong known query is a positive sklearn cannot see (counting it as a
    # positive would give it a rank of its own, which GAP never does). With tied confidences
    # sklearn evaluates the whole tied group at once (its precision), while GAP orders the tie by
    # query; the identity then fails (last block). NaN confidences are not accepted by sklearn.
    from sklearn.metrics import average_precision_score

    checked = 0
    for seed in SEEDS:
        pred, conf, true = random_queries(seed, ties=False)
        assert np.unique(conf).size == conf.size
        known = true != -1
        correct = pred == true
        rel = correct & known
        if not rel.any():
            continue  # sklearn: no positive -> warning and a meaningless value
        ap = average_precision_score(rel, conf)
        gap = global_average_precision(conf, correct, known)
        assert gap == pytest.approx(rel.sum() / known.sum() * ap, rel=1e-12), seed
        # Every known query right (R = M): GAP is sklearn's AP itself, distractors as negatives.
        gap_all_right = global_average_precision(conf, known, known)
        assert gap_all_right == pytest.approx(average_precision_score(known, conf), rel=1e-12)
        checked += 1
    assert checked >= 40

    # Ties: right query first in query order -> GAP = 1/2 (hand case above), but sklearn sees
    # one threshold holding both queries: precision 1/2, recall 1 -> AP = 1/2, (R/M) AP = 1/4.
    conf = [0.5, 0.5]
    gap = global_average_precision(conf, [True, False], [True, True])
    assert gap == 0.5
    assert 1 / 2 * average_precision_score([1, 0], conf) == pytest.approx(0.25)
