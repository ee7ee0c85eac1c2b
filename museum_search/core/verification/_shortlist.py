"""Verification of a query photo's shortlist, and the evidence its verdict is judged on.

The best ``verify_top`` references of the global scores are matched with the photo (local features
and a homography, :mod:`museum_search.core.verification._spatial`, with the index's own matcher). What verification decides:

* **the order**: a reference's object counts by the best inliers of its photos, or of the objects
  verification cannot tell from it (:func:`object_inliers`); verified objects are lifted above the
  others (:func:`museum_search.core.verification._spatial.blend`);
* **the evidence of the top answer** (:meth:`Verification.top_evidence`): the inliers of its object's
  best photo and the **rival** inliers, the most of a reference of another object on the same part
  of the photo (:data:`museum_search.core.answer._verdict.DISTINCT`); with the cosine **margin** (:func:`cosine_margin`) they
  are what :class:`museum_search.core.answer._verdict.Verdict` judges;
* **the matches** a viewer draws (:meth:`Verification.matches`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cv2
import numpy as np

from museum_search.core.index import Features, Index
from museum_search.core.ranking import order
from museum_search.core.verification._spatial import (
    Matches,
    SpatialParams,
    Verifier,
    blend,
    closer_features,
    matches_of,
    outline_overlap,
    part_features,
    query_features,
)

#: A verified answer must be distinct: its inliers at least this many times those of the best
#: reference of any *other* object in the verified shortlist that matches the same part of the photo
#: (:meth:`Verification.rival`). Matches on what many objects share (the same frame moulding, the
#: museum's label cards) reach several objects alike; a photo of the object itself matches that
#: object far better than any other (Lowe's ratio test, per object).
DISTINCT = 2.0
#: Another object's matches lie apart from an object's in the photo (two objects, not what they
#: share matched twice) when the hulls of their inlier points in the photo overlap less than this
#: (intersection over union, :func:`museum_search.core.verification._spatial.outline_overlap`) and
#: less than this share of its inlier points lie in the object's hull.
APART = 0.5


def _hull(points: np.ndarray) -> np.ndarray | None:
    pts = np.asarray(points, np.float32).reshape(-1, 2)
    return cv2.convexHull(pts).reshape(-1, 2) if len(pts) >= 3 else None


def apart(mine: Matches, theirs: Matches) -> bool:
    """The matches ``theirs`` (another reference's) lie apart from ``mine`` in the photo, on
    another part of it (:data:`APART`): where the inliers of each lie (their convex hull in the
    photo), not the references' whole outlines, which reach beyond what shows (a reference with the
    wall around the object). Matches of what objects share (a frame, a texture) fall on the
    object's own place in the photo; a work beside it has its matches beside it."""
    a, b = _hull(mine.query_points), _hull(theirs.query_points)
    if a is None or b is None or outline_overlap(a, b) >= APART:
        return False
    poly = a.reshape(-1, 1, 2)
    pts = np.asarray(theirs.query_points, np.float32).reshape(-1, 2)
    inside = sum(cv2.pointPolygonTest(poly, (float(x), float(y)), False) >= 0 for x, y in pts)
    return inside < APART * len(pts)


def object_inliers(inliers: np.ndarray, labels: np.ndarray, gate: int) -> np.ndarray:
    """The inliers each verified reference is ranked by: the best of its object, or of the objects
    verification cannot tell from it (best inliers within :data:`museum_search.core.answer._verdict.DISTINCT` of each other).

    So verification lifts the objects it verifies, with every photo of them in the shortlist (a 3D
    object's other views do not verify, they are the same object), and leaves the order among the
    photos of objects it verifies alike (near-identical objects: two boxes of one brand in COIL-100)
    to the global score. Photos of objects with no reference at ``gate`` keep their count."""
    inliers = np.asarray(inliers)
    ok = inliers >= gate
    best: dict[str, int] = {}
    for lab, n in zip(labels[ok], inliers[ok]):
        best[lab] = max(best.get(lab, 0), int(n))
    out = inliers.copy()
    for i in range(len(out)):
        mine = best.get(labels[i])
        if mine is not None:  # every shortlisted photo of a verified object, verified itself or not
            out[i] = max(b for b in best.values() if max(b, mine) < DISTINCT * min(b, mine))
    return out


