"""Learned whitening of the global descriptor for the verdict (Radenović, Tolias and Chum's *learned
whitening*, L_w, from matching pairs; "Fine-tuning CNN image retrieval with no human annotation",
TPAMI 2018, section 3.3), learned per collection from its own references, no labelled query needed.

An ImageNet descriptor changes with what a visitor's photo adds: the light, the blur, the angle,
another side of a 3D object. On COIL-100's leave-out protocol as a phone takes the photos, the
cosine of a known object's other view and that of a look-alike overlap, and the verdict refused 33
of 240 known photos. Whitening learns, from pairs that show the same object, which directions of the
descriptor such changes move (their covariance, whitened away), then keeps the directions in which
the references differ most (PCA of the whitened references). Its pairs:

* each reference and a copy of it as a visitor's phone takes it (one of the protocol's conditions,
  :mod:`museum_search.core.conditions`, drawn per reference;
  :func:`museum_search.core.jobs._calibration.learn_whitening`);
* consecutive photos of one object (another side of it, where the collection has several).

The whitened cosine and its margin over the best other object replace the plain ones in the verdict
(:class:`museum_search.core.answer._verdict.Evidence`); the ranking is unchanged. A calibration view
of an object "not in the collection" is judged with a whitening learned without that object
(:func:`fold_whitenings`: learned on the other folds of objects), as a visitor's photo of an object
that is truly not in the collection is: otherwise the whitening, which learned to tell that object
apart, would make look-alikes look easier to refuse than they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from museum_search.core.errors import IndexFormatError

#: Shrinkage of the pairs' covariance towards its mean variance (a 1280-d covariance from a few
#: hundred pairs is singular): ``lambda * trace / D`` is added to its diagonal.
SHRINKAGE = 0.1
#: Dimensions kept after whitening (at most the descriptor's).
DIMS = 512
#: Objects are split into this many folds: a calibration's unknown view of an object is judged with
#: the whitening learned on the other folds.
FOLDS = 5
#: Whitening needs at least this many pairs (fewer: none is learned, the verdict uses plain cosines).
MIN_PAIRS = 16


@dataclass(eq=False)
class Whitening:
    """``x -> normalize(matrix @ (x - mean))``: (D,) mean and (k, D) matrix, float32."""

    mean: np.ndarray
    matrix: np.ndarray
    #: the whitened references, computed once per whitening (:meth:`references`)
    _refs: tuple[int, np.ndarray] | None = field(default=None, repr=False)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The whitened, L2-normalized rows of ``x`` (..., D)."""
        y = (np.asarray(x, np.float32) - self.mean) @ self.matrix.T
        return y / np.maximum(np.linalg.norm(y, axis=-1, keepdims=True), 1e-12)

    def references(self, descriptors: np.ndarray) -> np.ndarray:
        """The whitened ``descriptors`` of an index's references, kept for the next call with the same array."""
        if self._refs is None or self._refs[0] != id(descriptors):
            self._refs = (id(descriptors), self.apply(descriptors))
        return self._refs[1]

    def to_array(self) -> np.ndarray:
        """(k + 1, D) float32: the mean, then the matrix (the index's stored form)."""
        return np.vstack([self.mean[None], self.matrix]).astype(np.float32)

    @classmethod
    def from_array(cls, a: np.ndarray, dim: int) -> "Whitening":
        a = np.asarray(a)
        if a.ndim != 2 or a.shape[1] != dim or not 2 <= a.shape[0] <= dim + 1 or a.dtype.kind != "f":
            raise IndexFormatError(f"the stored whitening has shape {a.shape} ({a.dtype}), not (k + 1, {dim}) numbers")
        a = np.asarray(a, np.float32)
        if not np.all(np.isfinite(a)):
            raise IndexFormatError("the stored whitening has values that are not numbers")
        return cls(a[0].copy(), a[1:].copy())


def pairs(descriptors: np.ndarray, degraded: np.ndarray, labels: Sequence[str] | np.ndarray) -> np.ndarray:
    """The differences of the matching pairs (see the module doc): each reference minus its degraded
    copy (rows of ``degraded`` that are not finite are left out: a photo that could not be read),
    and consecutive references of each object."""
    X, Xd = np.asarray(descriptors, np.float32), np.asarray(degraded, np.float32)
    lab = np.asarray(labels)
    ok = np.all(np.isfinite(Xd), axis=1)
    diffs = [X[ok] - Xd[ok]]
    for obj in np.unique(lab):
        rows = np.flatnonzero(lab == obj)
        if len(rows) > 1:
            diffs.append(X[rows[:-1]] - X[rows[1:]])
    return np.concatenate(diffs)


def fit_whitening(descriptors: np.ndarray, degraded: np.ndarray, labels: Sequence[str] | np.ndarray,
                  shrinkage: float = SHRINKAGE, dims: int = DIMS) -> Whitening | None:
    """The whitening learned from ``descriptors`` (N, D), their ``degraded`` copies (N, D) and their
    objects ``labels`` (see the module doc); None with fewer than :data:`MIN_PAIRS` pairs."""
    X = np.asarray(descriptors, np.float64)
    diffs = pairs(descriptors, degraded, labels).astype(np.float64)
    if len(diffs) < MIN_PAIRS or len(X) < 2:
        return None
    d = X.shape[1]
    cs = diffs.T @ diffs / len(diffs)
    cs += shrinkage * np.trace(cs) / d * np.eye(d)
    w, v = np.linalg.eigh(cs)
    p = (v * np.maximum(w, 1e-12) ** -0.5) @ v.T  # the pairs' covariance to the -1/2
    mean = X.mean(axis=0)
    xw = (X - mean) @ p.T
    _, u = np.linalg.eigh(xw.T @ xw / len(xw))
    keep = u[:, ::-1][:, :min(dims, d)]
    return Whitening(mean.astype(np.float32), (keep.T @ p).astype(np.float32))


def fold_of(labels: Sequence[str] | np.ndarray, folds: int = FOLDS, seed: int = 0) -> dict[str, int]:
    """Each object's fold: the objects in a random order (``seed``), dealt out in turn."""
    objects = sorted(set(np.asarray(labels).tolist()))
    order = np.random.default_rng(seed).permutation(len(objects))
    return {str(objects[i]): k % folds for k, i in enumerate(order)}


def fold_whitenings(descriptors: np.ndarray, degraded: np.ndarray, labels: Sequence[str] | np.ndarray,
                    folds: int = FOLDS) -> tuple[dict[str, int], dict[int, Whitening]]:
    """(each object's fold, the whitening learned without each fold); a fold whose rest has too few
    pairs has none (its objects' unknown views are judged with the whole collection's)."""
    lab = np.asarray(labels)
    of = fold_of(lab, folds)
    fold = np.array([of[str(x)] for x in lab])
    out: dict[int, Whitening] = {}
    for k in sorted(set(of.values())):
        keep = fold != k
        w = fit_whitening(np.asarray(descriptors)[keep], np.asarray(degraded)[keep], lab[keep])
        if w is not None:
            out[k] = w
    return of, out
