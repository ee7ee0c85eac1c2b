"""The verdict calibrated on views as visitors' phones take them (issue 36, item 3): each view of the
calibration is also asked degraded by one of the protocol's conditions (kind ``"visitor"``); those
views shape the model, and the threshold still bounds the clean unknown views' false accepts."""

import numpy as np
import pytest

from museum_search.core.answer import Evidence
from museum_search.core.answer._verdict import calibration_point, fit_verdict, unknown_threshold
from museum_search.core.conditions import CONDITIONS
from museum_search.core.jobs._calibration import VISITOR, VISITOR_CONDITIONS, calibration_evidence, calibration_plan
from museum_search.core.progress import drive


def test_the_visitor_conditions_are_the_protocol_s():
    assert set(VISITOR_CONDITIONS) <= set(CONDITIONS) and "clean" not in VISITOR_CONDITIONS
    assert {"dim-0.3", "defocus-4", "perspective-30", "tilt-25", "glare", "far", "webcam", "phone"} <= set(VISITOR_CONDITIONS)


@pytest.fixture(scope="module")
def evidence(sample_index):
    return drive(calibration_evidence(sample_index))


def test_every_view_is_also_asked_as_a_visitor_s_phone_takes_it(sample_index, evidence):
    plan = calibration_plan(sample_index.labels)
    ev = evidence
    visitor = [e for e in ev if e.kind == VISITOR]
    clean = [e for e in ev if e.kind != VISITOR]
    assert len(visitor) == len(clean) == 2 * len(plan)  # known and unknown, per view
    assert sum(e.known for e in visitor) == len(plan)
    # each visitor view is a view of the same reference as the clean one just before it
    assert [e.path for e in visitor] == [e.path for e in clean]
    # harder than the clean views: a lower cosine on average, fewer matching points
    cos = lambda es: np.mean([e.cosine for e in es if e.known])
    inl = lambda es: np.mean([e.inliers or 0 for e in es if e.known])
    assert cos(visitor) < cos(clean) and inl(visitor) < inl(clean)
    # the clean views are those of before (their random stream is not touched by the visitor views)
    before = drive(calibration_evidence(sample_index, visitors=False))
    assert [e.to_dict() for e in before] == [e.to_dict() for e in clean]
    again = drive(calibration_evidence(sample_index))  # and all is deterministic
    assert [e.to_dict() for e in again] == [e.to_dict() for e in ev]


def _ev(p_known, kind, known):
    return Evidence(cosine=p_known, inliers=None, known=known, correct=known, kind=kind)


def test_the_threshold_bounds_the_clean_unknown_views_only():
    rule = unknown_threshold(0.0)
    clean_unknown = [_ev(0.6, "real", False), _ev(0.55, "synthetic", False)]
    visitor_unknown = [_ev(0.9, VISITOR, False)]  # a visitor view cannot raise the threshold
    known = [_ev(0.95, "real", True)]
    ev = clean_unknown + visitor_unknown + known
    probs = np.array([e.cosine for e in ev])
    t = rule(probs, None, ev)
    assert 0.6 < t < 0.61
    # views all made as visitors take them: those bound it (nothing else to go by)
    only = [_ev(0.7, VISITOR, False), _ev(0.95, VISITOR, True)]
    assert 0.7 < rule(np.array([0.7, 0.95]), None, only) < 0.71


def test_the_operating_point_is_reported_per_kind_with_the_visitor_views(evidence):
    ev = evidence
    v = fit_verdict(ev, "test")
    point = calibration_point(ev, v)
    assert set(point["by_kind"]) == {"real", "synthetic", "visitor"}
    vis = point["by_kind"]["visitor"]
    known = [e for e in ev if e.kind == VISITOR and e.known]
    assert vis["known"] == len(known)
    assert vis["known_accepted"] == round(float(np.mean([e.correct and e.accepted(v) for e in known])), 4)
    # the headline point is not measured on the visitor views
    assert point["views"] in ("real", "all")
    assert point["known"] == sum(1 for e in ev if e.known and e.kind == ("real" if point["views"] == "real" else e.kind)
                                 and e.kind != VISITOR)


def test_info_and_the_collection_tab_say_the_visitor_operating_point(evidence):
    v = fit_verdict(evidence, "test")
    vis = v.operating_point["by_kind"]["visitor"]
    assert v.visitor_point() == vis
    assert (f"as visitors' phones take them, {vis['known_accepted']:.0%} of {vis['known']} and "
            f"{vis['unknown_rejected']:.0%} of {vis['unknown']}") in v.summary()
    assert f"Photos as visitors take them, dim, blurred, at an angle or from afar: about {vis['known_accepted']:.0%}" \
        in v.plain_summary()
    # an index calibrated before the visitor views: nothing said of them
    old = fit_verdict([e for e in evidence if e.kind != VISITOR], "test")
    assert old.visitor_point() is None and "visitors" not in old.summary() + old.plain_summary()
