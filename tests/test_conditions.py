"""The visitor-photo conditions (museum_search.core.conditions, issue 36) on a real photo of the
sample collection: each does what its docstring says, and the same seed gives the same photo."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from museum_search.core import conditions as c
from museum_search.core.errors import MuseumSearchError
from museum_search.core.images import load_image


@pytest.fixture(scope="module")
def photo(sample_collection) -> np.ndarray:
    """A visitor's photo of the sample (640×480), enlarged to 1000 px: the conditions' units."""
    img = load_image(sample_collection / "queries" / "q04.jpg")
    h, w = img.shape[:2]
    return cv2.resize(img, (1000, round(h * 1000 / w)), interpolation=cv2.INTER_CUBIC)


def sharpness(img: np.ndarray) -> float:
    """Variance of the Laplacian of the grey image: high for a sharp photo."""
    return float(cv2.Laplacian(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var())


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_every_condition_is_deterministic_keeps_the_photo_and_gives_rgb(photo):
    before = photo.copy()
    for name in c.CONDITIONS:
        a, b = c.degrade(photo, name, seed=7), c.degrade(photo, name, seed=7)
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3, name
        assert np.array_equal(a, b), f"{name}: the same seed must give the same photo"
        np.testing.assert_array_equal(photo, before, err_msg=f"{name} changed its input")
    # a seed draws the random parts: another seed, another noise
    assert not np.array_equal(c.degrade(photo, "noise", 1), c.degrade(photo, "noise", 2))
    assert np.array_equal(c.degrade(photo, "clean", 3), photo)


def test_unknown_condition_and_bad_array_are_refused(photo):
    with pytest.raises(MuseumSearchError, match="unknown condition"):
        c.degrade(photo, "fog", 0)
    with pytest.raises(MuseumSearchError, match="RGB uint8"):
        c.dim(photo.astype(np.float32), rng())


def test_srgb_round_trip_is_exact():
    x = np.arange(256, dtype=np.uint8).reshape(1, -1, 1).repeat(3, axis=2)
    assert np.array_equal(c.to_srgb(c.to_linear(x)), x)


@pytest.mark.parametrize("exposure", [0.3, 0.45, 0.6])
def test_dim_lowers_the_mean_luminance_by_about_the_exposure(photo, exposure):
    out = c.dim(photo, rng(), exposure=exposure)
    ratio = c.luminance(out).mean() / c.luminance(photo).mean()
    assert ratio == pytest.approx(exposure, rel=0.05)
    # ... and the sRGB values by about exposure ** (1 / 2.2) (gamma-correct, not a plain scaling)
    assert out.mean() / photo.mean() == pytest.approx(exposure ** (1 / 2.2), rel=0.1)


def test_a_dim_photo_is_relatively_noisier():
    flat = np.full((400, 400, 3), 160, np.uint8)
    bright = c.to_linear(c.noise(flat, rng(), photons=1000))
    dark = c.to_linear(c.dim(flat, rng(), exposure=0.3, photons=1000))
    assert dark.std() / dark.mean() > 1.5 * bright.std() / bright.mean()  # √(1 / 0.3) ≈ 1.8


def test_noise_is_about_the_stated_grey_levels_and_unbiased():
    flat = np.full((1000, 1000, 3), 118, np.uint8)  # mid-grey (linear 0.18)
    out = c.noise(flat, rng()).astype(float)
    assert 6 < out.std() < 12
    assert abs(out.mean() - 118) < 1.5


def test_noise_is_stated_at_1000_px():
    """A small photo's pixel gathers the light of many: its noise is weaker by the ratio of sides."""
    big = c.noise(np.full((1000, 1000, 3), 118, np.uint8), rng()).astype(float).std()
    small = c.noise(np.full((250, 250, 3), 118, np.uint8), rng()).astype(float).std()
    assert small == pytest.approx(big / 4, rel=0.25)


@pytest.mark.parametrize("fn,param", [(c.defocus, {"radius": 2.0}), (c.defocus, {"radius": 4.0}),
                                      (c.motion, {"length": 4.0})])
def test_blur_lowers_the_laplacian_variance(photo, fn, param):
    assert sharpness(fn(photo, rng(), **param)) < 0.7 * sharpness(photo)


def test_more_defocus_blurs_more_and_a_tiny_radius_does_nothing(photo):
    assert sharpness(c.defocus(photo, rng(), radius=4.0)) < sharpness(c.defocus(photo, rng(), radius=2.0))
    tiny = np.ascontiguousarray(photo[:100, :100])  # 2 px at 1000 px is 0.2 px here
    assert np.abs(c.defocus(tiny, rng(), radius=2.0).astype(int) - tiny).max() <= 1


