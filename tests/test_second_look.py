"""The second, closer and deeper look at a photo whose first look is unsure (issue 36, item 2):
the light normalised, the photo's features at the stored features' side, and the best ``deep``
references verified. On the bundled sample's real photos, degraded as a visitor's phone takes
them (:mod:`museum_search.core.conditions`)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.answer import QueryPipeline, QuerySettings, Verdict, load_query, query_from_array
from museum_search.core.answer._pipeline import HALF_TOP, _shrink
from museum_search.core.conditions import degrade, photo_seed
from museum_search.core.images import load_image
from museum_search.core.verification import DEEP, SURE, Verification, normalised_light


def _visitor_photo(sample_collection: Path, name: str, condition: str) -> np.ndarray:
    path = sample_collection / "queries" / name
    return degrade(load_image(path, max_side=1024), condition, photo_seed(condition, name))


def test_normalised_light_lifts_a_dim_photo_s_contrast(sample_collection):
    dim = _visitor_photo(sample_collection, "q02.jpg", "dim-0.3")
    out = normalised_light(dim)
    assert out.shape == dim.shape and out.dtype == np.uint8
    lum = lambda im: im.astype(float).mean(axis=2)
    assert np.percentile(lum(out), 95) - np.percentile(lum(out), 5) > \
        1.5 * (np.percentile(lum(dim), 95) - np.percentile(lum(dim), 5))
    gray = np.zeros((8, 8), np.uint8)  # not RGB: returned as it is
    assert normalised_light(gray) is gray


def test_an_unsure_first_look_is_followed_by_a_closer_one(sample_index, sample_collection):
    """q02 dim, blurred, angled, noisy and from afar: the first look (320 px) finds 12 matching
    points on its painting; the closer one (light normalised, 640 px) over 100."""
    img = _visitor_photo(sample_collection, "q02.jpg", "phone-hard")
    first = QueryPipeline(sample_index, QuerySettings(deep=0)).answer([query_from_array(img, "q02")])[0]
    closer = QueryPipeline(sample_index, QuerySettings()).answer([query_from_array(img, "q02")])[0]
    assert first.top.instance == closer.top.instance == "harbour_lights"
    assert first.top_inliers < SURE
    assert closer.top_inliers >= 4 * first.top_inliers
    assert closer.in_collection and first.in_collection
    # the closer look's points count for it: with the first look's rival (the closer one also finds
    # a few points of another work's frame, which count against it) it is the more confident
    verdict = Verdict.of_index(sample_index)
    closer_evidence = replace(closer.evidence(True, True), rival=first.rival)
    assert verdict.judge(closer_evidence).confidence > first.confidence
    # the evidence drawn is that of the look kept: the matches of the top result have its inliers
    m = QueryPipeline(sample_index, QuerySettings()).top_matches(query_from_array(img, "q02"), closer)
    assert m is not None and m.inliers == closer.top_inliers


def test_the_deep_look_finds_the_object_the_global_descriptor_ranks_low(sample_index, sample_collection):
    """q21 as a webcam sees it: its object's first photo is 9th by the global descriptor. Verifying
    the best 3 finds nothing; the second look verifies the best ``deep`` and finds it."""
    img = _visitor_photo(sample_collection, "q21.jpg", "webcam")
    q = query_from_array(img, "q21")
    shallow = QueryPipeline(sample_index, QuerySettings(verify_top=3, deep=0)).answer([q])[0]
    deep = QueryPipeline(sample_index, QuerySettings(verify_top=3, deep=20)).answer([q])[0]
    assert shallow.top.instance != "rose_window" and len(shallow.verified_inliers) == 3
    assert deep.top.instance == "rose_window" and deep.top_inliers >= 2 * SURE
    # the second look verifies 20: the best of each half of the photo in the places of the last of
    # the best 20 by the photo's regions, never of the first look's 3
    best = np.argsort(-shallow.cosine, kind="stable")
    assert len(deep.verified_inliers) == 20 and set(best[:3].tolist()) <= set(deep.verified_inliers)
    assert not set(best[:20].tolist()) <= set(deep.verified_inliers)


def test_the_second_look_verifies_the_best_of_each_half(sample_index, sample_collection):
    """Two sample photos side by side, degraded as a webcam sees them (the first look unsure): the
    second look verifies the best :data:`HALF_TOP` references of each half of the photo, besides the
    first look's best 3 of its regions (QueryPipeline._half_rows)."""
    left = _visitor_photo(sample_collection, "q21.jpg", "webcam")
    right = _visitor_photo(sample_collection, "q02.jpg", "webcam")
    h = min(left.shape[0], right.shape[0])
    wall = np.ascontiguousarray(np.hstack([left[:h], right[:h]]))
    pipe = QueryPipeline(sample_index, QuerySettings(verify_top=3, deep=3))
    q = query_from_array(wall, "wall")
    a = pipe.answer([q])[0]
    assert q.image.shape[1] > q.image.shape[0]
    w = q.image.shape[1] // 2
    for half in (q.image[:, :w], q.image[:, w:]):
        d = pipe.extractor.embed([pipe.extractor.preprocess(_shrink(np.ascontiguousarray(half), pipe.extractor.max_side))])
        best = np.argsort(-(np.asarray(sample_index.descriptors, np.float32) @ d[0]), kind="stable")[:HALF_TOP]
        assert set(best.tolist()) <= set(a.verified_inliers)
    # without the second look, only the photo's best 3
    assert len(QueryPipeline(sample_index, QuerySettings(verify_top=3, deep=0)).answer(
        [query_from_array(wall, "wall")])[0].verified_inliers) == 3


