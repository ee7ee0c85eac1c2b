"""The one ranking of the project: references by descending score, ties by row (lower first).

Every ranking (the search's top-k and per-instance results, the evaluation's full rankings,
ICFRR's iterations and neighbour lists, the approximate search's candidates, query expansion's
neighbours) comes from this module, so the same scores always give the same order. NumPy only
(no torch), so the pure metrics can use it too. The public functions, in the spirit of faiss's
``ResultHeap``:

* :func:`order`: rows of the best ``k`` (or all), best first, for one query or many;
* :func:`per_instance`: the same, keeping only the best row of each instance;
* :func:`reorder`: a ranking again after the scores changed, cheap when little moved (ICFRR);
* :func:`merge_top`: a block of candidate scores merged into each row's kept top ``k``;
* :func:`grouped_order`: (group, score, id) triples ordered by group, then as :func:`order`;
* :func:`neg_distance`: ``-D`` from dot products of unit vectors (what neighbour lists rank by);
* :func:`lead_within`: a ranking whose groups keep their places, each group's rows in another order
  (an object's photo with the most matching points first).

All of them sort on the same keys (:func:`_desc_bits`), so their ties agree.
"""

from __future__ import annotations

import numpy as np

__all__ = ["grouped_order", "lead_within", "merge_top", "neg_distance", "order", "per_instance", "reorder"]


def order(scores: np.ndarray, k: int | None = None) -> np.ndarray:
    """Rows of the best ``k`` references (all with ``k=None``), best first, ties by row.

    ``scores``: (G,) or (Q, G) (higher is better; -inf sorts last; no NaN). Returns (k,) or (Q, k)
    indices (``k`` capped at G). Same result as ``np.argsort(-scores, axis=-1, kind="stable")[..., :k]``
    for float32 scores, in linear time plus a sort of the ``k`` winners when ``k`` is small.
    """
    s = np.asarray(scores, dtype=np.float32)
    s2 = np.atleast_2d(s)
    g = s2.shape[1]
    out = _full(s2) if k is None or int(k) >= g else _top(s2, int(k))
    return out[0] if s.ndim == 1 else out


def per_instance(scores: np.ndarray, labels: np.ndarray, k: int | None = None) -> np.ndarray:
    """Rows of the best ``k`` instances (all with ``k=None``): the best-scoring reference of each
    instance (``labels``: one instance per reference), best first, ties by row. One query:
    ``scores`` (G,), returns (k,)."""
    s = np.asarray(scores, dtype=np.float32)
    if s.ndim != 1:
        raise ValueError("per-instance rankings take one query's scores at a time")
    rows = _full(s[None])[0]
    _, first = np.unique(np.asarray(labels)[rows], return_index=True)
    best = rows[np.sort(first)]
    return best if k is None else best[: max(0, int(k))]


#: Below this share of out-of-order neighbours, :func:`reorder` re-sorts with the adaptive merge sort.
_FEW_DESCENTS = 0.2


