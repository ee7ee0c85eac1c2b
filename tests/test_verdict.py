"""The "in this collection" verdict (core/verdict.py): decision, calibration, figures, operating points."""

import numpy as np
import pytest

from museum_search.core.images import load_image
from museum_search.core.rerank.spatial import SpatialParams, verify_pair
from museum_search.core.verdict import (
    DISTINCT,
    MIN_CALIBRATED,
    Evidence,
    Verdict,
    choose,
    open_set_figures,
    operating_points,
    recalibrated,
    synthetic_view,
)


def test_decide_uses_inliers_when_verified_and_cosine_otherwise():
    v = Verdict(min_inliers=15, min_cosine=0.8)
    assert v.decide(0.5, 40) == (True, "verified: 40 matching points (at least 15 needed)")
    known, reason = v.decide(0.95, 3)
    assert not known and "3 matching points" in reason and "15 needed" in reason
    assert v.decide(0.85, None)[0] and not v.decide(0.79, None)[0]
    assert Verdict.from_dict(v.to_dict()) == v


def test_a_verified_answer_must_be_distinct_from_other_objects():
    """Matches on what objects share (the same frame moulding) reach several objects alike."""
    v = Verdict(min_inliers=12)
    known, reason = v.decide(0.87, 27, rival=20)  # sample q20: an unknown painting in a known frame
    assert not known and "another object has 20" in reason
    assert v.decide(0.9, 15, rival=4)[0]  # sample q16: few inliers, but only on its own object
    assert v.decide(0.9, 40, rival=int(40 / DISTINCT))[0] and not v.decide(0.9, 40, rival=int(40 / DISTINCT) + 1)[0]
    assert v.decide(0.9, 40, rival=0) == v.decide(0.9, 40)
    assert Evidence(0.87, 27, False, False, 20).distinct_inliers == 0
    assert Evidence(0.9, 15, True, True, 4).distinct_inliers == 15
    # calibration: an unknown view that is not distinct does not raise the threshold
    unknown = [_ev(0.8, 0, False, False)] * 30 + [Evidence(0.85, 200, False, False, 180)] * 5
    assert choose([_ev(0.9, 100)], unknown, "test").min_inliers == MIN_CALIBRATED


def _ev(cos, inl, known=True, correct=True):
    return Evidence(cos, inl, known, correct)


def test_choose_sits_above_the_unknown_views_and_ignores_one_duplicate():
    known = [_ev(0.8, n) for n in (30, 45, 60, 90, 120, 200)] + [_ev(0.7, 0, correct=False)]
    unknown = [_ev(0.75, n, False, False) for n in [0] * 30 + [4, 5, 6, 8]] + [_ev(0.84, 259, False, False)]
    v = choose(known, unknown, "test")
    # the 95th percentile of the unknown counts is 8: 1.5 x 8 + 1 = 13 (not 260 because of one duplicate)
    assert v.min_inliers == 13
    assert v.min_inliers >= MIN_CALIBRATED
    assert all(v.decide(e.cosine, e.inliers)[0] for e in known if e.correct)


def test_open_set_figures_by_hand():
    ev = [_ev(0.9, 50), _ev(0.9, 40, correct=False), _ev(0.8, 5), _ev(0.8, 3, False, False),
          _ev(0.8, 30, False, False)]
    f = open_set_figures(ev, Verdict(min_inliers=20))
    # known: accepted 50 (right), accepted 40 (wrong answer), rejected 5 -> 1/3 wrongly rejected
    # unknown: 3 rejected, 30 accepted -> 1/2 rejected; right: 1 + 1 = 2 of 5
    assert f == {"known_queries": 3, "unknown_queries": 2, "unknown_rejected": 0.5,
                 "known_rejected": pytest.approx(1 / 3), "accuracy": pytest.approx(2 / 5)}


def test_operating_points_and_recalibration():
    rng = np.random.default_rng(1)
    ev = [_ev(0.8, int(n)) for n in rng.integers(15, 300, 60)] + \
         [_ev(0.8, int(n), False, False) for n in rng.integers(0, 12, 20)]
    pts = operating_points(ev)
    assert len(pts["threshold"]) == len(pts["accuracy"]) == len(pts["known_rejected"])
    assert np.all(np.diff(pts["unknown_rejected"]) >= 0) and np.all(np.diff(pts["known_rejected"]) >= 0)
    v = recalibrated(ev, Verdict(), max_known_rejected=0.03)
    f = open_set_figures(ev, v)
    assert f["known_rejected"] <= 0.03 and f["unknown_rejected"] == 1.0
    assert "labelled queries" in v.source


def test_synthetic_view_is_a_verifiable_photo_of_the_reference(sample_collection):
    ref = load_image(sorted((sample_collection / "collection").glob("*.jpg"))[0], max_side=640)
    rng = np.random.default_rng(0)
    views = [synthetic_view(ref, rng) for _ in range(3)]
    assert all(v.dtype == np.uint8 and v.ndim == 3 for v in views)
    assert any(v.shape != ref.shape for v in views)
    inl = [verify_pair(v, ref, SpatialParams()) for v in views]
    assert min(inl) > MIN_CALIBRATED, inl
