"""Calibration of an index's verdict (:mod:`museum_search.core.answer._verdict`): views of its own references asked through the
query pipeline, each as a known object and as an unknown one, the evidence fitted into the verdict's
model. Two kinds of views: **real** ones (a photo of an object that has other photos, asked with
itself left out) and **synthetic** ones (a reference photo cropped, in perspective, in other light,
framed and hung on a wall: :func:`synthetic_view`). An update refits from the stored evidence
(:func:`refit`), asking only the new photos' views.

**Staff-confirmed visitor photos** (issue 34), once there are :data:`STAFF_VIEWS_MIN` of them: the
photos staff said show object X, kept as references of X outside the collection (:func:`staff_rows`),
are real views of X (each asked with itself left out, as another photo of X; not degraded again: they
are already as a visitor's phone took them), and the photos staff said are not in the collection are
real unknown views (asked with nothing left out). The verdict records how many it used
(:func:`staff_counts`).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Generator, Iterator, Sequence

import cv2
import numpy as np

from museum_search.core.answer import (
    FOLDS,
    NOISE_INLIERS,
    REAL_VIEWS,
    Evidence,
    QueryImage,
    QueryPipeline,
    QuerySettings,
    Verdict,
    fit_verdict,
    fit_whitening,
    fold_whitenings,
)
from museum_search.core.conditions import degrade
from museum_search.core.images import load_image
from museum_search.core.index import Index
from museum_search.core.progress import Progress
from museum_search.core.verification import leaving_out

#: The kind of a calibration view made of another view as a visitor's phone takes it.
VISITOR = "visitor"
#: The visitors' conditions a calibration view is degraded by, one drawn per view (the protocol's
#: conditions, :mod:`museum_search.core.conditions`, on the collection's own references, never
#: on the protocol's query photos).
VISITOR_CONDITIONS = ("dim-0.6", "dim-0.3", "defocus-2", "defocus-4", "motion-4", "perspective-15",
                      "perspective-30", "tilt-25", "glare", "noise", "far", "webcam", "jpeg-70", "phone",
                      "phone-hard")

#: The verdict's whitening (:mod:`museum_search.core.answer._whitening`) is learned from at most this
#: many references, each described once more as a visitor's phone takes it (on this project's 2-core
#: machine, 0.07 s each for COIL-100's 128 px photos, 0.1-0.4 s for photos of paintings, which the
#: condition is applied to at 640 px).
WHITENING_REFS = 1000
#: The stage of a build that learns the whitening (``Progress.stage``).
WHITENING_STAGE = "learning the whitening"

#: Staff-confirmed visitor photos (known and unknown together) are calibration views from this many on.
#: Below it they are a handful: one odd photo (a label, a hand over the lens, a half-visible work)
#: would be a large share of the hard views and could move the threshold alone; from five on they are
#: a small sample of what visitors show, next to the collection's own 100-400 views (REAL_VIEWS real
#: views, up to 50 synthetic ones, each also as a phone takes it), and each costs one query (about a
#: second on this project's 2-core machine), so a refit stays in seconds. Below it, a staff photo of X
#: is a reference of X only (what makes the next such photo recognised).
STAFF_VIEWS_MIN = 5


def staff_rows(index: Index) -> list[int]:
    """The rows of ``index`` that are staff-confirmed visitor photos: references kept outside the
    collection folder, stored with an absolute path (:func:`museum_search.core.jobs.update_index`'s ``added``)."""
    return [i for i, it in enumerate(index.items) if os.path.isabs(it.path)]


def _is_staff_unknown(e: Evidence) -> bool:
    """A staff-confirmed "not in our collection" photo's evidence: unknown, of no object, a file outside the collection."""
    return not e.known and not e.instance and os.path.isabs(e.path)


def staff_counts(evidence: Sequence[Evidence], staff_paths: set[str]) -> dict[str, int]:
    """How many staff-confirmed visitor photos ``evidence`` used: ``known`` (views of photos of known
    objects, ``staff_paths``) and ``unknown`` (photos not in the collection)."""
    return {"known": sum(1 for e in evidence if e.known and e.path in staff_paths),
            "unknown": sum(1 for e in evidence if _is_staff_unknown(e))}


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
    top, bottom, left, right = wall
    img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=wcol)
    # perspective: move each corner by up to 8 % of the size
    hh, ww = img.shape[:2]
    src = np.array([[0, 0], [ww, 0], [ww, hh], [0, hh]], dtype=np.float32)
    jitter = rng.uniform(-0.08, 0.08, (4, 2)) * np.array([ww, hh], dtype=np.float32)
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


