"""Is the object in the photo in this collection? A verdict from all the evidence, calibrated per collection.

The evidence of the top result (:class:`Evidence`):

* its **cosine** (the global descriptor's similarity, best region; for a close-up, verified, the
  similarity with the part of the reference it shows, when higher:
  :meth:`museum_search.core.answer._pipeline.QueryPipeline._part_cosine`);
* its **margin**: that cosine minus the best cosine of a reference of any *other* object (a photo of
  a known object is usually clearly closer to it than to anything else; an unknown object's best
  match is one of several similar ones);
* when the answer is verified, the **inliers** of its object's best photo (homography inliers
  between the photo and that reference, :mod:`museum_search.core.verification._spatial`, SIFT or XFeat)
  and the **rival** inliers, the most of a reference of another object on the same part of the photo
  (what objects share, such as a frame moulding, matches several objects alike), counted beyond the
  4 that any homography explains (:data:`RIVAL_CHANCE`: a rival of 4 or 5 points is chance, not a
  frame that two works share);
* for an index built with a learned whitening (:mod:`museum_search.core.answer._whitening`), the
  **whitened** cosine and margin (``wcosine``, ``wmargin``), which the model reads in place of the
  plain ones (:data:`WHITENED`);
* when verified, the points that **could have matched** (:attr:`Evidence.expected`: the fewer of the
  photo's keypoints and those of that reference photo). Few inliers mean little on a plain object
  that has few points at all (a rubber duck, a black glaze), and much on a textured one: a look-alike
  of a textured object has the colours and shape but not the points. Without this, a look-alike is
  accepted on its global similarity alone (COIL-100 with its last 20 objects left out: unknown
  objects accepted with 5-7 inliers and a cosine margin of 0.08-0.10, ``bench/bench_verdict.py``).

A cosine of ImageNet features alone cannot separate "known" from "unknown" on flat paintings (photos
of unrelated paintings still score 0.8), where inliers can; inliers cannot on 3D, dark or glossy
objects (another side of a statue, a black painting: SIFT finds nothing), where the cosine and its
margin still can. So the verdict is a small model of all of them, fitted per collection
(:class:`Model`, a logistic regression on standardized features with the sign of each weight fixed:
more similarity, margin or inliers never count against an answer, a stronger rival never for it).
It gives each answer a **confidence** (the model's probability that the top answer is right), and
the answer is "in the collection" when the confidence reaches the model's threshold, chosen so that
at most :data:`TARGET_FALSE_ACCEPT` of the unknown objects of the calibration are accepted. A
near-exact copy of a reference (cosine at least :data:`EXACT_COPY`) is always recognised.

Calibration needs no labelled queries (:func:`museum_search.core.jobs._calibration.calibrate`): it asks the query pipeline about

* **real views** where the collection has them: a reference photo of an object with two or more
  photos, queried with that one photo left out (a *known* object seen from another side) and with
  its whole object left out (an *unknown* object);
* **synthetic views** for one-photo objects, and as a complement: a crop, a perspective, other
  light, blur, a frame or a wall around a reference, queried with the whole collection (known) and
  with its object left out (unknown).

The evidence is stored with the verdict, so that an update refits the model from it and the new
photos' own views (:func:`museum_search.core.jobs._calibration.refit`) instead of calibrating again. :func:`recalibrated` refits the
same model on a labelled query set (evaluation, ``--calibrate-verdict``).

Without a model (an index calibrated by an older version, or thresholds given on the command line)
the verdict is the rule of thresholds (:attr:`Verdict.min_inliers`, :attr:`Verdict.min_cosine`),
with a confidence that is 0.5 at the threshold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from museum_search.core.errors import MuseumSearchError
from museum_search.core.verification import DISTINCT, MIN_MATCHES

#: RANSAC always explains 4 matches, and a handful more happen by chance: below this many inliers a
#: verification is noise, whatever the calibration says.
NOISE_INLIERS = 8
#: The smallest inlier threshold calibration chooses: noise plus a margin.
MIN_CALIBRATED = 12
#: A rival's inliers up to this many are chance: a homography fits any 4 point pairs exactly
#: (``rival_excess`` counts those beyond). Counted from the first one (``rival``, the models fitted
#: before), a 5-point rival on the sample's phone-like q04 outweighed its 20 points; from the fifth,
#: on the visitor protocol (``bench/bench_visitors.py``) the known refused fall on phone-like photos
#: (13.3 -> 12.7 %), phone-hard, far, tilted and glared ones, and on COIL's last-20 split
#: (``bench/bench_verdict.py``) 5.9 -> 4.6 %, no unknown more accepted on the protocol.
RIVAL_CHANCE = MIN_MATCHES
#: The share of unknown objects the calibrated verdict may wrongly accept (its threshold).
TARGET_FALSE_ACCEPT = 0.05
#: A top result at least this similar is a copy of that reference: always "in the collection".
EXACT_COPY = 0.99
#: Below this share of known views accepted by its own calibration, a verdict is weak: the app warns.
WEAK_KNOWN_ACCEPTED = 0.80
#: The model's features, with the sign their weight must have (+1: for an answer, -1: against).
FEATURES = {"cosine": 1, "margin": 1, "inliers": 1, "rival": -1, "rival_excess": -1, "unmatched": -1,
            "wcosine": 1, "wmargin": 1}
VERIFIED_FEATURES = ("cosine", "margin", "inliers", "rival_excess", "unmatched")
#: The rival's features: ``rival`` (all its inliers; the models stored before ``rival_excess``, read
#: as they were fitted) and ``rival_excess``.
RIVAL_FEATURES = ("rival", "rival_excess")
#: A rejected answer is called a look-alike's ("few of its points match") only when fewer than one in
#: this many of the points that could match do; otherwise it has too few points at all.
UNMATCHED_SHARE = 4
#: The verified model of evidence stored without :attr:`Evidence.expected` (an index calibrated by an
#: older version, refitted by an update): the features it can give (its stored rival counts give
#: ``rival_excess``; a model stored with ``rival`` is read with ``rival`` until refitted).
VERIFIED_FEATURES_BEFORE = ("cosine", "margin", "inliers", "rival_excess")
COSINE_FEATURES = ("cosine", "margin")
#: The similarity features of an index with a learned whitening (:mod:`museum_search.core.answer._whitening`),
#: in place of ``cosine`` and ``margin``: the whitened cosine and its margin over the best other object.
WHITENED = {"cosine": "wcosine", "margin": "wmargin"}
#: At most this many real views (a photo of an object with other photos) in a calibration.
REAL_VIEWS = 60
#: The operating point shown to users is measured on the real views when there are at least this many.
MIN_REAL_FOR_POINT = 20
#: L2 penalty of the model's (standardized) weights: a small calibration set must not give a step.
L2 = 1.0


@dataclass
class Evidence:
    """The top answer's evidence for one calibration or evaluation query."""

    cosine: float
    inliers: int | None
    known: bool  # the object is in the collection (the correct answer could be found)
    correct: bool  # the top answer is the right object (only meaningful when known)
    rival: int = 0  # most inliers of a reference of another object (see :data:`DISTINCT`)
    margin: float = float("nan")  # cosine minus the best cosine of another object (nan: unknown)
    confidence: float | None = None  # the verdict's confidence in the answer (None: not judged)
    kind: str = ""  # calibration: "real" or "synthetic" view ("" for a labelled query)
    instance: str = ""  # calibration: the object the view shows
    path: str = ""  # calibration: the reference photo the view was made of
    #: the points that could have matched (verified answers): the fewer of the photo's keypoints and
    #: those of the answer's best verified reference photo (0: not known)
    expected: int = 0
    #: the whitened cosine and margin (:data:`WHITENED`; nan: the index has no whitening)
    wcosine: float = float("nan")
    wmargin: float = float("nan")

    def accepted(self, verdict: "Verdict") -> bool:
        return verdict.judge(self).known

    @property
    def distinct_inliers(self) -> int:
        """The inliers that count for the verdict: 0 when another object matches about as well."""
        n = self.inliers or 0
        return n if n >= DISTINCT * self.rival else 0

    @property
    def unmatched(self) -> float:
        """The points that could have matched but did not, as a feature: log(1 + :attr:`expected`)
        when the distinct inliers are fewer than :data:`MIN_CALIBRATED` (an unverified answer), else
        0 (verified: what did not match says nothing more)."""
        return math.log1p(max(0, self.expected)) if self.distinct_inliers < MIN_CALIBRATED else 0.0

    def features(self, names: Sequence[str]) -> np.ndarray:
        """The model's inputs: cosine, margin, log(1 + distinct inliers), log(1 + rival inliers)
        (``rival``, models fitted before ``rival_excess``), log(1 + rival inliers beyond
        :data:`RIVAL_CHANCE`) (``rival_excess``), :attr:`unmatched`, the whitened cosine and margin."""
        def finite(x: float) -> float:
            return x if math.isfinite(x) else 0.0

        values = {"cosine": finite(self.cosine), "margin": finite(self.margin), "wcosine": finite(self.wcosine),
                  "wmargin": finite(self.wmargin), "inliers": math.log1p(self.distinct_inliers),
                  "rival": math.log1p(max(0, self.rival)),
                  "rival_excess": math.log1p(max(0, self.rival - RIVAL_CHANCE)), "unmatched": self.unmatched}
        return np.array([values[n] for n in names], float)

    def to_dict(self) -> dict[str, Any]:
        return {"cosine": _round(self.cosine), "margin": _round(self.margin), "inliers": self.inliers,
                "rival": self.rival, "known": self.known, "correct": self.correct, "kind": self.kind,
                "instance": self.instance, "path": self.path, "expected": self.expected,
                **({"wcosine": _round(self.wcosine), "wmargin": _round(self.wmargin)}
                   if math.isfinite(self.wcosine) else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evidence":
        inl = d.get("inliers")
        return cls(_float(d.get("cosine")), None if inl is None else int(inl), bool(d.get("known")),
                   bool(d.get("correct")), int(d.get("rival") or 0), _float(d.get("margin")),
                   None, str(d.get("kind", "")), str(d.get("instance", "")), str(d.get("path", "")),
                   int(d.get("expected") or 0), _float(d.get("wcosine")), _float(d.get("wmargin")))


def _round(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _float(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True)
class Model:
    """A logistic regression on standardized evidence features with a decision threshold."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float  # "in the collection" when the probability reaches it

    def terms(self, x: np.ndarray) -> np.ndarray:
        """Each feature's contribution to the log-odds (standardized feature times weight)."""
        return np.asarray(self.weights) * (np.asarray(x) - np.asarray(self.mean)) / np.asarray(self.scale)

    def probability(self, x: np.ndarray) -> float:
        return _sigmoid(float(self.terms(x).sum() + self.bias))

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Model | None":
        if not d:
            return None
        return cls(tuple(d["features"]), tuple(map(float, d["mean"])), tuple(map(float, d["scale"])),
                   tuple(map(float, d["weights"])), float(d["bias"]), float(d["threshold"]))


@dataclass(frozen=True)
class Judgement:
    """The verdict on one answer."""

    known: bool  # "in the collection"
    confidence: float  # the probability that the top answer is right (0..1)
    reason: str  # the evidence that decided, in words


def fit_model(evidence: Sequence[Evidence], names: Sequence[str], threshold_rule) -> Model | None:
    """The model of ``names`` fitted on ``evidence`` (positives: known and correctly answered; the
    rest negatives), each class weighted alike; ``threshold_rule(probabilities, labels, evidence)``
    sets its threshold (:func:`unknown_threshold`, :func:`known_threshold`). None when one of the
    classes is missing."""
    y = np.array([e.known and e.correct for e in evidence], float)
    if y.sum() == 0 or y.sum() == len(y):
        return None
    X = np.array([e.features(names) for e in evidence], float)
    mean, scale = X.mean(axis=0), X.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    Z = (X - mean) / scale
    w_class = np.where(y == 1, 0.5 / y.sum(), 0.5 / (len(y) - y.sum()))
    signs = np.array([FEATURES[n] for n in names], float)
    theta = _fit_logistic(Z, y, w_class, signs, L2 / len(y))
    model = Model(tuple(names), tuple(map(float, mean)), tuple(map(float, scale)),
                  tuple(float(round(t, 8)) for t in theta[:-1]), float(theta[-1]), 0.5)
    probs = np.array([model.probability(x) for x in X])
    return replace(model, threshold=float(threshold_rule(probs, y, evidence)))


def _fit_logistic(Z: np.ndarray, y: np.ndarray, w: np.ndarray, signs: np.ndarray, reg: float) -> np.ndarray:
    """The weights and bias (last) of the logistic regression that minimise the ``w``-weighted log-loss
    of labels ``y`` (0/1) on the rows of ``Z`` plus ``reg / 2`` times the squared weights (not the bias),
    each weight of the sign in ``signs`` (``+1``: at least 0, ``-1``: at most 0).

    The problem is strictly convex (the L2 term; the bias because both classes are present), so its one
    minimum lies in the relative interior of one face of the sign constraints: some weights 0, the
    others of their sign. With a handful of features (at most 4: ``2**4`` faces) every face is solved
    exactly, by Newton's method on its free variables, and the minimum is the feasible face minimum of
    the least loss; it also satisfies the optimality conditions (checked by the tests against SciPy's
    L-BFGS-B, which this replaces: the frozen build then needs none of ``scipy.optimize``)."""
    n, k = Z.shape
    A = np.hstack([Z, np.ones((n, 1))])  # the bias is the last variable
    s = np.where(y == 1, 1.0, -1.0)
    penal = np.r_[np.full(k, reg), 0.0]

    def loss(theta: np.ndarray) -> float:
        return float(w @ np.logaddexp(0.0, -s * (A @ theta))) + 0.5 * float(penal @ (theta * theta))

    def solve(free: np.ndarray) -> np.ndarray:
        theta = np.zeros(k + 1)
        Af, pf = A[:, free], penal[free]
        value = loss(theta)
        for _ in range(100):
            z = A @ theta
            p = 0.5 * (1.0 + np.tanh(0.5 * z))  # the sigmoid, without overflow
            grad = Af.T @ (w * (p - y)) + pf * theta[free]
            hess = (Af * (w * p * (1.0 - p))[:, None]).T @ Af + np.diag(pf)
            try:
                step = -np.linalg.solve(hess, grad)
            except np.linalg.LinAlgError:
                step = -np.linalg.lstsq(hess, grad, rcond=None)[0]
            decrement = -float(grad @ step)
            if decrement < 1e-24:  # Newton's decrement: the loss is within 1e-24 of the minimum
                break
            t = 1.0
            while t >= 1e-10:  # backtracking (Armijo): Newton's full step is taken near the minimum
                trial = theta.copy()
                trial[free] += t * step
                new = loss(trial)
                if new <= value - 1e-4 * t * decrement:
                    break
                t *= 0.5
            else:  # no step lowers the loss: it is at its minimum to rounding
                break
            theta, value = trial, new
        return theta

    best, best_value = np.zeros(k + 1), math.inf
    for mask in range(2 ** k):  # bit j set: weight j is free, else fixed at 0
        free = np.array([bool(mask >> j & 1) for j in range(k)] + [True])
        theta = solve(free)
        if np.all(signs * theta[:k] >= 0):
            value = loss(theta)
            if value < best_value:
                best, best_value = theta, value
    return best


def unknown_threshold(max_false_accept: float = TARGET_FALSE_ACCEPT):
    """The threshold rule of calibration: above all but ``max_false_accept`` of the unknown views'
    probabilities (never under 0.5: an accepted answer is more likely right than not). The views as
    a visitor's phone takes them (kind ``"visitor"``) shape the model, not this threshold: an unknown
    object is hardest to refuse on a clean photo, so the clean views' false accepts are what is bounded."""
    def rule(probs: np.ndarray, y: np.ndarray, evidence: Sequence[Evidence]) -> float:
        clean = [e.kind != "visitor" for e in evidence]
        if not any(c and not e.known for c, e in zip(clean, evidence)):
            clean = [True] * len(evidence)
        neg = np.sort(np.array([p for p, e, c in zip(probs, evidence, clean) if c and not e.known], float))[::-1]
        if not len(neg):
            return 0.5
        allowed = int(math.floor(max_false_accept * len(neg)))  # unknown views that may pass
        t = float(np.nextafter(neg[allowed], 1.0)) if allowed < len(neg) else 0.5
        return min(max(0.5, t), 1.0)
    return rule


def known_threshold(max_known_rejected: float):
    """The threshold rule of a labelled query set: the highest that wrongly rejects at most
    ``max_known_rejected`` of the known queries (so the most unknown ones are rejected)."""
    def rule(probs: np.ndarray, y: np.ndarray, evidence: Sequence[Evidence]) -> float:
        known = np.sort(np.array([p for p, e in zip(probs, evidence) if e.known], float))
        if not len(known):
            return 0.5
        allowed = int(math.floor(max_known_rejected * len(known)))  # known queries that may fail
        return float(known[min(allowed, len(known) - 1)])
    return rule


_WORDS = {
    "cosine": ("similar overall (cosine {cosine:.2f})", "not similar enough overall (cosine {cosine:.2f})"),
    "margin": ("clearly closer to this object than to any other (cosine margin {margin:.2f})",
               "about as close to other objects (cosine margin {margin:.2f})"),
    "inliers": ("verified: {points}", "{few_points}"),
    "unmatched": ("verified: {points}",
                  "few of its points match: {points} where {expected} could (as with a look-alike)"),
    "rival": ("no other object matches the same part of the photo",
              "not distinct: another object has {rival} matching points (what they share, such as a "
              "frame, matches; not the object itself)"),
}
_WORDS["rival_excess"] = _WORDS["rival"]
# the whitened similarity in words: what light, blur and angle change is set aside (its number decided)
_WORDS["wcosine"] = ("similar overall, light and angle set aside ({wcosine:.2f}; cosine {cosine:.2f})",
                     "not similar enough overall, light and angle set aside ({wcosine:.2f}; cosine {cosine:.2f})")
_WORDS["wmargin"] = ("clearly closer to this object than to any other, light and angle set aside (margin {wmargin:.2f})",
                     "about as close to other objects, light and angle set aside (margin {wmargin:.2f})")


def _points(n: int) -> str:
    """``n`` matching points in words ("no matching points", "1 matching point", "12 matching points")."""
    return "no matching points" if n <= 0 else "1 matching point" if n == 1 else f"{n} matching points"


def _few_points(n: int) -> str:
    """Too few matching points, in words: "no matching points found", "only 3 matching points"."""
    return "no matching points found" if n <= 0 else f"only {_points(n)}"


@dataclass
class Verdict:
    """The "in this collection" decision on the top result's evidence: a calibrated :class:`Model`
    (one for verified answers, one for the cosine alone), or the rule of thresholds."""

    min_inliers: int = 15  # verified answers (rule): at least this many inliers; also the ranking's gate
    min_cosine_verified: float = 0.0  # ...and at least this cosine (rule)
    min_cosine: float = 0.8  # unverified answers (rule): this cosine
    source: str = "default (not calibrated)"
    model_verified: Model | None = None
    model_cosine: Model | None = None
    #: measured by the calibration on its own views: known_accepted, unknown_rejected (shares),
    #: known, unknown (counts), target (the unknown share that may be accepted)
    operating_point: dict[str, Any] | None = None
    #: the calibration's evidence (``Evidence.to_dict()``), refitted by an update (:func:`refit`)
    evidence: list[dict[str, Any]] = field(default_factory=list, repr=False)

    # ---- the decision ------------------------------------------------------------------------
    def model(self, verified: bool) -> Model | None:
        return self.model_verified if verified else self.model_cosine

    def judge(self, e: Evidence) -> Judgement:
        """The verdict, its confidence and the reason for the top result's evidence ``e``
        (``e.inliers`` None: the answer is not verified)."""
        verified = e.inliers is not None
        model = self.model(verified)
        if model is None:
            known, reason = self._rule(e)
            conf = self._rule_confidence(e)
        else:
            x = e.features(model.features)
            conf = model.probability(x)
            known = conf >= model.threshold
            reason = self._reason(e, model, x, known)
        if not known and math.isfinite(e.cosine) and e.cosine >= EXACT_COPY:
            return Judgement(True, max(conf, e.cosine), f"a copy of a reference photo (cosine {e.cosine:.3f})")
        return Judgement(bool(known), float(conf), reason)

    def _rule(self, e: Evidence) -> tuple[bool, str]:
        cosine, inliers, rival = e.cosine, e.inliers, e.rival
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

    def _rule_confidence(self, e: Evidence) -> float:
        """The rule's confidence: 0.5 at its threshold, towards 1 (0) as the evidence passes
        (misses) it; a verified answer that is not distinct is below 0.5."""
        if not math.isfinite(e.cosine):
            return 0.0
        if e.inliers is not None:
            return _sigmoid(0.25 * (e.distinct_inliers - self.min_inliers + 0.5))
        return _sigmoid(40.0 * (e.cosine - self.min_cosine + 1e-4))

    @staticmethod
    def _reason(e: Evidence, model: Model, x: np.ndarray, known: bool) -> str:
        """The evidence that decided: the feature pulling hardest the way the verdict went (an
        accepted answer whose matching points count for it says so first)."""
        terms = dict(zip(model.features, model.terms(x)))
        name = max(terms, key=terms.__getitem__) if known else min(terms, key=terms.__getitem__)
        phrases = []
        verified = e.distinct_inliers >= NOISE_INLIERS  # fewer are noise: never called "verified"
        if known and terms.get("inliers", 0.0) > 0 and name not in ("inliers", "unmatched") and verified:
            phrases.append(_WORDS["inliers"][0])
        if name in ("inliers", "unmatched") and not known and e.inliers and not e.distinct_inliers:
            # they did not count: another object has about as many (not a look-alike's few points)
            phrases.append("not distinct: {inliers} matching points, but another object has {rival} (what they "
                           "share, such as a frame, matches; not the object itself)")
        elif name in RIVAL_FEATURES and not known and e.distinct_inliers:  # they count, the rival weighs against
            phrases.append("{inliers} matching points, but another object also has {rival} on the same part of "
                           "the photo (what works share, such as a frame)")
        elif name == "inliers" and known and not verified:  # too few to verify alone: the similarity with them
            phrases.append("similar overall (cosine {cosine:.2f}), with {points}")
        elif name == "unmatched" and known and e.distinct_inliers < MIN_CALIBRATED:  # few points, few to match
            phrases.append("a plain object: few points to match on ({expected}), {points}")
        elif name == "unmatched" and not known and e.expected < UNMATCHED_SHARE * max(1, e.distinct_inliers):
            phrases.append(_WORDS["inliers"][1])  # most of its few points match: too few, not "a look-alike"
        else:
            phrases.append(_WORDS[name][0 if known else 1])
        if e.inliers is None:
            phrases.append("not verified")
        elif name not in ("inliers", *RIVAL_FEATURES, "unmatched") and len(phrases) == 1:  # the matching points, said once
            phrases.append("{points}")
        return "; ".join(phrases).format(cosine=e.cosine, margin=e.margin, wcosine=e.wcosine, wmargin=e.wmargin,
                                         inliers=e.inliers or 0, rival=e.rival,
                                         points=_points(e.inliers or 0), few_points=_few_points(e.inliers or 0),
                                         expected=e.expected)

    # ---- descriptions ------------------------------------------------------------------------
    def threshold(self, verified: bool = True) -> float:
        """The threshold that decides: the confidence with a model, else inliers (verified) or the cosine."""
        model = self.model(verified)
        if model is not None:
            return model.threshold
        return float(self.min_inliers if verified else self.min_cosine)

    def rule(self, verified: bool = True) -> str:
        """The decision in words, e.g. "confidence at least 0.62" or "at least 12 matching points"."""
        model = self.model(verified)
        if model is not None:
            return f"confidence at least {model.threshold:.2f} (from {', '.join(model.features)})"
        return f"at least {self.min_inliers} matching points" if verified else f"cosine at least {self.min_cosine:g}"

    def with_rule(self, *, min_inliers: int | None = None, min_cosine: float | None = None,
                  source: str) -> "Verdict":
        """This verdict with thresholds given by a user (the rule replaces the model it overrides)."""
        v = replace(self, source=source)
        if min_inliers is not None:
            v = replace(v, min_inliers=int(min_inliers), model_verified=None)
        if min_cosine is not None:
            v = replace(v, min_cosine=float(min_cosine), model_cosine=None)
        return v

    def summary(self) -> str:
        """One line: the rule, and the operating point its calibration measured."""
        text = f"in the collection with {self.rule(True)} (unverified: {self.rule(False)}); calibration: {self.source}"
        op = self.operating_point
        if op:
            views = "real views (other photos of its objects)" if op.get("views") == "real" else "views"
            text += (f"; on its own {views} it accepts {op['known_accepted']:.0%} of {op['known']} known "
                     f"and rejects {op['unknown_rejected']:.0%} of {op['unknown']} unknown ones")
            visitor = self.visitor_point()
            if visitor:
                text += (f"; on those views as visitors' phones take them, {visitor['known_accepted']:.0%} of "
                         f"{visitor['known']} and {visitor['unknown_rejected']:.0%} of {visitor['unknown']}")
        return text

    def visitor_point(self) -> dict[str, Any] | None:
        """The operating point on the calibration's views as visitors' phones take them (dim, blurred,
        at an angle, from afar), or None (an index calibrated before they existed)."""
        return ((self.operating_point or {}).get("by_kind") or {}).get("visitor")

    def plain_summary(self) -> str:
        """What the verdict does, in a curator's words, from the operating point its calibration
        measured on the collection's own views (the numbers :meth:`summary` gives), e.g. "Photos of
        known objects are recognised about 92 % of the time; unknown objects are refused about 98 %
        of the time"."""
        op = self.operating_point or {}
        known, unknown = op.get("known_accepted"), op.get("unknown_rejected")
        if known is None or unknown is None:
            return ("Whether a photo shows an object of this collection is decided by fixed thresholds, "
                    "not measured on it yet (calibrate them in the Evaluation tab)")
        text = (f"Photos of known objects are recognised about {known:.0%} of the time; unknown objects "
                f"are refused about {unknown:.0%} of the time (measured on the collection's own photos)")
        visitor = self.visitor_point()
        if visitor:
            text += (f". Photos as visitors take them, dim, blurred, at an angle or from afar: about "
                     f"{visitor['known_accepted']:.0%} recognised")
        return text

    def warning(self) -> str | None:
        """A sentence when the calibration's operating point is weak, else None."""
        op = self.operating_point
        if not op or op.get("known_accepted") is None or op["known_accepted"] >= WEAK_KNOWN_ACCEPTED:
            return None
        return (f"the verdict is weak on this collection: on its calibration views it recognises only "
                f"{op['known_accepted']:.0%} of the known objects (to reject {op['unknown_rejected']:.0%} of "
                "unknown ones); visitors will often hear 'not in this collection' for objects that are. "
                "Add reference photos (other sides, other light), or build the index again with the matcher "
                "set to Automatic (Settings → Matcher, or museum-search index --matcher auto: SIFT and XFeat "
                "are both calibrated and the better is kept).")

    # ---- storage -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"min_inliers": self.min_inliers, "min_cosine_verified": self.min_cosine_verified,
                "min_cosine": self.min_cosine, "source": self.source,
                "model_verified": self.model_verified.to_dict() if self.model_verified else None,
                "model_cosine": self.model_cosine.to_dict() if self.model_cosine else None,
                "operating_point": self.operating_point, "evidence": list(self.evidence)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Verdict":
        if not d:
            return cls()
        try:
            return cls(int(d.get("min_inliers", 15)), float(d.get("min_cosine_verified", 0.0)),
                       float(d.get("min_cosine", 0.8)), str(d.get("source", "stored")),
                       Model.from_dict(d.get("model_verified")), Model.from_dict(d.get("model_cosine")),
                       d.get("operating_point"), list(d.get("evidence") or []))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MuseumSearchError(f"the verdict stored in this index is damaged ({type(exc).__name__}: {exc}); "
                                    "build the index again (museum-search index COLLECTION -o INDEX)") from exc

    @classmethod
    def of_index(cls, index: Any) -> "Verdict":
        """The verdict stored with ``index`` (a :class:`museum_search.core.index._store.Index`, whose ``verdict`` is its dict)."""
        return cls.from_dict(getattr(index, "verdict", None))


# ---- calibration -------------------------------------------------------------------------------


def choose(known: Sequence[Evidence], unknown: Sequence[Evidence], source: str,
           max_false_accept: float = TARGET_FALSE_ACCEPT) -> Verdict:
    """The rule's thresholds: inliers that reject the unknown views (all but ``max_false_accept`` of
    them, with a 50 % margin, and never fewer than :data:`MIN_CALIBRATED`), and the cosine with the
    best balanced accuracy. The inlier threshold is also the ranking's gate (an object verified
    with this many inliers is lifted above the others).

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


def fit_verdict(evidence: Sequence[Evidence], source: str,
                max_false_accept: float = TARGET_FALSE_ACCEPT) -> Verdict:
    """The calibrated verdict of ``evidence`` (known and unknown views): the rule's thresholds
    (:func:`choose`), a model for verified answers and one for the cosine alone, each with the
    threshold that accepts at most ``max_false_accept`` of the unknown views, and the operating
    point they reach on these views. The evidence is kept with it (for :func:`museum_search.core.jobs._calibration.refit`)."""
    # the rule (and the ranking's gate) from synthetic views where there are some: views of the
    # photo itself, as before real views (a gate from other sides of an object would be too high)
    synthetic = [e for e in evidence if e.kind == "synthetic"] or list(evidence)
    v = choose([e for e in synthetic if e.known], [e for e in synthetic if not e.known], source, max_false_accept)
    rule = unknown_threshold(max_false_accept)
    verified = [e for e in evidence if e.inliers is not None]
    v.model_verified = fit_model(verified, verified_features(verified), rule) if verified else None
    v.model_cosine = fit_model([_unverified(e) for e in evidence], cosine_features(evidence), rule)
    v.evidence = [e.to_dict() for e in evidence]
    v.operating_point = calibration_point(evidence, v, max_false_accept)
    return v


def calibration_point(evidence: Sequence[Evidence], verdict: Verdict,
                      max_false_accept: float = TARGET_FALSE_ACCEPT) -> dict[str, Any] | None:
    """What ``verdict`` does on its calibration views: the share of known views answered rightly
    and accepted, the share of unknown views rejected. Measured on the **real views** when there are
    at least :data:`MIN_REAL_FOR_POINT` (they are what visitors show; a synthetic frame and wall around
    a photo of a small 3D object is harder than any visitor's photo), else on the clean views (not
    those made as a visitor's phone takes them); ``by_kind`` has each kind: ``real``, ``synthetic``
    and ``visitor``."""
    def point(ev: Sequence[Evidence]) -> dict[str, Any] | None:
        known = [e for e in ev if e.known]
        unknown = [e for e in ev if not e.known]
        if not known or not unknown:
            return None
        return {"known_accepted": round(float(np.mean([e.correct and e.accepted(verdict) for e in known])), 4),
                "unknown_rejected": round(float(np.mean([not e.accepted(verdict) for e in unknown])), 4),
                "known": len(known), "unknown": len(unknown)}

    real = [e for e in evidence if e.kind == "real"]
    use_real = sum(1 for e in real if e.known) >= MIN_REAL_FOR_POINT
    out = point(real if use_real else [e for e in evidence if e.kind != "visitor"] or evidence)
    if out is None:
        return None
    by_kind = {kind: point([e for e in evidence if e.kind == kind]) for kind in ("real", "synthetic", "visitor")}
    return {**out, "views": "real" if use_real else "all", "target": max_false_accept,
            "by_kind": {k: v for k, v in by_kind.items() if v is not None}}


def verified_features(evidence: Sequence[Evidence]) -> tuple[str, ...]:
    """The verified model's features for ``evidence``: :data:`VERIFIED_FEATURES`, without
    ``unmatched`` when no evidence knows the points that could have matched (stored by an older
    version: the feature would be 0 for all of them, and a model fitted on it would read it wrongly);
    with the whitened similarity in place of the plain one where all the evidence has it (:data:`WHITENED`)."""
    names = VERIFIED_FEATURES if any(e.expected > 0 for e in evidence) else VERIFIED_FEATURES_BEFORE
    return _whitened(names, evidence)


def cosine_features(evidence: Sequence[Evidence]) -> tuple[str, ...]:
    """The unverified model's features for ``evidence``: :data:`COSINE_FEATURES`, whitened where all
    the evidence is (:func:`verified_features`)."""
    return _whitened(COSINE_FEATURES, evidence)


def _whitened(names: Sequence[str], evidence: Sequence[Evidence]) -> tuple[str, ...]:
    if evidence and all(math.isfinite(e.wcosine) for e in evidence):
        return tuple(WHITENED.get(n, n) for n in names)
    return tuple(names)


def _unverified(e: Evidence) -> Evidence:
    return replace(e, inliers=None, rival=0, expected=0)


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


def labelled_model(evidence: Sequence[Evidence], verified: bool = True) -> Model | None:
    """The verdict's model refitted on labelled queries (None when they hold one class only)."""
    ev = list(evidence) if verified else [_unverified(e) for e in evidence]
    if verified:
        ev = [e for e in ev if e.inliers is not None]
    return fit_model(ev, verified_features(ev) if verified else cosine_features(ev), known_threshold(0.0)) if ev else None


def operating_points(evidence: Sequence[Evidence], verified: bool = True, verdict: Verdict | None = None
                     ) -> dict[str, np.ndarray]:
    """The verdict's figures against its threshold (arrays of equal length): the curve a user picks
    an operating point on. With a calibrated ``verdict`` the threshold is the confidence of the
    model refitted on these queries (:func:`labelled_model`); otherwise inliers when ``verified``,
    else the cosine."""
    model = labelled_model(evidence, verified) if verdict is not None and verdict.model(verified) else None
    if model is not None:
        thresholds = np.unique(np.round(np.concatenate([np.linspace(0, 1, 101), [
            model.probability(e.features(model.features)) for e in evidence]]), 4))
    elif verified:
        top = max([e.inliers or 0 for e in evidence] + [NOISE_INLIERS]) + 2
        thresholds = np.arange(0, top + 1, dtype=float)
    else:
        thresholds = np.unique(np.round([e.cosine for e in evidence] + [0.0, 1.0], 4))
    out: dict[str, list] = {"threshold": list(thresholds), "unknown_rejected": [], "known_rejected": [], "accuracy": []}
    ev = evidence if verified else [_unverified(e) for e in evidence]
    for t in thresholds:
        if model is not None:
            v = Verdict(model_verified=replace(model, threshold=float(t)) if verified else None,
                        model_cosine=None if verified else replace(model, threshold=float(t)))
        elif verified:
            v = Verdict(min_inliers=int(t), min_cosine=float(t))
        else:
            v = Verdict(min_cosine=float(t))
        f = open_set_figures(ev, v)
        for key in ("unknown_rejected", "known_rejected", "accuracy"):
            out[key].append(np.nan if f[key] is None else f[key])
    return {k: np.asarray(v, float) for k, v in out.items()}


def recalibrated(evidence: Sequence[Evidence], current: Verdict, max_known_rejected: float = 0.03,
                 verified: bool = True) -> Verdict:
    """The verdict refitted on labelled queries: with a calibrated ``current``, the same model fitted
    on them with the threshold that wrongly rejects at most ``max_known_rejected`` of the known
    ones; with a rule, the threshold of the rule (an operating point on :func:`operating_points`)."""
    src = f"labelled queries ({len(evidence)}), at most {max_known_rejected:.0%} of known objects rejected"
    if current.model(verified) is not None:
        ev = list(evidence) if verified else [_unverified(e) for e in evidence]
        model = fit_model([e for e in ev if e.inliers is not None] if verified else ev,
                          verified_features(ev) if verified else cosine_features(ev), known_threshold(max_known_rejected))
        if model is not None:
            new = (replace(current, source=src, model_verified=model) if verified
                   else replace(current, source=src, model_cosine=model))
            return replace(new, operating_point=calibration_point(ev, new))
    pts = operating_points(evidence, verified)
    ok = np.flatnonzero(np.nan_to_num(pts["known_rejected"], nan=0.0) <= max_known_rejected)
    if len(ok) == 0:
        return current
    best = ok[np.argmax(np.nan_to_num(pts["unknown_rejected"][ok], nan=0.0) + 1e-9 * pts["threshold"][ok])]
    t = float(pts["threshold"][best])
    if verified:
        return replace(current, min_inliers=max(NOISE_INLIERS, int(t)), source=src, model_verified=None)
    return replace(current, min_cosine=t, source=src, model_cosine=None)