def cosine_margin(labels: np.ndarray, instance: str, cosine: float, cos: np.ndarray, valid: np.ndarray) -> float:
    """The top result's ``cosine`` minus the best cosine of a reference of another object than
    ``instance`` among the ``valid`` (not left out, scored) references; the cosine itself when there
    is none."""
    cos = np.where(valid & np.isfinite(cos), cos, -np.inf)
    for n in (64, len(cos)):  # the nearest few first; the whole gallery when they are all one object
        near = order(cos, n)
        near = near[np.isfinite(cos[near])]
        other = near[labels[near] != instance]
        if len(other):
            return float(cosine - cos[other[0]])
        if len(near) < n:
            break
    return float(cosine)


#: A photo shows a *part* of a reference when what it covers of it is at most this share of its area
#: (:meth:`Verification.shown_part`): a close-up of a work whose reference shows its frame and the
#: wall around it. The sample's q04 shows 13 % of its reference; a photo of another work in the
#: same frame, matched on the frame, covers 64-98 %.
PART = 0.5
#: ... and at least this many pixels on each side of the reference's frame (a part to describe).
MIN_PART_SIDE = 32


#: A first look is sure when the best object of the shortlist has at least this many inliers; below
#: it, the photo is looked at again, closer (:meth:`Verification.shortlist`). Dim, blurred, angled
#: or distant photos of known objects fall below it: at 320 px, 12 % of the protocol's phone-like
#: paintings have fewer than 8 inliers with their right reference (``bench/bench_visitors.py``).
SURE = 20
#: The second look verifies this many of the best references by global score (the deep shortlist):
#: on the protocol's phone-like paintings the right one is in the first 20 for 93 %, in the first
#: 100 for 97 %; from afar, 77 % and 95 %.
DEEP = 100