def calibrate(index: Index, extractor=None, views: int | None = None, seed: int = 0,
              unknown_views: Sequence[str] = (), whitening: bool | None = None) -> Generator[Progress, None, Verdict]:
    """Calibrate the verdict of ``index`` on real and synthetic views of its references (see the
    module doc). ``views``: how many views (default: :func:`calibration_plan`). ``unknown_views``:
    staff-confirmed visitor photos of objects not in the collection (absolute paths).
    ``whitening``: learn the verdict's whitening first (:func:`learn_whitening`; None: when the
    index has one), and judge each unknown view with the whitening learned without its object.
    Needs at least two objects in the collection (otherwise the default verdict is returned)."""
    labels = index.labels
    if len(set(labels.tolist())) < 2:
        index.whitening = None
        return Verdict(source="default (a collection of one object cannot be calibrated)")
    folds, note = None, ""
    if whitening or (whitening is None and index.whitening is not None):
        folds = yield from learn_whitening(index, extractor, seed)
        note = (f"; judged with a whitening learned from {min(len(index), WHITENING_REFS)} photos" if folds
                else f"; no whitening: {len(index)} photos are too few to learn one from")
    else:
        index.whitening = None
    evidence = yield from calibration_evidence(index, extractor, views, seed, folds=folds)
    evidence = yield from with_staff_views(index, extractor, evidence, unknown_views)
    return fit_verdict(evidence, _source(evidence) + note)


def _source(evidence: Sequence[Evidence]) -> str:
    real = sum(1 for e in evidence if e.known and e.kind == "real")
    synthetic = sum(1 for e in evidence if e.known and e.kind == "synthetic")
    visitor = sum(1 for e in evidence if e.known and e.kind == VISITOR)
    parts = [f"{real} real views" if real else "", f"{synthetic} synthetic views" if synthetic else ""]
    text = " and ".join(p for p in parts if p)
    if visitor:
        text += f", each also as a visitor's phone takes it ({visitor})"
    staff = sum(1 for e in evidence if _is_staff_unknown(e))
    if staff:
        text += f", and {staff} photos staff confirmed are not in the collection"
    return text + " (each as a known and as an unknown object)"


def calibration_plan(labels: np.ndarray, views: int | None = None, seed: int = 0,
                     rows: Sequence[int] | None = None, rng: np.random.Generator | None = None
                     ) -> list[tuple[int, str]]:
    """The (row, kind) views calibration asks about, in order:

    * ``views`` "synthetic" views of references drawn at random (default: one per reference, at
      least 20, at most 50; the same draw as before real views existed, so a one-photo collection
      is calibrated on the same views);
    * up to :data:`REAL_VIEWS` "real" views: photos of objects that have other photos, spread over
      the objects (one per object before a second).

    ``rows``: only views of these references (an update's new photos): a real view where the
    object has another photo, else a synthetic one. ``rng``: the stream the synthetic rows are drawn
    from (default: a new one of ``seed``), which then goes on to make the synthetic views."""
    labels = np.asarray(labels)
    n = len(labels)
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    multi = counts[inverse] >= 2
    if rows is not None:
        return [(int(r), "real" if multi[r] else "synthetic") for r in sorted(set(rows))]
    views = views if views is not None else max(20, min(50, n))
    rng = np.random.default_rng(seed) if rng is None else rng
    plan = [(int(r), "synthetic") for r in rng.choice(n, size=views, replace=views > n)]
    order = np.random.default_rng(seed + 1).permutation(np.flatnonzero(multi))
    rank = np.empty(len(order), int)  # the k-th photo of its object in this order
    seen: dict[int, int] = {}
    for i, r in enumerate(order):
        obj = int(inverse[r])
        rank[i] = seen[obj] = seen.get(obj, -1) + 1
    order = order[np.argsort(rank, kind="stable")]
    return plan + [(int(r), "real") for r in order[:REAL_VIEWS]]