def test_blur_scales_with_the_photo(photo):
    """2 px at 1000 px: the same blur relative to the photo at half its size."""
    half = cv2.resize(photo, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
    big = cv2.resize(c.defocus(photo, rng(), radius=4.0), None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
    small = c.defocus(half, rng(), radius=4.0)
    assert sharpness(small) == pytest.approx(sharpness(big), rel=0.35)


def test_tilt_keeps_the_size_and_turns_by_the_angle(photo):
    out = c.tilt(photo, rng(), degrees=25.0)
    assert out.shape == photo.shape
    # the turn is found again by matching the photo (ORB + a similarity transform)
    orb = cv2.ORB_create(2000)
    g1, g2 = (cv2.cvtColor(x, cv2.COLOR_RGB2GRAY) for x in (photo, out))
    k1, d1 = orb.detectAndCompute(g1, None)
    k2, d2 = orb.detectAndCompute(g2, None)
    matches = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True).match(d1, d2)
    src = np.float32([k1[m.queryIdx].pt for m in matches])
    dst = np.float32([k2[m.trainIdx].pt for m in matches])
    m, _ = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC)
    assert abs(abs(np.degrees(np.arctan2(m[1, 0], m[0, 0]))) - 25.0) < 1.0
    assert np.hypot(m[0, 0], m[1, 0]) == pytest.approx(1.0, abs=0.02)  # the same scale


def test_perspective_keeps_the_frame_and_foreshortens_one_side(photo):
    out = c.perspective(photo, rng(), degrees=30.0)
    assert out.shape == photo.shape
    h, w = photo.shape[:2]
    hm = c.perspective_homography(photo.shape, 30.0, 0.0)
    corners = cv2.perspectiveTransform(np.float32([[[0, 0]], [[w - 1, 0]], [[w - 1, h - 1]], [[0, h - 1]]]), hm)[:, 0]
    left, right = corners[3, 1] - corners[0, 1], corners[2, 1] - corners[1, 1]
    assert max(left, right) / min(left, right) > 1.3  # the far side looks shorter
    assert corners.min() >= -0.5 and corners[:, 0].max() <= w - 0.5 and corners[:, 1].max() <= h - 0.5
    flat = c.perspective_homography(photo.shape, 0.0, 0.0)
    np.testing.assert_allclose(flat / flat[2, 2], np.eye(3), atol=1e-6)


def test_glare_saturates_a_spot_and_leaves_most_of_the_photo(photo):
    out = c.glare(photo, rng())
    white = (out.min(axis=2) >= 250).mean() - (photo.min(axis=2) >= 250).mean()
    assert 0.002 < white < 0.1  # a saturated core of a few % of the frame
    # ... centred where it is brightest; far from it (beyond 7 of its 60-px radii) the photo is
    # almost untouched, the halo fading out
    new = (out.min(axis=2) >= 250) & (photo.min(axis=2) < 250)
    ys, xs = np.nonzero(new)
    yy, xx = np.mgrid[: photo.shape[0], : photo.shape[1]]
    far_away = np.hypot(yy - ys.mean(), xx - xs.mean()) > 420
    assert far_away.mean() > 0.2
    assert np.abs(out.astype(int) - photo).max(axis=2)[far_away].mean() < 5


def test_far_away_shrinks_the_photo_to_a_fifth_of_the_frame(photo):
    out = c.far(photo, rng(3), fraction=0.2)
    assert out.shape == photo.shape
    # the wall is smooth; the photo's region is where the image varies: find its bounding box
    grad = cv2.morphologyEx(cv2.cvtColor(out, cv2.COLOR_RGB2GRAY), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
    ys, xs = np.nonzero(grad > 20)
    area = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1) / (out.shape[0] * out.shape[1])
    assert area == pytest.approx(0.2, abs=0.03)


def test_webcam_gives_a_small_frame_scaled_to_the_photo(photo):
    out = c.webcam(photo, rng())
    assert out.shape[:2] == (480, 640)  # a 640×480 frame at 1000 px
    up = c.webcam(photo, rng(), upscale=True)
    assert max(up.shape[:2]) == 1000


def test_jpeg_quality_changes_the_photo_a_little(photo):
    low, high = c.jpeg(photo, rng(), quality=50), c.jpeg(photo, rng(), quality=95)
    err = [np.abs(x.astype(int) - photo).mean() for x in (low, high)]
    assert 0 < err[1] < err[0] < 8


def test_phone_is_the_steps_in_order_darker_and_the_same_size(photo):
    out = c.degrade(photo, "phone", seed=1)
    assert out.shape == photo.shape
    assert c.luminance(out).mean() < 0.8 * c.luminance(photo).mean()
    r = np.random.default_rng(1)
    by_hand = c.jpeg(c.dim(c.defocus(c.perspective(photo, r, degrees=15.0), r, radius=2.0), r, exposure=0.55,
                           photons=600.0), r, quality=85)
    assert np.array_equal(out, by_hand)


def test_photo_seed_is_stable_and_distinct():
    assert c.photo_seed("dim-0.3", "q01.jpg") == c.photo_seed("dim-0.3", "q01.jpg")
    seeds = {c.photo_seed(cond, f"q{i:02d}.jpg") for cond in c.CONDITIONS for i in range(20)}
    assert len(seeds) == 20 * len(c.CONDITIONS)
