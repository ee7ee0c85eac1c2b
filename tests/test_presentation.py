"""How an answer is presented, decided once in core (:mod:`museum_search.core.answer._presentation`):
the confidence band every view words, and the matched outline in the photo's pixels.

(The band in the API's JSON and the kiosk's sentence for it are checked together in
tests/test_serve.py, the page's words in tests/test_serve_browser.py, the evidence as drawn in
tests/test_gui_search.py.)
"""

from __future__ import annotations

import cv2
import numpy as np
from test_spatial import H_KNOWN, textured, warped

from museum_search.core.answer import CONFIDENCE_BANDS, confidence_band, in_photo, outline_in_photo
from museum_search.core.verification import _spatial as spatial
from museum_search.core.verification._spatial import Matches, SpatialParams


def _project(H: np.ndarray, w: float, h: float) -> np.ndarray:
    corners = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float64).reshape(-1, 1, 2)
    return cv2.perspectiveTransform(corners, H).reshape(-1, 2)


def test_confidence_bands_and_their_floors():
    floors = [floor for _, floor in CONFIDENCE_BANDS]
    assert floors == sorted(floors, reverse=True) and floors[-1] == 0.0
    assert [band for band, _ in CONFIDENCE_BANDS] == ["sure", "likely", "might"]
    assert confidence_band(None) is None
    cases = {1.0: "sure", 0.95: "sure", 0.9499: "likely", 0.9: "likely", 0.8: "likely", 0.7999: "might",
             0.7: "might", 0.5: "might", 0.0: "might"}
    for confidence, band in cases.items():
        assert confidence_band(confidence) == band, confidence


def test_outline_in_photo_is_the_homography_scaled_into_the_photo():
    """A reference (300 × 200) seen through a known homography in a verification frame of
    640 × 480: the photo itself is 1600 × 1200 (scale 2.5), or stretched to 1280 × 1440."""
    H = np.array([[0.8, 0.1, 40.0], [-0.05, 0.9, 30.0], [1e-4, 2e-4, 1.0]])
    outline = _project(H, 300, 200).astype(np.float32)
    empty = np.empty((0, 2), np.float32)
    m = Matches(30, empty, empty, outline, (640.0, 480.0), (300.0, 200.0))
    for photo in ((1600, 1200), (1280, 1440), (640, 480)):
        S = np.diag([photo[0] / 640, photo[1] / 480, 1.0])
        got = outline_in_photo(m, photo)
        assert got is not None and got.shape == (4, 2) and got.dtype == np.float64
        np.testing.assert_allclose(got, _project(S @ H, 300, 200), atol=1e-3)
    np.testing.assert_allclose(in_photo(outline, (640, 480), (1600, 1200)), outline.astype(np.float64) * 2.5)
    assert outline_in_photo(None, (100, 100)) is None
    assert outline_in_photo(Matches(0, empty, empty, None, (640.0, 480.0), (300.0, 200.0)), (100, 100)) is None


def test_outline_of_a_verified_photo_lands_on_the_reference_in_it():
    """End to end: a reference warped by a known homography, the photo three times larger than
    that (verification sees it at 640 px); the outline core gives in the photo's pixels is the
    reference's corners carried by the homography and the scale."""
    base = textured(1)
    photo = cv2.resize(warped(base), None, fx=3, fy=3, interpolation=cv2.INTER_CUBIC)  # 1200 × 900
    params = SpatialParams(max_side=640)
    size_a, size_b = spatial._resized_size(photo, 640), spatial._resized_size(base, 640)
    m = spatial.matches_of(spatial.query_features(photo, params), spatial.extract_features(base, params),
                           params, size_a, size_b)
    assert m.inliers > 30
    got = outline_in_photo(m, (photo.shape[1], photo.shape[0]))
    h, w = base.shape[:2]
    want = _project(np.diag([3.0, 3.0, 1.0]) @ H_KNOWN, w, h)
    assert got is not None
    np.testing.assert_allclose(got, want, atol=6.0)  # a few photo pixels: RANSAC's fit, at 1200 px