class Verification:
    """Verifies the shortlists of one index's queries (see the module docstring).

    ``gate``: the inliers at which an object counts as verified (the verdict's ``min_inliers``);
    ``rivals_anywhere``: count a strong rival wherever it matches in the photo (calibration: a
    synthetic view shows one object, so any strong rival matches what objects share); ``deep``: how
    many references the second, closer look verifies (:data:`DEEP`; 0: no second look)."""

    def __init__(self, index: Index, params: SpatialParams, gate: int, rivals_anywhere: bool = False,
                 deep: int = DEEP):
        self.index = index
        self.verifier = Verifier(params)
        self.gate = int(gate)
        self.rivals_anywhere = rivals_anywhere
        self.deep = int(deep)
        #: the last photo's features, of each look ("first", "closer")
        self._last: dict[str, tuple[weakref.ref, Features]] = {}
        self._pool: ThreadPoolExecutor | None = None

    @property
    def params(self) -> SpatialParams:
        return self.verifier.params

    def features(self, image: np.ndarray) -> Features:
        """The local features of the photo ``image`` (:func:`museum_search.core.verification._spatial.query_features`),
        computed once: the same array asked about again (calibration asks each view twice, as a
        known and as an unknown object) gets the features already computed."""
        return self._once("first", image, query_features)

    def closer(self, image: np.ndarray) -> Features:
        """The photo's features for the second look (:func:`museum_search.core.verification._spatial.closer_features`),
        computed once per photo as :meth:`features`."""
        return self._once("closer", image, closer_features)

    def _once(self, look: str, image: np.ndarray, compute) -> Features:
        last = self._last.get(look)
        if last is not None and last[0]() is image:
            return last[1]
        qf = compute(image, self.params)
        self._last[look] = (weakref.ref(image), qf)
        return qf

    def part(self, image: np.ndarray, box: tuple[int, int, int, int], rows: np.ndarray) -> tuple[Features, np.ndarray]:
        """A closer look at the part ``box`` (x0, y0, x1, y1 px) of the photo ``image`` alone: its
        features in the photo's frame (:func:`museum_search.core.verification._spatial.part_features`)
        and the inliers of each reference of ``rows`` with them. What the viewers drew from the
        photo's shortlist is restored by the caller (``verifier.restore_found``)."""
        qf = part_features(image, box, self.params)
        return qf, self.verifier.verify_rows(qf, rows, self.index)

    def _closer_pool(self) -> ThreadPoolExecutor:
        """The thread that computes a photo's closer features (OpenCV releases the GIL) while the
        network describes its halves."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="closer-look")
        return self._pool

    def _second_look(self, inliers: np.ndarray) -> bool:
        """Whether a photo whose first look found ``inliers`` is looked at again: a second look asked
        for, SIFT (or ORB) features (XFeat's see dim and blurred photos at their one side), and the
        first look unsure (:data:`SURE`)."""
        return (self.deep > 0 and self.params.effective_feature != "xfeat"
                and (int(inliers.max()) if len(inliers) else 0) < SURE)

    def shortlist(self, image: np.ndarray, scores: np.ndarray, top: int, qf: Features | None = None,
                  live: np.ndarray | None = None, more: Callable[[], np.ndarray] | None = None
                  ) -> tuple[np.ndarray, dict[int, int], Features | None]:
        """Verify the ``top`` best references of ``scores`` with the photo ``image`` (``qf``: its
        features, when already computed; ``live``: the rows with a finite score, ascending, when
        they are few — then only those are ranked): (the scores with the verified objects lifted,
        row → inliers of each verified reference, the photo's local features; None when nothing
        was verified). ``more``: called when the second look is taken, the further rows it verifies
        too (the best of the photo's halves: ``QueryPipeline._half_rows``; their ``scores`` made
        finite by it), in the places of the last of its ``deep`` (never of the first ``top``): the
        second look verifies no more references than without them."""
        short = self._best(scores, top, live)
        if not len(short):
            return scores, {}, None
        qf = self.features(image) if qf is None else qf
        inl = self.verifier.verify_rows(qf, short, self.index)
        if self._second_look(inl):
            # unsure: look again, closer (the light normalised, at the stored features' side) and
            # deeper; the look that finds more on its best reference is kept
            deep = self._best(scores, max(top, self.deep), live)
            try:  # on a thread while the halves are described
                closing = self._closer_pool().submit(self.closer, image)
            except RuntimeError:  # the interpreter is ending (a Ctrl-C ended the command): no new work on a thread
                closing = None
            if more is not None:  # the halves' best take the places of the last of the deep list
                extra = more()
                extra = extra[~np.isin(extra, deep)]
                deep = np.concatenate([deep[:max(top, len(deep) - len(extra))], extra])
            first = self.verifier.last_found()
            closer = self.closer(image) if closing is None else closing.result()
            inl_closer = self.verifier.verify_rows(closer, deep, self.index)
            if inl_closer.max() > inl.max():
                short, inl, qf = deep, inl_closer, closer
            else:  # the first look stands: what it found is what the viewers draw
                self.verifier.restore_found(first)
        verified = {int(r): int(n) for r, n in zip(short, inl)}
        scores = scores.copy()
        scores[short] = blend(scores[short], object_inliers(inl, self.index.labels[short], self.gate),
                              self.params, self.gate)
        return scores, verified, qf

    @staticmethod
    def _best(scores: np.ndarray, top: int, live: np.ndarray | None) -> np.ndarray:
        """The rows of the ``top`` best finite ``scores`` (``live``: the finite rows, when few)."""
        short = order(scores, top) if live is None else live[order(scores[live], top)]
        return short[np.isfinite(scores[short])]

    def top_evidence(self, image: np.ndarray, qf: Features, instance: str, verified: dict[int, int]
                     ) -> tuple[int, int, int]:
        """(inliers, rival inliers, expected) of the top result's object ``instance``: the inliers of
        its best verified photo, :meth:`rival`, and the points that could have matched (the fewer of
        the photo's keypoints ``qf`` and that photo's: :attr:`museum_search.core.answer._verdict.Evidence.expected`)."""
        items = self.index.items
        inliers, row = max((n, r) for r, n in verified.items() if items[r].instance == instance)
        ref = self.verifier.reference_features(self.index, int(row))
        expected = min(len(qf[0]), len(ref[0][0])) if ref is not None else 0
        return inliers, self.rival(image, qf, instance, row, inliers, verified), expected

    def shown_part(self, image: np.ndarray, row: int, qf: Features) -> tuple[float, float, float, float] | None:
        """The part of reference ``row`` the photo shows, when it shows at most :data:`PART` of its area
        (a close-up of a work whose reference has its frame and the wall around it): the box
        (x0, y0, x1, y1), as shares of the reference's width and height, that the photo's corners
        fall on by the homography the last verification found; None without one, or when the photo
        shows more."""
        found = self.verifier.found(qf, self.index, row)
        got = self.verifier.reference_features(self.index, int(row))
        if found is None or found[2] is None or got is None:
            return None
        rw, rh = got[1]
        h, w = image.shape[:2]
        s = min(1.0, self.params.max_side / max(h, w))
        qw, qh = w * s, h * s
        try:
            inv = np.linalg.inv(found[2])
        except np.linalg.LinAlgError:
            return None
        corners = np.array([[0, 0], [qw, 0], [qw, qh], [0, qh]], np.float64).reshape(-1, 1, 2)
        on_ref = cv2.perspectiveTransform(corners, inv).reshape(-1, 2)
        x0, y0 = np.clip(on_ref.min(axis=0), 0, [rw, rh])
        x1, y1 = np.clip(on_ref.max(axis=0), 0, [rw, rh])
        if (x1 - x0) * (y1 - y0) > PART * rw * rh or min(x1 - x0, y1 - y0) < MIN_PART_SIDE:
            return None
        return float(x0 / rw), float(y0 / rh), float(x1 / rw), float(y1 / rh)

    def rival(self, image: np.ndarray, qf: Features, instance: str, row: int, inliers: int,
              verified: dict[int, int]) -> int:
        """The most inliers a reference of another object has *on the same part of the photo* as
        the answer ``instance`` (its best verified photo ``row``, ``inliers``; see
        :data:`museum_search.core.answer._verdict.DISTINCT`).

        Matches on what objects share (a frame moulding) put both references on the same place in
        the photo; a photo of two paintings side by side puts them apart, and both are right. So a
        rival is set aside only when it is an object of its own (at least the gate: a second object
        in the photo, judged on its own evidence: :meth:`further_objects`) and its
        matches lie :func:`apart` from the answer's. The same holds for every
        object of a photo: the top answer and each further object. With ``rivals_anywhere`` (or an
        answer below the gate, whose outline says nothing) the strongest other object counts."""
        others = sorted(((n, r) for r, n in verified.items() if self.index.items[r].instance != instance),
                        reverse=True)
        if self.rivals_anywhere or inliers < self.gate:
            return others[0][0] if others else 0
        mine = None
        for n, r in others:
            if n < self.gate:  # not an object of its own: what it shares with the answer matches
                return n
            mine = self.matches(image, row, qf) if mine is None else mine
            if not apart(mine, self.matches(image, r, qf)):
                return n
        return 0

    def further_objects(self, verified: dict[int, int], found: set[str]) -> list[tuple[str, int, int]]:
        """The objects of the verified shortlist that may be further objects in the photo, besides
        the ``found`` ones: (instance, its best verified photo's row, its inliers) of each object
        whose best photo has at least the gate, most inliers first (ties: the lower row). Whether
        one is an object of the photo (apart from those found, judged by the verdict on its own
        evidence) the caller decides (:meth:`museum_search.core.answer._pipeline.QueryPipeline`)."""
        best: dict[str, tuple[int, int]] = {}
        items = self.index.items
        for r, n in verified.items():
            inst = items[r].instance
            if n >= self.gate and inst not in found and (n, -r) > best.get(inst, (0, 1)):
                best[inst] = (n, -r)
        return [(inst, -neg_row, n) for inst, (n, neg_row) in sorted(best.items(), key=lambda kv: kv[1], reverse=True)]

    def matches(self, image: np.ndarray, row: int, qf: Features | None = None) -> Matches:
        """The inlier matches and projected outline of reference ``row`` in the photo ``image``
        (``qf``: the photo's local features, when already extracted)."""
        params = self.params
        ref = self.verifier.reference_features(self.index, int(row))
        h, w = image.shape[:2]
        s = min(1.0, params.max_side / max(h, w))
        size_q = (max(1, round(w * s)), max(1, round(h * s)))
        qf = self.features(image) if qf is None else qf
        if ref is None:
            empty = np.empty((0, 2), np.float32)
            return Matches(0, empty, empty, None, size_q, (1.0, 1.0))
        # a reference of the shortlist just verified (the top result, its rivals): what was found then
        return matches_of(qf, ref[0], params, size_q, ref[1], self.verifier.found(qf, self.index, row))


#: How near the photo's edge a point is "near the border": this share of the photo's longer side.
BORDER = 0.05


@dataclass(frozen=True)
class MatchedArea:
    """What a reference's inlier matches cover (:func:`matched_area`), in the frames of the
    :class:`museum_search.core.verification._spatial.Matches` it comes from."""

    reference: np.ndarray  # (k, 2) the convex hull of the inliers on the reference
    query: np.ndarray  # (m, 2) that hull carried into the photo by the inliers' homography, clipped to the photo
    middle: int  # inliers in the middle of the area: its hull shrunk to half its size about its centre
    near_border: int  # inliers within BORDER of the photo's longer side from the photo's edge


def _inside_convex(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """(n,) whether each point lies in the convex ``polygon`` (its vertices in order) or on its edge."""
    v = polygon.reshape(-1, 2).astype(np.float64)
    e = np.roll(v, -1, axis=0) - v
    d = points.reshape(-1, 1, 2).astype(np.float64) - v[None]
    cross = e[None, :, 0] * d[..., 1] - e[None, :, 1] * d[..., 0]
    return np.all(cross >= -1e-6, axis=1) | np.all(cross <= 1e-6, axis=1)


def matched_area(m: Matches) -> MatchedArea | None:
    """The part of the reference the inliers of ``m`` cover, in both images, and where the inliers
    lie in it; None without a homography (or with a degenerate one).

    The reference's whole outline (``m.outline``) reaches beyond the photo when the reference shows
    more than the photo does (a framed picture with the wall around it); the matched area is what
    matched, and lies in the photo. Points in the area's middle, not only around its edges, are
    what a match of a picture's content has; a match of what framed pictures share (a frame
    moulding, a wall label) has them around the edges only, and so can a few clustered details."""
    ref = np.asarray(m.reference_points, np.float32).reshape(-1, 2)
    photo = np.asarray(m.query_points, np.float32).reshape(-1, 2)
    if m.outline is None or len(ref) < 4:
        return None
    hull = cv2.convexHull(ref).reshape(-1, 2)
    H, _ = cv2.findHomography(ref, photo, 0)  # least squares on the inliers alone
    carried = photo if H is None else cv2.perspectiveTransform(hull.reshape(-1, 1, 2), H).reshape(-1, 2)
    w, h = m.query_size
    frame = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32).reshape(-1, 1, 2)
    _, clipped = cv2.intersectConvexConvex(cv2.convexHull(carried.astype(np.float32)), frame)
    if clipped is None or len(clipped) < 3:
        return None
    moments = cv2.moments(hull)
    centre = (np.array([moments["m10"], moments["m01"]]) / moments["m00"] if moments["m00"] > 0
              else hull.mean(axis=0))
    middle = int(np.count_nonzero(_inside_convex(ref, (hull - centre) * 0.5 + centre)))
    b = BORDER * max(w, h)
    near = (photo[:, 0] < b) | (photo[:, 1] < b) | (photo[:, 0] > w - b) | (photo[:, 1] > h - b)
    return MatchedArea(hull, clipped.reshape(-1, 2).astype(np.float32), middle, int(np.count_nonzero(near)))