def test_a_sure_first_look_is_not_repeated(sample_index, sample_collection, monkeypatch):
    calls = []
    closer = Verification.closer
    monkeypatch.setattr(Verification, "closer", lambda self, image: calls.append(1) or closer(self, image))
    pipe = QueryPipeline(sample_index, QuerySettings())
    a = pipe.answer([load_query(sample_collection / "queries" / "q01.jpg")])[0]
    assert a.top_inliers >= SURE and calls == []
    # a photo whose first look is unsure is looked at again, once
    unsure = pipe.answer([query_from_array(_visitor_photo(sample_collection, "q02.jpg", "phone-hard"), "x")])
    assert len(calls) == 1 and unsure[0].top_inliers >= SURE


@pytest.mark.parametrize("deep", [0, 20, DEEP])
def test_the_first_look_stands_when_the_second_finds_no_more(sample_index, sample_collection, deep):
    """The sample's unknown photos (objects not in the collection): whatever the second
    look, the answer is refused and its matches are those of the look kept. (q20, a work not in
    the collection hung in the sample's gilded frame, keeps 11 points on frame corners of *Wind over
    the Wheat* that the set-aside did not take. With a calibration whose unknown views met the
    references with what they shared with the view's own object set aside too, a second look of 20
    references accepted it, confidence 0.63; calibrated as without each object, it is refused.)"""
    names = [line.split(",")[0] for line in (sample_collection / "queries" / "ground_truth.csv").read_text().splitlines()
             if line.endswith(",")]
    assert names, "the sample has unknown photos"
    pipe = QueryPipeline(sample_index, QuerySettings(deep=deep))
    for name in names:
        a = pipe.answer([load_query(sample_collection / "queries" / name)])[0]
        assert not a.in_collection
        m = pipe.top_matches(load_query(sample_collection / "queries" / name), a)
        assert m is None or m.inliers == (a.top_inliers or 0)


def test_the_answer_knows_the_points_that_could_have_matched(sample_index, sample_collection):
    """``Evidence.expected`` on a real photo: the fewer of the photo's keypoints and those of the
    answer's best verified reference photo; the calibration stored it, so the sample's verdict reads
    it (``unmatched``, whose weight is never for an answer)."""
    img = _visitor_photo(sample_collection, "q02.jpg", "phone")
    pipe = QueryPipeline(sample_index, QuerySettings())
    a = pipe.answer([query_from_array(img, "q02")])[0]
    e = a.evidence(True, True)
    best = max((n, r) for r, n in a.verified_inliers.items() if sample_index.items[r].instance == a.top.instance)[1]
    ref = pipe.verification.verifier.reference_features(sample_index, best)
    assert e.expected == min(len(a.features[0]), len(ref[0][0])) > e.inliers > 0
    verdict = Verdict.of_index(sample_index)
    assert all("expected" in d for d in verdict.evidence) and any(d["expected"] > 0 for d in verdict.evidence)
    weights = dict(zip(verdict.model_verified.features, verdict.model_verified.weights))
    assert weights["unmatched"] <= 0
    # the same answer with fewer points that could match is at least as confident (below the gate)
    few = replace(e, inliers=5, rival=0)
    assert verdict.judge(replace(few, expected=10)).confidence >= verdict.judge(replace(few, expected=500)).confidence


def test_a_rival_of_chance_points_does_not_refuse_a_visitor_s_photo(sample_index, sample_collection):
    """The sample's q04 as a phone takes it (dim, angled, out of focus): 20 points on its painting,
    and another work's frame has a few, no more than chance beyond the 4 any homography fits. It is
    in the collection (refused while the rival counted from its first point: confidence 0.49 against
    the threshold 0.57), and a stronger rival still weighs against it."""
    from museum_search.core.answer._verdict import RIVAL_CHANCE

    img = _visitor_photo(sample_collection, "q04.jpg", "phone")
    a = QueryPipeline(sample_index, QuerySettings()).answer([query_from_array(img, "q04")])[0]
    assert a.top.instance == "wind_over_wheat"
    assert a.top_inliers >= 12 and 0 < a.rival <= RIVAL_CHANCE + 2
    assert a.in_collection, a.reason
    verdict = Verdict.of_index(sample_index)
    e = a.evidence(True, True)
    assert "rival_excess" in verdict.model_verified.features
    assert verdict.judge(replace(e, rival=RIVAL_CHANCE)).confidence == verdict.judge(replace(e, rival=0)).confidence
    assert verdict.judge(replace(e, rival=a.top_inliers // 2)).confidence < a.confidence
