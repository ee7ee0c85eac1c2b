"""Features several objects share (a frame, a label) are set aside from the stored references
(issue 36): the sample's works hang in the same gilded frame beside the same label, and a photo of
one matched another work on them."""

import numpy as np
import pytest

from museum_search.core.index._features import LocalFeatures
from museum_search.core.progress import drive
from museum_search.core.verification import leaving_out, params_of_settings, without_shared_features
from museum_search.core.verification._shared import SHARED_MIN_INLIERS, shared_points
from museum_search.core.verification._spatial import compute_local_features, verify_many


def _row(index, name: str) -> int:
    return next(i for i, it in enumerate(index.items) if it.path.endswith(name))


@pytest.fixture(scope="module")
def raw_local(sample_index):
    """The sample's local features as computed, before anything is set aside."""
    params = params_of_settings(sample_index.local.settings)
    return drive(compute_local_features([sample_index.abspath(i) for i in range(len(sample_index))], params))


def _inliers(local: LocalFeatures, a: int, b: int, params) -> int:
    fa, fb = local.get(a), local.get(b)
    return verify_many(fa[0], [fb[0]], params, [fb[1]])[0]


def test_two_works_no_longer_agree_on_their_frames(sample_index, raw_local):
    """Valley at Dusk and Wind over the Wheat agree on their frames' corners and labels with
    dozens of inliers in the features as computed; in the index (built by the same code) a third
    or less of them remain, while two photos of one work still agree."""
    params = params_of_settings(sample_index.local.settings)
    valley, wheat = _row(sample_index, "valley_at_dusk-3.jpg"), _row(sample_index, "wind_over_wheat-2.jpg")
    valley_other = _row(sample_index, "valley_at_dusk-1.jpg")
    before = _inliers(raw_local, valley, wheat, params)
    assert before >= 30
    # what agreed is gone; a few points may still agree by chance
    assert _inliers(sample_index.local, valley, wheat, params) <= min(before // 3, 2 * SHARED_MIN_INLIERS)
    assert _inliers(sample_index.local, valley, valley_other, params) >= 30
    # only a few of the features go: what tells the works apart stays
    assert 0 < len(raw_local.descriptors) - len(sample_index.local.descriptors) < 0.1 * len(raw_local.descriptors)


def test_the_shared_points_are_the_inliers_against_the_other_object(sample_index, raw_local):
    """``shared_points`` gives each point the objects it is an inlier with: exactly the points of a
    homography with another object, and nothing against no object."""
    params = params_of_settings(sample_index.local.settings)
    valley, wheat = _row(sample_index, "valley_at_dusk-3.jpg"), _row(sample_index, "wind_over_wheat-2.jpg")
    fa, fb = raw_local.get(valley), raw_local.get(wheat)
    found: list = []
    verify_many(fa[0], [fb[0]], params, [fb[1]], found)
    src, _, _, mask = found[0]
    inlier_points = {tuple(p) for p in np.asarray(src)[mask.ravel().astype(bool)].tolist()}
    objs = shared_points(fa[0], [(fb[0], fb[1], "wind_over_wheat")], params)
    assert {tuple(p) for p, o in zip(fa[0][0].tolist(), objs) if o} == inlier_points
    assert {o for o in objs if o} == {frozenset({"wind_over_wheat"})}
    assert not any(shared_points(fa[0], [], params))


def test_a_calibration_s_unknown_view_meets_the_references_as_without_its_object(sample_index, raw_local):
    """Leaving object X out (a calibration's unknown view of X), the points other references lost
    only because they agreed with X are theirs again; those shared with another object stay aside;
    outside the context the index is as stored. Without this, the unknown views would find fewer
    points than a real unknown object does, and the threshold would accept too many of them."""
    valley = _row(sample_index, "valley_at_dusk-3.jpg")
    stored = sample_index.local
    aside = stored.set_aside
    assert aside is not None and valley in aside.rows
    (points, _), objs = aside.rows[valley]
    only_wheat = [o == {"wind_over_wheat"} for o in objs]
    assert any(only_wheat)
    with leaving_out(sample_index, "wind_over_wheat"):
        (p_out, _), _ = sample_index.local.get(valley)
        assert sample_index.local.settings == stored.settings
    assert sample_index.local is stored
    (p_in, _), _ = stored.get(valley)
    assert len(p_out) == len(p_in) + sum(only_wheat)
    expected = {tuple(p) for p, o in zip(points.tolist(), objs) if not o or o == {"wind_over_wheat"}}
    assert {tuple(p) for p in p_out.tolist()} == expected
    # a loaded index has nothing set aside in memory: the context changes nothing
    from museum_search.core.index._store import Index

    loaded = Index.load(sample_index.path)
    before = loaded.local
    with leaving_out(loaded, "wind_over_wheat"):
        assert loaded.local is before
    assert loaded.local.set_aside is None and np.array_equal(loaded.local.descriptors, stored.descriptors)


def test_an_update_checks_its_new_photos_and_the_older_ones_they_resemble(sample_index, raw_local):
    """An update (``rows``: its new photos) sets aside what a new photo shares with the older ones,
    and what those older ones share with it, as a build of the whole collection does: Wind over the
    Wheat's frame no longer agrees with a new photo of Valley at Dusk. The older photos no new one
    found similar are as they were. One object alone shares nothing."""
    params = params_of_settings(sample_index.local.settings)
    labels = [it.instance for it in sample_index.items]
    valley, wheat = _row(sample_index, "valley_at_dusk-3.jpg"), _row(sample_index, "wind_over_wheat-2.jpg")
    before = _inliers(raw_local, wheat, valley, params)
    assert before >= 30
    local, removed = drive(without_shared_features(raw_local, sample_index.descriptors, labels, params, rows=[valley]))
    assert valley in local.set_aside.rows and wheat in local.set_aside.rows
    assert _inliers(local, wheat, valley, params) <= min(before // 3, 2 * SHARED_MIN_INLIERS)
    for r in set(range(len(labels))) - set(local.set_aside.rows):  # the others as they were
        assert np.array_equal(local.get(r)[0][1], raw_local.get(r)[0][1])
    assert all(labels[r] != "valley_at_dusk" for r in set(local.set_aside.rows) - {valley})
    assert removed == sum(len(raw_local.get(r)[0][0]) - len(local.get(r)[0][0]) for r in local.set_aside.rows)
    same, none = drive(without_shared_features(raw_local, sample_index.descriptors, ["one"] * len(labels), params))
    assert none == 0 and same is raw_local
