"""Is the object in the photo in this collection? A verdict from evidence, calibrated per collection.

The evidence of the top result is its cosine (the global descriptor's similarity, best region) and,
when the answer is verified, the number of homography inliers between the photo and that reference
(:mod:`museum_search.core.rerank.spatial`). A cosine of ImageNet features alone cannot separate
"known" from "unknown" (photos of unrelated paintings still score 0.8); geometric evidence can.

Calibration needs no labelled queries: :func:`calibrate` makes synthetic photos of references
(a crop, a perspective, other light, blur, a frame or a wall around them) and asks the query
pipeline about each twice: once against the whole collection (a *known* object: the evidence of
its correct answer) and once with every reference of its object left out (an *unknown* object: the
evidence of the best wrong answer). The thresholds are chosen so that the unknown views are
rejected, with a margin, while as many known views as possible are accepted; they are stored in the
index. :func:`operating_points` re-calibrates from a labelled query set (evaluation).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Generator, Sequence

import cv2
import numpy as np

from .progress import Progress

if TYPE_CHECKING:
    from .index import Index

#: RANSAC always explains 4 matches, and a handful more happen by chance: below this many inliers a
#: verification is noise, whatever the calibration says.
NOISE_INLIERS = 8
#: The smallest inlier threshold calibration chooses: noise plus a margin.
MIN_CALIBRATED = 12
#: A verified answer must be distinct: its inliers at least this many times those of the best
#: reference of any *other* object in the verified shortlist that matches the same part of the photo
#: (``QueryPipeline._rival``). Matches on what many objects share (the same frame moulding, the
#: museum's label cards) reach several objects alike; a photo of the object itself matches that
#: object far better than any other (Lowe's ratio test, per object).
DISTINCT = 2.0


@dataclass
class Verdict:
    """Thresholds of the "in this collection" decision on the top result's evidence."""

    min_inliers: int = 15  # verified answers: at least this many inliers...
    min_cosine_verified: float = 0.0  # ...and at least this cosine
    min_cosine: float = 0.8  # unverified answers (verification off): this cosine
    source: str = "default (not calibrated)"

    def decide(self, cosine: float, inliers: int | None, rival: int = 0) -> tuple[bool, str]:
        """(in the collection?, the reason in words) for the top result's evidence.

        ``rival``: the most inliers a reference of another object got on the same part of the photo
        (see :data:`DISTINCT`)."""
        if inliers is not None:
            if inliers >= self.min_inliers and inliers < DISTINCT * rival:
                return False, (f"not distinct: {inliers} matching points, but another object has {rival} "
                               "(what they share, such as a frame, matches; not the object itself)")
            if inliers >= self.min_inliers and cosine >= self.min_cosine_verified:
                return True, f"verified: {inliers} matching points (at least {self.min_inliers} needed)"
            if inliers < self.min_inliers:
                return False, (f"not verified: the best match has {inliers} matching points, "
                               f"{self.min_inliers} needed")
            return False, f"cosine {cosine:.3f} below {self.min_cosine_verified:.3f}"
        if cosine >= self.min_cosine:
            return True, f"cosine {cosine:.3f} at least {self.min_cosine:.3f} (not verified)"
        return False, f"cosine {cosine:.3f} below {self.min_cosine:.3f} (not verified)"

    def threshold(self, verified: bool = True) -> float:
        """The threshold that decides: inliers when verified, else the cosine."""
        return float(self.min_inliers if verified else self.min_cosine)

    def rule(self, verified: bool = True) -> str:
        """The decision in words, e.g. "at least 12 matching points"."""
        return f"at least {self.min_inliers} matching points" if verified else f"cosine at least {self.min_cosine:g}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Verdict":
        if not d:
            return cls()
        return cls(int(d.get("min_inliers", 15)), float(d.get("min_cosine_verified", 0.0)),
                   float(d.get("min_cosine", 0.8)), str(d.get("source", "stored")))

    @classmethod
    def of_index(cls, index: "Index") -> "Verdict":
        return cls.from_dict(getattr(index, "verdict", None))


# ---- synthetic views ---------------------------------------------------------------------------