def calibration_evidence(index: Index, extractor=None, views: int | None = None, seed: int = 0,
                         rows: Sequence[int] | None = None, visitors: bool = True,
                         folds: "Folds | None" = None) -> Generator[Progress, None, list[Evidence]]:
    """Known and unknown evidence of the views of :func:`calibration_plan` (see the module doc);
    with ``visitors``, each view also as a visitor's phone takes it (:data:`VISITOR_CONDITIONS`);
    ``folds``: the whitenings each unknown view is judged with (:func:`learn_whitening`; None: the
    index's own, as for the views of an update's new photos, which it was not learned from)."""
    labels = index.labels
    rng = np.random.default_rng(seed)  # one stream: the plan's draw of rows, then the synthetic views
    visitor_rng = np.random.default_rng([seed, 36])  # another: the visitors' conditions
    staff = set(staff_rows(index))  # staff-confirmed visitor photos: their own views (with_staff_views)
    plan = [(r, k) for r, k in calibration_plan(labels, views, seed, rows, rng=rng) if r not in staff]
    pipe = _calibration_pipe(index, extractor)
    evidence: list[Evidence] = []
    t0 = time.perf_counter()
    for i, (row, kind) in enumerate(plan):
        path = index.items[row].path
        try:
            ref = load_image(index.abspath(row), max_side=pipe.verify_side)
        except Exception:
            yield Progress(i + 1, len(plan), stage="calibrating", elapsed=time.perf_counter() - t0)
            continue
        image = synthetic_view(ref, rng) if kind == "synthetic" else ref
        exclude = _exclusions(labels, row, kind)
        evidence += _asked(pipe, QueryImage(f"{kind} view of {path}", image), labels, row, kind, exclude, folds)
        if visitors:
            condition = VISITOR_CONDITIONS[int(visitor_rng.integers(len(VISITOR_CONDITIONS)))]
            photo = degrade(image, condition, int(visitor_rng.integers(2**31)))
            evidence += _asked(pipe, QueryImage(f"{condition} view of {path}", photo), labels, row, VISITOR, exclude,
                               folds)
        yield Progress(i + 1, len(plan), current=f"{kind} view of {path}", stage="calibrating",
                       elapsed=time.perf_counter() - t0)
    return evidence


def _calibration_pipe(index: Index, extractor) -> QueryPipeline:
    """The pipeline a calibration view is asked through: the top answer, with every rival counted."""
    return QueryPipeline(index, QuerySettings(k=1, verdict=Verdict(min_inliers=NOISE_INLIERS), rivals_anywhere=True),
                         extractor=extractor)


def with_staff_views(index: Index, extractor, evidence: Sequence[Evidence], unknown_views: Sequence[str]
                     ) -> Generator[Progress, None, list[Evidence]]:
    """``evidence`` with the staff-confirmed visitor photos' views (stage "calibrating"): the photos of
    known objects in ``index`` (:func:`staff_rows`), each a real view asked with itself left out, and
    ``unknown_views`` (photos of objects not in the collection), each asked with nothing left out. The
    views already in ``evidence`` are kept, the others asked; none when there are fewer than
    :data:`STAFF_VIEWS_MIN` photos in all (and any in ``evidence`` are dropped). A photo that cannot
    be read is left out."""
    rows = staff_rows(index)
    known_paths = {index.items[r].path for r in rows}
    unknown_paths = list(dict.fromkeys(str(p) for p in unknown_views))
    base = [e for e in evidence if e.path not in known_paths and not _is_staff_unknown(e)]
    if len(rows) + len(unknown_paths) < STAFF_VIEWS_MIN:
        return base
    have = [e for e in evidence if e.path in known_paths or (_is_staff_unknown(e) and e.path in unknown_paths)]
    asked = {(e.path, e.known or bool(e.instance)) for e in have}
    todo: list[tuple[int | None, str]] = [(r, index.items[r].path) for r in rows
                                           if (index.items[r].path, True) not in asked]
    todo += [(None, p) for p in unknown_paths if (p, False) not in asked]
    labels, pipe, new = index.labels, _calibration_pipe(index, extractor), []
    t0 = time.perf_counter()
    for i, (row, path) in enumerate(todo):
        try:
            image = load_image(path, max_side=pipe.verify_side)
        except Exception:  # a photo deleted or damaged since: not a view
            image = None
        if image is not None and row is not None:
            new += _asked(pipe, QueryImage(f"staff-confirmed view {path}", image), labels, row, "real",
                          _exclusions(labels, row, "real"))
        elif image is not None:
            view = QueryImage(f"staff-confirmed unknown view {path}", image)
            (answer,) = pipe.answer([view], pipe.embed([view]))
            new.append(replace(answer.evidence(False, False), kind="real", instance="", path=path))
        yield Progress(i + 1, len(todo), current=path, stage="calibrating", elapsed=time.perf_counter() - t0)
    return base + have + new


def _exclusions(labels: np.ndarray, row: int, kind: str) -> tuple[np.ndarray | None, np.ndarray]:
    """What a view of reference ``row`` is asked with left out: as a known object (itself, for a
    real view: another photo of its object must find it; nothing for a synthetic one), and as an
    unknown object (its whole object)."""
    itself = np.zeros(len(labels), bool)
    itself[row] = True
    return (itself if kind == "real" else None), labels == labels[row]


