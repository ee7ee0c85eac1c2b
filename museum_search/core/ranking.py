"""The one ranking of the project: references by descending score, ties by row (lower first).

Every ranking (the search's top-k, the evaluation's full rankings, ICFRR's neighbour lists, the
query pipeline's shortlist and results) comes from :func:`ranking`, so the same scores always give
the same order. NumPy only (no torch), so the pure metrics can use it too.
"""

from __future__ import annotations

import numpy as np


def ranking(scores: np.ndarray, k: int | None = None, labels: np.ndarray | None = None) -> np.ndarray:
    """Rows of the best ``k`` references (all with ``k=None``), best first, ties by row.

    ``scores``: (G,) or (Q, G) (higher is better; -inf sorts last; no NaN). Returns (k,) or (Q, k).
    With ``labels`` (one instance per reference), only the best reference of each instance is kept
    (1-D scores only).
    """
    s = np.asarray(scores, dtype=np.float32)
    one = s.ndim == 1
    s2 = np.atleast_2d(s)
    g = s2.shape[1]
    if labels is not None:
        if not one:
            raise ValueError("per-instance rankings take one query's scores at a time")
        order = ranking_from_scores(s2)[0]
        _, first = np.unique(np.asarray(labels)[order], return_index=True)
        best = order[np.sort(first)]
        return best if k is None else best[: max(0, int(k))]
    out = ranking_from_scores(s2) if k is None or int(k) >= g else top_indices(s2, int(k))
    return out[0] if one else out


def _desc_bits(s: np.ndarray) -> np.ndarray:
    """uint32 keys whose ascending order is the *descending* order of the float32 scores ``s``.

    Order-preserving map of IEEE-754 bits: negative floats keep their bits (larger magnitude,
    larger key), non-negative floats are mapped below them in reverse. ``-0.0`` is folded into
    ``+0.0``. NaN must be excluded by the caller.
    """
    s = np.asarray(s, dtype=np.float32) + np.float32(0.0)  # -0.0 -> +0.0 (also copies)
    b = s.view(np.uint32)
    flip = b >> np.uint32(31)  # 1 for negative floats, 0 otherwise
    flip -= np.uint32(1)  # 0 for negative, 0xFFFFFFFF otherwise (wraps)
    flip &= np.uint32(0x7FFFFFFF)
    b ^= flip
    return b


_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def _keys(s: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """uint64 keys ``(desc score bits, index)``: ascending keys = ranking by (-score, index)."""
    k = _desc_bits(s).astype(np.uint64)
    k <<= _SHIFT
    k |= idx.astype(np.uint64, copy=False)
    return k


def ranking_from_scores(scores: np.ndarray) -> np.ndarray:
    """(Q, G) reference indices best first: by descending score, ties by index (lower first).

    Same result as ``np.argsort(-scores, axis=1, kind="stable")`` for NaN-free float32 scores:
    the sort runs on unique uint64 keys ``(score bits, index)``, so the fast unstable sort is
    deterministic.
    """
    s = np.atleast_2d(np.asarray(scores, dtype=np.float32))
    g = s.shape[1]
    if g >= 1 << 32:
        raise ValueError("galleries of 2**32 references or more are not supported")
    k = _keys(s, np.arange(g, dtype=np.uint64)[None, :])
    k.sort(axis=1)
    k &= _LOW32
    return k.astype(np.intp)


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """(Q, k) indices of the ``k`` best scores of each row, best first, ties by index.

    Linear-time selection (``np.partition``) followed by a sort of the ``k`` winners; the
    boundary value is resolved by index so the selected set is deterministic.
    """
    s = np.atleast_2d(np.asarray(scores, dtype=np.float32))
    q, g = s.shape
    k = max(0, min(int(k), g))
    if k == 0:
        return np.empty((q, 0), dtype=np.intp)
    if 4 * k >= g:
        return ranking_from_scores(s)[:, :k]
    s = s + np.float32(0.0)  # -0.0 -> +0.0 so that == and > agree with the keys
    kth = np.partition(s, g - k, axis=1)[:, g - k : g - k + 1]  # k-th largest value per row
    greater = s > kth
    need = k - greater.sum(axis=1, keepdims=True)
    equal = s == kth
    sel = greater | (equal & (np.cumsum(equal, axis=1) <= need))
    idx = np.nonzero(sel)[1].reshape(q, k)  # ascending index within each row
    sub = np.take_along_axis(s, idx, axis=1)
    o = np.argsort(-sub, axis=1, kind="stable")  # stable: ties keep ascending index
    return np.take_along_axis(idx, o, axis=1)
