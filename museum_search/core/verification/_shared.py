"""Local features several objects share, set aside from the references (issue 36).

A museum hangs its works in the same frames, beside the same labels, on the same walls, and a
turntable photographs look-alike objects on the same plate: the features of a gilded frame's corners
or of a label agree with a homography between photos of *different* objects. A visitor's photo of a
work not in the collection then finds 20-50 inliers on another work's frame, and the verdict, which
sees such unknown views in its calibration, learns to distrust inliers and leans on the global
cosine, which a dim or close-up photo does not have. (The sample collection's gilded frames: an
unknown view of *Valley at Dusk* matched *Wind over the Wheat* with 51 inliers, all on the frame and
the label.)

So each reference's features that are inliers of a homography with references of another object
(:data:`SHARED_MIN_INLIERS` or more, against its :data:`SHARED_NEIGHBOURS` most similar references of
other objects by the global descriptor) are removed from the stored features: what remains is what
tells the object apart. The idea is the "confusing features" of Knopp, Sivic and Pajdla (ECCV 2010),
found here by the same geometric check as the verification itself.

Measured (one run each; the figures in the README's *What several objects share is set aside*):
the visitor-photo protocol's known objects refused, pooled over three sets, 4.0 -> 2.3 % on clean
photos and 17.9 -> 15.6 % on phone-like ones, the unknown ones rejected as before; 0.8-5 % of the
features are removed. A calibration's unknown view of X meets the references as without X
(:func:`leaving_out`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from museum_search.core.index import Features, LocalFeatures
from museum_search.core.progress import Progress
from museum_search.core.verification._spatial import SpatialParams, verify_many

#: The references of other objects each reference is checked against: its most similar ones by the
#: global descriptor (those a visitor's photo of it would also have in its shortlist).
SHARED_NEIGHBOURS = 10
#: Inliers from which a homography between two objects' photos is a real agreement (a frame, a
#: label, a printed logo), not chance (a handful of inliers agree by chance between any two photos).
SHARED_MIN_INLIERS = 8
#: Global descriptors compared per block when finding the neighbours (rows x references floats).
_BLOCK = 4_000_000
STAGE = "setting aside what several objects share"


def _other_neighbours(descriptors: np.ndarray, labels: np.ndarray, rows: Sequence[int], k: int) -> list[np.ndarray]:
    """For each of ``rows``, its ``k`` most similar references of another object (global cosine)."""
    x = np.asarray(descriptors, np.float32)
    out: list[np.ndarray] = []
    step = max(1, _BLOCK // max(1, len(x)))
    for a in range(0, len(rows), step):
        block = np.asarray(rows[a:a + step])
        sims = x[block] @ x.T
        sims[labels[block][:, None] == labels[None, :]] = -np.inf  # the same object (and itself)
        kk = min(k, max(0, len(x) - 1))
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk] if kk else np.empty((len(block), 0), int)
        for i, cand in enumerate(top):
            cand = cand[np.isfinite(sims[i, cand])]
            out.append(cand[np.argsort(-sims[i, cand], kind="stable")])
    return out


def shared_points(features: Features, others: Sequence[tuple[Features, tuple[float, float], str]],
                  params: SpatialParams, min_inliers: int = SHARED_MIN_INLIERS) -> list[frozenset[str]]:
    """For each point of ``features``, the objects of ``others`` ((features, size, object) of other
    objects' references) with which it is an inlier of a homography of at least ``min_inliers``
    inliers (empty: it tells its object apart)."""
    points = features[0]
    objects: list[set[str]] = [set() for _ in range(len(points))]
    if not len(points) or not others:
        return [frozenset()] * len(points)
    found: list = []
    verify_many(features, [o[0] for o in others], params, [o[1] for o in others], found)
    where: dict[tuple[float, float], list[int]] = {}
    for i, (x, y) in enumerate(points.tolist()):
        where.setdefault((x, y), []).append(i)
    for (src, _dst, _h, mask), other in zip(found, others):
        if mask is None or int(np.count_nonzero(mask)) < min_inliers:
            continue
        for x, y in np.asarray(src)[np.asarray(mask).ravel().astype(bool)].tolist():
            for i in where.get((x, y), ()):
                objects[i].add(other[2])
    return [frozenset(o) for o in objects]


@dataclass
class SetAside:
    """What :func:`without_shared_features` removed, kept in memory (never saved) for the calibration
    that follows it: per row, its features as computed and the objects each point agreed with. A
    calibration view of object X asked as an unknown object (X left out) must meet the references as
    they would be in a collection without X: a point set aside only because it agreed with X is
    theirs again (:func:`leaving_out`); without it, the calibration's unknown views would find fewer
    points than a real unknown object does, and its threshold would accept too many of them."""

    rows: dict[int, tuple[Features, list[frozenset[str]]]]

    @property
    def removed(self) -> int:
        return sum(sum(1 for o in objs if o) for _, objs in self.rows.values())

    def features_without(self, row: int, obj: str) -> Features | None:
        """The features of ``row`` in a collection without object ``obj`` (None: as stored)."""
        got = self.rows.get(row)
        if got is None:
            return None
        (points, desc), objs = got
        if not any(o == {obj} for o in objs):
            return None
        keep = np.array([not o or o == {obj} for o in objs], bool)
        return points[keep], desc[keep]


class _LeftOut:
    """``local`` as it would be without object ``obj`` (see :class:`SetAside`); what verification reads of it."""

    def __init__(self, local: LocalFeatures, set_aside: SetAside, obj: str):
        self._local, self._set_aside, self._obj = local, set_aside, obj
        self.settings = local.settings

    def __len__(self) -> int:
        return len(self._local)

    def get(self, row: int) -> tuple[Features, tuple[float, float]] | None:
        got = self._local.get(row)
        restored = self._set_aside.features_without(row, self._obj)
        return got if got is None or restored is None else (restored, got[1])

    def byte_terms(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The stored rows' terms (:meth:`LocalFeatures.byte_terms`); None for a row whose points are
        back (its matching computes them)."""
        if self._set_aside.features_without(row, self._obj) is not None:
            return None
        return self._local.byte_terms(row)


@contextmanager
def leaving_out(index: Any, obj: str) -> Iterator[None]:
    """Within it, ``index``'s stored features are those of a collection without object ``obj``: the
    points set aside only because they agreed with ``obj`` are back (a calibration's unknown view of
    ``obj``). Nothing changes for an index whose features were not set aside in this process."""
    local = getattr(index, "local", None)
    set_aside = getattr(local, "set_aside", None)
    if local is None or set_aside is None:
        yield
        return
    index.local = _LeftOut(local, set_aside, str(obj))
    try:
        yield
    finally:
        index.local = local


def without_shared_features(local: LocalFeatures, descriptors: np.ndarray, labels: Sequence[str],
                            params: SpatialParams, rows: Sequence[int] | None = None,
                            neighbours: int = SHARED_NEIGHBOURS) -> Generator[Progress, None, tuple[LocalFeatures, int]]:
    """(``local`` with the features of ``rows`` (default: all) that several objects share removed,
    how many were removed), as a progress generator (stage :data:`STAGE`; closing it cancels). The
    new features carry what was removed (``set_aside``: :class:`SetAside`, in memory only) for
    :func:`leaving_out`.

    ``descriptors`` are the references' global descriptors (row-aligned with ``local``), ``labels``
    their objects. Each reference of ``rows`` is checked against its ``neighbours`` most similar
    references of other objects (:func:`shared_points`). An update (``rows``: its new photos) checks
    them so, and each older photo among their neighbours against the new photos that found it: what
    it shares with them is set aside too, as a build of the whole collection would (the older photos
    were checked against each other when they came)."""
    labels_arr = np.asarray([str(x) for x in labels])
    todo = list(range(len(local))) if rows is None else [int(r) for r in rows]
    if len(set(labels_arr.tolist())) < 2 or not todo:
        return local, 0
    checks = [(row, cand.tolist()) for row, cand in zip(todo, _other_neighbours(descriptors, labels_arr, todo, neighbours))]
    if rows is not None:
        new, back = set(todo), dict[int, list[int]]()
        for row, cand in checks:
            for c in cand:
                if c not in new:
                    back.setdefault(int(c), []).append(row)
        checks += sorted(back.items())
    entries = [local.get(i) for i in range(len(local))]
    set_aside = SetAside({})
    t0 = time.perf_counter()
    for n, (row, cand) in enumerate(checks):
        got = entries[row]
        if got is not None:
            others = []
            for c in cand:
                other = local.get(int(c))
                if other is not None:
                    others.append((other[0], other[1], str(labels_arr[c])))
            objs = shared_points(got[0], others, params)
            shared = np.array([bool(o) for o in objs], bool)
            if shared.any():
                entries[row] = ((got[0][0][~shared], got[0][1][~shared]), got[1])
                set_aside.rows[row] = (got[0], objs)
        yield Progress(n + 1, len(checks), stage=STAGE, elapsed=time.perf_counter() - t0)
    if not set_aside.rows:
        return local, 0
    out = LocalFeatures.from_list(entries, local.settings, local.descriptors.shape[1], local.descriptors.dtype)
    out.set_aside = set_aside
    return out, set_aside.removed