def _asked(pipe: QueryPipeline, view: QueryImage, labels: np.ndarray, row: int, kind: str,
           exclude: tuple[np.ndarray | None, np.ndarray], folds: "Folds | None" = None) -> list[Evidence]:
    """The known and the unknown evidence of ``view`` (of reference ``row``), described once and
    asked twice (the unknown one with the whitening learned without its object: ``folds``)."""
    desc = pipe.embed([view])
    (a_in,) = pipe.answer([view], desc, exclude=exclude[0])
    # the references as in a collection without this object
    with leaving_out(pipe.index, labels[row]), _whitened_without(pipe.index, str(labels[row]), folds):
        (a_out,) = pipe.answer([view], desc, exclude=exclude[1])
    top_in, instance, path = a_in.top, str(labels[row]), pipe.index.items[row].path
    return [replace(a_in.evidence(True, top_in is not None and top_in.instance == labels[row]),
                    kind=kind, instance=instance, path=path),
            replace(a_out.evidence(False, False), kind=kind, instance=instance, path=path)]


#: (each object's fold, the stored form of the whitening learned without each fold)
Folds = tuple[dict[str, int], dict[int, np.ndarray]]


def learn_whitening(index: Index, extractor=None, seed: int = 0) -> Generator[Progress, None, Folds | None]:
    """Learn the verdict's whitening of ``index`` (``index.whitening``; None when there are too few
    pairs) from its references and a copy of each as a visitor's phone takes it (at most
    :data:`WHITENING_REFS` of them, drawn at random; stage :data:`WHITENING_STAGE`), and the
    whitenings learned without each fold of objects, which calibration judges unknown views with."""
    pipe = _calibration_pipe(index, extractor)
    labels = index.labels
    n = len(index)
    rng = np.random.default_rng([seed, 37])
    rows = np.sort(rng.choice(n, size=min(n, WHITENING_REFS), replace=False))
    degraded = np.full((len(rows), index.meta.dim), np.nan, np.float32)
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        condition = VISITOR_CONDITIONS[int(rng.integers(len(VISITOR_CONDITIONS)))]
        draw = int(rng.integers(2**31))
        try:
            ref = load_image(index.abspath(int(row)), max_side=pipe.verify_side)
        except Exception:  # unreadable since it was described: no pair
            ref = None
        if ref is not None:
            degraded[i] = pipe.describe([degrade(ref, condition, draw)])[0]
        yield Progress(i + 1, len(rows), current=index.items[int(row)].path, stage=WHITENING_STAGE,
                       elapsed=time.perf_counter() - t0)
    desc = np.asarray(index.descriptors[rows], np.float32)
    whitening = fit_whitening(desc, degraded, labels[rows])
    index.whitening = None if whitening is None else whitening.to_array()
    if whitening is None:
        return None
    of, without = fold_whitenings(desc, degraded, labels[rows], FOLDS)
    return of, {k: w.to_array() for k, w in without.items()}


@contextmanager
def _whitened_without(index: Index, obj: str, folds: Folds | None) -> Iterator[None]:
    """Within it, ``index``'s whitening is the one learned without object ``obj`` (its fold's), when
    ``folds`` has it; else the index's own (an object it was not learned from)."""
    of, without = folds or ({}, {})
    stored = without.get(of.get(obj, -1))
    if stored is None:
        yield
        return
    own, index.whitening = index.whitening, stored
    try:
        yield
    finally:
        index.whitening = own


def refit(index: Index, previous: Verdict, changed: set[str], new_rows: Sequence[int], extractor=None,
          seed: int = 0, unknown_views: Sequence[str] | None = None) -> Generator[Progress, None, Verdict]:
    """An updated index's verdict, refitted from ``previous``'s stored evidence, less the views of
    objects in ``changed`` (photos added, changed or removed) and of photos no longer in the index,
    plus the views of the photos in ``new_rows`` (see :func:`calibration_plan`) and of the
    staff-confirmed visitor photos not asked yet (:func:`with_staff_views`; ``unknown_views``: the
    photos not in the collection, None: those ``previous`` used, measured once). None of
    the other views is asked again: a model of a few numbers fits in milliseconds."""
    present = {it.path for it in index.items}
    kept = [Evidence.from_dict(d) for d in previous.evidence]
    if unknown_views is None:
        unknown_views = [e.path for e in kept if _is_staff_unknown(e)]
    kept = [e for e in kept if _is_staff_unknown(e) or (e.instance not in changed and e.path in present)]
    new: list[Evidence] = []
    if len(new_rows):
        new = yield from calibration_evidence(index, extractor, seed=seed, rows=new_rows)
    evidence = yield from with_staff_views(index, extractor, kept + new, unknown_views)
    if not any(e.known for e in evidence) or not any(not e.known for e in evidence):
        return (yield from calibrate(index, extractor, seed=seed, unknown_views=unknown_views))
    whitened = "; judged with its whitening" if index.whitening is not None else ""
    return fit_verdict(evidence, _source(evidence) + whitened + "; refitted after an update")