def reorder(scores: np.ndarray, previous: np.ndarray, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ranking of each row of (n, G) ``scores`` again, given its previous ranking ``previous``
    (n, G): ``(changed, orders)``, ``changed`` (n,) True where the ranking is no longer
    ``previous``, ``orders`` the new rankings of the changed rows only (c, G), best first, as
    :func:`order` gives them. ``sort=False`` (or nothing changed): ``orders`` is empty (0, G).

    Cost O(G) per row to find out (the scores laid out in the previous order are already sorted
    iff nothing moved), then a sort of the changed rows that is nearly linear when few moved.
    """
    prev = np.asarray(previous)
    k = _keys(np.take_along_axis(np.asarray(scores, dtype=np.float32), prev, axis=1), prev)
    descents = np.count_nonzero(k[:, 1:] < k[:, :-1], axis=1)
    changed = descents > 0
    if not sort or not changed.any():
        return changed, np.empty((0, k.shape[1]), dtype=np.intp)
    kc = k if changed.all() else k[changed]
    # Keys are unique, so any sort gives the same result: the adaptive merge sort is much faster
    # when few references moved, the vectorized quicksort when many did.
    few = descents.sum() < _FEW_DESCENTS * kc.size
    kc.sort(axis=1, kind="stable" if few else "quicksort")
    kc &= _LOW32
    return changed, kc.astype(np.intp)


def merge_top(vals: np.ndarray, idx: np.ndarray, block: np.ndarray, cols: int | np.ndarray) -> None:
    """Merge the score block ``block`` (R, C) into each row's kept top ``kk`` (``vals``/``idx``
    (R, kk), sorted by descending score: the last is the row's threshold), in place. Column ``j``
    of ``block`` is reference ``cols + j`` (an int) or ``cols[j]`` (an array)."""
    s = block
    rcount, kk = vals.shape
    thr = vals[:, -1]
    above = s > thr[:, None]
    count = int(np.count_nonzero(above))
    if count == 0:
        return
    if count > 2 * rcount * kk and s.shape[1] > kk:  # a first look at these rows: partition first
        part = np.argpartition(s, s.shape[1] - kk, axis=1)[:, -kk:]
        ps = np.take_along_axis(s, part, axis=1)
        r, j = np.nonzero(ps > thr[:, None])
        c, v = part[r, j], ps[r, j]
    else:
        r, c = np.nonzero(above)
        v = s[r, c]
    touched, counts = np.unique(r, return_counts=True)
    t = len(touched)
    ids = (c + cols) if isinstance(cols, (int, np.integer)) else cols[c]
    all_r = np.concatenate([np.repeat(np.arange(t), kk), np.searchsorted(touched, r)])
    all_v = np.concatenate([vals[touched].ravel(), v])
    all_i = np.concatenate([idx[touched].ravel(), ids.astype(np.int32)])
    key = (all_r.astype(np.uint64) << _SHIFT) | _desc_bits(all_v).astype(np.uint64)
    sorted_ = np.argsort(key)
    starts = np.concatenate([[0], np.cumsum(counts + kk)[:-1]])
    pos = np.arange(len(sorted_)) - starts[all_r[sorted_]]
    sel = sorted_[pos < kk]
    vals[touched] = all_v[sel].reshape(t, kk)
    idx[touched] = all_i[sel].reshape(t, kk)


def grouped_order(groups: np.ndarray, scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The permutation that sorts (group, score, id) triples by group (ascending), then by
    descending score, ties by id (lower first): within a group, the order of :func:`order`."""
    return np.lexsort((ids, _desc_bits(scores), groups))


def lead_within(rows: np.ndarray, labels: np.ndarray, key: dict[int, int], extra: np.ndarray | None = None
                ) -> np.ndarray:
    """``rows`` (a ranking, best first) with the places each group holds kept, and the group's rows
    put in them by descending ``key[row]`` (rows without a key after those with one), ties as
    ranked. ``labels``: the group of every row; ``extra``: rows outside ``rows``, in ranking order,
    that may take a place of their group (a photo with a key ranked below the cut).

    So the order of the groups and how they interleave are those of ``rows``: only which of a
    group's rows stands in each of its places changes."""
    rows = np.asarray(rows)
    extra = np.asarray([] if extra is None else extra, dtype=rows.dtype)
    if not key or not len(rows):
        return rows
    labels = np.asarray(labels)
    if len(extra):
        shown = set(rows.tolist())
        extra = np.asarray([r for r in extra.tolist() if r not in shown], dtype=rows.dtype)
    pool = np.concatenate([rows, extra])
    pooled = labels[pool]
    out = rows.copy()
    for lab in set(labels[list(key)].tolist()):  # the other groups keep their order
        here = pooled == lab
        places = np.flatnonzero(here[:len(rows)])
        mine = pool[here]  # as ranked: the shown rows first, then the extra ones
        best = sorted(range(len(mine)), key=lambda i: (-key.get(int(mine[i]), -1), i))
        out[places] = mine[best[:len(places)]]
    return out


def neg_distance(dot: np.ndarray) -> np.ndarray:
    """``-D`` from dot products of L2-normalized descriptors, float32 (ICFRR's ``s(0)``, Eq. 4;
    what neighbour lists rank by).

    ``D = sqrt(max(0, 2 - 2 dot))`` is the Euclidean distance between unit vectors; the clamp
    absorbs rounding (``dot`` slightly above 1 for identical descriptors). ``-0.0`` is returned as
    ``+0.0`` so that it ties with ``0.0``.
    """
    dot = np.asarray(dot, dtype=np.float32)
    d2 = np.maximum(np.float32(2.0) - np.float32(2.0) * dot, np.float32(0.0))
    out = np.sqrt(d2)
    np.negative(out, out=out)
    out += np.float32(0.0)  # -0.0 -> +0.0
    return out


# --------------------------------------------------------------------------------------------
# The keys every function above sorts on
# --------------------------------------------------------------------------------------------


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


def _full(scores: np.ndarray) -> np.ndarray:
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


def _top(scores: np.ndarray, k: int) -> np.ndarray:
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
        return _full(s)[:, :k]
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
