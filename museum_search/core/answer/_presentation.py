"""How an answer is presented, decided once for every view: how sure it is, in a word (its
**confidence band**), and where the matched object lies in the visitor's photo (the **outline in the
photo's pixels**). The views only word and draw what these return: the kiosk's English sentences and
the phone page's French, German and English words are keyed by the band (``/api/identify`` gives it
as ``confidence_band``), and the phone page and the Search tab's evidence draw the points they get
here where they show the photo::

    confidence_band(answer.confidence)          # "sure", "likely", "might" (None: no confidence)
    outline_in_photo(matches, (width, height))  # (4, 2) in the photo's pixels, or None
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from museum_search.core.verification import Matches

#: How sure an answer is, most sure first: (band, floor), the band of a confidence is the first
#: whose floor it reaches. The floors are the kiosk's (0.95 / 0.8; the phone page said "sure" from
#: 0.9 and "probably" from 0.7 until both followed these): "sure" means at most one answer in twenty
#: is wrong, the same 5 % the verdict's threshold allows unknown objects to be accepted
#: (:data:`._verdict.TARGET_FALSE_ACCEPT`); one in ten is not "sure". Below "likely" (four in five)
#: the answer still passed the verdict, but the words say it might be wrong.
CONFIDENCE_BANDS: tuple[tuple[str, float], ...] = (("sure", 0.95), ("likely", 0.8), ("might", 0.0))


def confidence_band(confidence: float | None) -> str | None:
    """The band of ``confidence`` (the verdict's probability that the answer is right), one of
    :data:`CONFIDENCE_BANDS`'s names; None when the answer has no confidence."""
    if confidence is None:
        return None
    return next((band for band, floor in CONFIDENCE_BANDS if confidence >= floor), CONFIDENCE_BANDS[-1][0])


def in_photo(points: np.ndarray | Sequence[Sequence[float]], frame: tuple[float, float],
             photo_size: tuple[float, float]) -> np.ndarray:
    """``points`` ((n, 2) x, y) of an image verification saw, of size ``frame`` (width, height),
    in the pixels of the same photo at ``photo_size`` (width, height): (n, 2) float64."""
    sx = float(photo_size[0]) / max(1e-6, float(frame[0]))
    sy = float(photo_size[1]) / max(1e-6, float(frame[1]))
    return np.asarray(points, np.float64).reshape(-1, 2) * np.array([sx, sy])


def outline_in_photo(matches: Matches | None, photo_size: tuple[float, float]) -> np.ndarray | None:
    """The matched reference's outline (its corners carried into the query by the verification's
    homography, :attr:`Matches.outline`) in the pixels of the query photo of ``photo_size``
    (width, height): (4, 2) float64; None when the answer was not verified or nothing matched."""
    if matches is None or matches.outline is None:
        return None
    return in_photo(matches.outline, matches.query_size, photo_size)