def synthetic_view(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A photo of ``image`` as a visitor might take it: cropped, in perspective, in other light,
    blurred, with a frame and a wall around it (RGB uint8 in, RGB uint8 out)."""
    h, w = image.shape[:2]
    # crop: keep 70–100 % of each side
    cw, ch = int(w * rng.uniform(0.7, 1.0)), int(h * rng.uniform(0.7, 1.0))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = image[y0:y0 + ch, x0:x0 + cw]
    # a frame, then a wall
    frame = int(max(2, 0.04 * max(cw, ch) * rng.uniform(0.3, 1.0)))
    fcol = [int(v) for v in rng.integers(20, 200, 3)]
    img = cv2.copyMakeBorder(img, frame, frame, frame, frame, cv2.BORDER_CONSTANT, value=fcol)
    wall = [int(rng.uniform(0.05, 0.3) * s) for s in (img.shape[0], img.shape[0], img.shape[1], img.shape[1])]
    wcol = [int(v) for v in rng.integers(120, 240, 3)]
    img = cv2.copyMakeBorder(img, *wall, cv2.BORDER_CONSTANT, value=wcol)
    # perspective: move each corner by up to 8 % of the size
    hh, ww = img.shape[:2]
    src = np.float32([[0, 0], [ww, 0], [ww, hh], [0, hh]])
    jitter = rng.uniform(-0.08, 0.08, (4, 2)) * np.float32([ww, hh])
    dst = (src + jitter).astype(np.float32)
    dst -= dst.min(axis=0)
    out_w, out_h = int(dst[:, 0].max()) + 1, int(dst[:, 1].max()) + 1
    H = cv2.getPerspectiveTransform(src, dst)
    img = cv2.warpPerspective(img, H, (out_w, out_h), borderMode=cv2.BORDER_CONSTANT, borderValue=wcol)
    # light: contrast and brightness, a little colour cast
    gain = rng.uniform(0.7, 1.3) * rng.uniform(0.92, 1.08, 3)
    bias = rng.uniform(-30, 30)
    img = np.clip(img.astype(np.float32) * gain + bias, 0, 255).astype(np.uint8)
    # blur (focus, shake)
    sigma = rng.uniform(0.0, 1.5)
    if sigma > 0.3:
        img = cv2.GaussianBlur(img, (0, 0), sigma)
    return np.ascontiguousarray(img)


# ---- calibration -------------------------------------------------------------------------------


@dataclass
class Evidence:
    """The top answer's evidence for one calibration or evaluation query."""

    cosine: float
    inliers: int | None
    known: bool  # the object is in the collection (the correct answer could be found)
    correct: bool  # the top answer is the right object (only meaningful when known)
    rival: int = 0  # most inliers of a reference of another object (see :data:`DISTINCT`)

    def accepted(self, verdict: Verdict) -> bool:
        return verdict.decide(self.cosine, self.inliers, self.rival)[0]

    @property
    def distinct_inliers(self) -> int:
        """The inliers that count for the verdict: 0 when another object matches about as well."""
        n = self.inliers or 0
        return n if n >= DISTINCT * self.rival else 0


def choose(known: Sequence[Evidence], unknown: Sequence[Evidence], source: str,
           max_false_accept: float = 0.05) -> Verdict:
    """Thresholds that reject the unknown views (all but ``max_false_accept`` of them, with a 50 %
    margin, and never fewer than :data:`MIN_CALIBRATED` inliers) while accepting as many correctly
    answered known views as possible.

    The quantile, not the maximum: a collection may hold the same work twice under two numbers (the
    paintings set does), and one such pair must not raise the threshold for every visitor."""
    pos = [e for e in known if e.correct]
    inl_neg = np.array([e.distinct_inliers for e in unknown], float)
    cos_neg = np.array([e.cosine for e in unknown], float)
    cos_pos = np.array([e.cosine for e in pos], float)
    q = 1.0 - max_false_accept
    if len(inl_neg):
        # above the unknown views' counts (all of them, or all but ``max_false_accept``)
        worst = float(np.quantile(inl_neg, q, method="higher"))
        min_inliers = max(MIN_CALIBRATED, int(math.ceil(1.5 * worst)) + 1)
    else:
        min_inliers = 15
    min_cosine = 0.8
    if len(cos_neg) and len(cos_pos):
        # the cosine threshold (verification off) with the best balanced accuracy
        cands = np.unique(np.concatenate([cos_neg, cos_pos]))
        best = max(cands, key=lambda t: (np.mean(cos_pos >= t) + np.mean(cos_neg < t), -t))
        min_cosine = float(best)
    return Verdict(min_inliers, 0.0, round(min_cosine, 4), source)


def calibrate(index: "Index", extractor=None, views: int | None = None, seed: int = 0
              ) -> Generator[Progress, None, Verdict]:
    """Calibrate the verdict of ``index`` on synthetic views of its references (see the module doc).

    ``views``: how many synthetic photos (default: one per reference, at least 20, at most 50).
    Needs at least two objects in the collection (otherwise the default verdict is returned).
    """
    labels = index.labels
    if len(set(labels.tolist())) < 2:
        return Verdict(source="default (a collection of one object cannot be calibrated)")
    known, unknown = yield from calibration_evidence(index, extractor, views, seed)
    verdict = choose(known, unknown, f"synthetic views ({len(known)} known, {len(unknown)} unknown)")
    pos = [e for e in known if e.correct]
    if pos and unknown:
        verdict.source += (
            f"; accepts {np.mean([e.accepted(verdict) for e in pos]):.0%} of the correctly "
            f"answered known views, rejects {np.mean([not e.accepted(verdict) for e in unknown]):.0%}"
            " of the unknown")
    return verdict


def calibration_evidence(index: "Index", extractor=None, views: int | None = None, seed: int = 0
                         ) -> Generator[Progress, None, tuple[list[Evidence], list[Evidence]]]:
    """(known, unknown) evidence of synthetic views of references (see the module doc)."""
    from .images import load_image
    from .query import QueryImage, QueryPipeline, QuerySettings

    labels = index.labels
    n = len(index)
    views = views if views is not None else max(20, min(50, n))
    rng = np.random.default_rng(seed)
    rows = rng.choice(n, size=views, replace=views > n)
    pipe = QueryPipeline(index, QuerySettings(k=1, verdict=Verdict(min_inliers=NOISE_INLIERS)),
                         extractor=extractor)
    pipe.rivals_anywhere = True  # a synthetic view shows one object
    known: list[Evidence] = []
    unknown: list[Evidence] = []
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        row = int(row)
        try:
            ref = load_image(index.abspath(row), max_side=pipe.verify_side)
        except Exception:  # noqa: BLE001 - an unreadable reference is simply not used
            yield Progress(i + 1, views, stage="calibrating", elapsed=time.perf_counter() - t0)
            continue
        view = QueryImage(f"synthetic view of {index.items[row].path}", synthetic_view(ref, rng))
        same = labels == labels[row]
        desc = pipe.describe([view])  # described once, asked twice
        (a_in,) = pipe.answer([view], desc)
        (a_out,) = pipe.answer([view], desc, exclude=same)
        top_in = a_in.results[0]
        known.append(a_in.evidence(True, top_in.instance == labels[row]))
        unknown.append(a_out.evidence(False, False))
        yield Progress(i + 1, views, current=view.name, stage="calibrating", elapsed=time.perf_counter() - t0)
    return known, unknown


# ---- evaluation: the verdict against labelled queries -------------------------------------------


def open_set_figures(evidence: Sequence[Evidence], verdict: Verdict) -> dict[str, float | int | None]:
    """Share of unknown queries rejected, of known queries wrongly rejected, and accuracy (the right
    answer, or a right rejection) of ``verdict`` on labelled queries' top-answer evidence."""
    known = [e for e in evidence if e.known]
    unknown = [e for e in evidence if not e.known]
    acc_known = [e.accepted(verdict) for e in known]
    acc_unknown = [e.accepted(verdict) for e in unknown]
    right = sum(1 for e, a in zip(known, acc_known) if a and e.correct) + sum(1 for a in acc_unknown if not a)
    return {
        "known_queries": len(known),
        "unknown_queries": len(unknown),
        "unknown_rejected": (sum(1 for a in acc_unknown if not a) / len(unknown)) if unknown else None,
        "known_rejected": (sum(1 for a in acc_known if not a) / len(known)) if known else None,
        "accuracy": right / len(evidence) if evidence else None,
    }


def operating_points(evidence: Sequence[Evidence], verified: bool = True) -> dict[str, np.ndarray]:
    """The verdict's figures against its threshold (inliers when ``verified``, else cosine): the
    curve a user picks an operating point on (arrays of equal length)."""
    if verified:
        top = max([e.inliers or 0 for e in evidence] + [NOISE_INLIERS]) + 2
        thresholds = np.arange(0, top + 1, dtype=float)
    else:
        thresholds = np.unique(np.round([e.cosine for e in evidence] + [0.0, 1.0], 4))
    out = {"threshold": thresholds, "unknown_rejected": [], "known_rejected": [], "accuracy": []}
    for t in thresholds:
        v = Verdict(min_inliers=int(t), min_cosine=float(t)) if verified else Verdict(min_cosine=float(t))
        ev = evidence if verified else [Evidence(e.cosine, None, e.known, e.correct, 0) for e in evidence]
        f = open_set_figures(ev, v)
        for key in ("unknown_rejected", "known_rejected", "accuracy"):
            out[key].append(np.nan if f[key] is None else f[key])
    return {k: np.asarray(v, float) for k, v in out.items()}


def recalibrated(evidence: Sequence[Evidence], current: Verdict, max_known_rejected: float = 0.03,
                 verified: bool = True) -> Verdict:
    """The threshold that rejects the most unknown queries while wrongly rejecting at most
    ``max_known_rejected`` of the known ones (an operating point on :func:`operating_points`)."""
    pts = operating_points(evidence, verified)
    ok = np.flatnonzero(np.nan_to_num(pts["known_rejected"], nan=0.0) <= max_known_rejected)
    if len(ok) == 0:
        return current
    best = ok[np.argmax(np.nan_to_num(pts["unknown_rejected"][ok], nan=0.0) + 1e-9 * pts["threshold"][ok])]
    t = float(pts["threshold"][best])
    src = f"labelled queries ({len(evidence)}), at most {max_known_rejected:.0%} of known objects rejected"
    if verified:
        return Verdict(max(NOISE_INLIERS, int(t)), current.min_cosine_verified, current.min_cosine, src)
    return Verdict(current.min_inliers, current.min_cosine_verified, t, src)
