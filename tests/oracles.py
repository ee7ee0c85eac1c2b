"""Test oracles: the dense, straightforward versions of what the product computes another way.

* :func:`gallery_ranks`: the (G, G) gallery-gallery ranks of ICFRR (section 3.2): ``r[i, j]`` is
  the 1-based position of reference ``j`` in the ranking of the gallery against reference ``i``
  (by ``-D``, ties by index; ``r[i, i]`` = the dtype's maximum standing for inf). The product
  reads each reference's nearest neighbours instead (``ann.neighbour_lists``, the index's stored
  lists): the tests check that both agree.
* :func:`prepare_graph`: the ICFRR graph from dense ranks (the product builds it from the
  neighbour lists, ``icfrr.graph_from_neighbours``; tested identical).
* :func:`icfrr_loop`: ICFRR written per query, per iteration (the oracle of :func:`icfrr.icfrr`).

Moved here from ``museum_search/core/rerank/icfrr.py`` (issue 20): nothing in the product uses them.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp

from museum_search.core.answer._icfrr import ICFRRGraph, ICFRRParams, ICFRRResult
from museum_search.core.ranking import neg_distance, order

_CHUNK_ELEMENTS = 1 << 22  # rows x columns of a chunk of gallery-rank rows (~160 MB)


def icfrr_dense(query_scores: np.ndarray, ranks: np.ndarray, params: ICFRRParams, **kw) -> ICFRRResult:
    """:func:`icfrr.icfrr` on dense gallery ranks (their graph for ``params.k_g``)."""
    from museum_search.core.answer._icfrr import icfrr

    return icfrr(query_scores, prepare_graph(ranks, params.k_g), params, **kw)


def rank_dtype(g: int) -> np.dtype:
    """Smallest unsigned integer dtype for the ranks of a gallery of ``g`` references.

    Ranks run from 1 to ``g - 1`` (self excluded) and the dtype's maximum stands for
    ``r[i, i] = inf``, so the dtype must satisfy ``g - 1 < max``: uint8 up to ``g = 255``,
    uint16 up to 65,535, uint32 up to 2**32 - 1.
    """
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if g <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"gallery too large: {g}")


def _as_descriptors(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a (N, D) matrix, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contain NaN or infinite values")
    return x


def _gallery_neg_distance(rows64: np.ndarray, cols64: np.ndarray) -> np.ndarray:
    """``-D`` between descriptor rows and columns (float64 inputs), float32.

    The dot products are accumulated in float64 and rounded to float32 so that the value of a pair
    does not depend on the BLAS code path (matrix shapes, chunking): identical descriptors
    (near-duplicates) then give bit-identical distances and tie exactly, and
    :func:`update_gallery_ranks` reproduces :func:`gallery_ranks`.
    """
    dot = (rows64 @ cols64.T).astype(np.float32)
    return neg_distance(dot)


def _chunk_rows(g: int, chunk: int | None) -> int:
    if chunk is None:
        return max(1, min(max(g, 1), _CHUNK_ELEMENTS // max(g, 1)))
    if int(chunk) < 1:
        raise ValueError("chunk must be at least 1")
    return int(chunk)


def _rank_rows(s: np.ndarray, self_cols: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Ranks (1-based, self = dtype max) from a block of ``-D`` rows; ``self_cols[k]`` = self."""
    n, g = s.shape
    rows = np.arange(n)
    s[rows, self_cols] = -np.inf  # self last, whatever ties it has (masked below)
    ranked = order(s)
    out = np.empty((n, g), dtype=dt)
    np.put_along_axis(out, ranked, np.arange(1, g + 1, dtype=dt)[None, :], axis=1)
    out[rows, self_cols] = np.iinfo(dt).max
    return out


def gallery_ranks(descriptors: np.ndarray, chunk: int | None = None) -> np.ndarray:
    """(G, G) gallery-gallery ranks.

    ``r[i, j]`` is the 1-based position of reference ``j`` in the ranking of the gallery against
    reference ``i`` by ascending Euclidean distance, ties by index; ``r[i, i]`` is the dtype's
    maximum (= inf, section 3.2: "we set r_{i,i} = inf"). Dtype: :func:`rank_dtype`. Rows are
    computed ``chunk`` at a time (default: bounded to about 4M elements per chunk).
    Cost: O(G^2 D) for the distances (BLAS) + O(G^2 log G) for the sorts, memory ``G^2`` ranks
    (uint16: 200 MB for G = 10,000) plus one chunk of temporaries.
    """
    d = _as_descriptors(descriptors, "descriptors")
    g = d.shape[0]
    dt = rank_dtype(g)
    out = np.empty((g, g), dtype=dt)
    if g == 0:
        return out
    d64 = d.astype(np.float64)
    step = _chunk_rows(g, chunk)
    for a in range(0, g, step):
        b = min(g, a + step)
        s = _gallery_neg_distance(d64[a:b], d64)
        out[a:b] = _rank_rows(s, np.arange(a, b), dt)
    return out


def _check_ranks(ranks: np.ndarray) -> np.ndarray:
    ranks = np.asarray(ranks)
    if ranks.ndim != 2 or ranks.shape[0] != ranks.shape[1]:
        raise ValueError(f"gallery ranks must be a square (G, G) matrix, got shape {ranks.shape}")
    if ranks.dtype.kind != "u":
        raise ValueError(f"gallery ranks must be unsigned integers, got {ranks.dtype}")
    if ranks.shape[0] and not np.all(np.diagonal(ranks) == np.iinfo(ranks.dtype).max):
        raise ValueError("gallery ranks must hold the dtype's maximum (= inf) on the diagonal")
    return ranks


def prepare_graph(gallery_ranks: np.ndarray, k_g: int, chunk: int | None = None) -> ICFRRGraph:
    """Sparse top-``k_g`` graph of the gallery ranks (see :class:`ICFRRGraph`). O(G^2) scan."""
    ranks = _check_ranks(gallery_ranks)
    g = ranks.shape[0]
    kg = max(0, min(int(k_g), g - 1))
    step = _chunk_rows(g, chunk)
    cols, data = [], []
    for a in range(0, g, step):
        blk = ranks[a : a + step]
        r, c = np.nonzero(blk <= kg)
        if len(r) != kg * blk.shape[0]:
            raise ValueError("gallery ranks rows are not permutations of 1..G-1: recompute them")
        cols.append(c.astype(np.int32))
        data.append(g - blk[r, c].astype(np.float64))
    indices = np.concatenate(cols) if cols else np.empty(0, np.int32)
    values = np.concatenate(data) if data else np.empty(0, np.float64)
    indptr = np.arange(g + 1, dtype=np.int64) * kg
    w = sp.csr_array((values, indices, indptr), shape=(g, g))
    return ICFRRGraph(g, kg, w)


def icfrr_loop(
    query_scores: np.ndarray,
    gallery_ranks: np.ndarray,
    params: ICFRRParams,
    *,
    scores_are: Literal["dot", "neg_distance"] = "dot",
) -> ICFRRResult:
    """Straightforward per-query implementation of :func:`icfrr` (test oracle and benchmark baseline).

    For each query and iteration: sort, gather the ``K_q`` rank rows of the current top references,
    look up ``alpha`` (Eq. 5, as integers ``G - r``), average (Eq. 6), update (Eq. 3). Same
    arithmetic as :func:`icfrr`, so results are bit-identical. O(K_q G) per query and iteration.
    Partly scored queries (``-inf`` entries, see :func:`icfrr`) run on the whole gallery as they
    are, with ``K_q`` capped at the number of scored references: the oracle of the sub-gallery path.
    """
    if scores_are not in ("dot", "neg_distance"):
        raise ValueError(f"scores_are must be 'dot' or 'neg_distance' (got {scores_are!r})")
    q = np.asarray(query_scores)
    s0_all = neg_distance(q) if scores_are == "dot" else q.astype(np.float32) + np.float32(0.0)
    ranks = _check_ranks(gallery_ranks)
    q, g = s0_all.shape
    if ranks.shape[0] != g:
        raise ValueError(f"query scores have {g} columns, the gallery ranks {ranks.shape[0]}")
    out = s0_all.copy()
    iters = np.zeros(q, dtype=np.int64)
    conv = np.full(q, g < 2)
    if g < 2 or params.max_iter == 0:
        return ICFRRResult(out, iters, conv)
    kg = min(params.k_g, g - 1)
    for qi in range(q):
        s0 = s0_all[qi]
        m = int(np.count_nonzero(s0 > -np.inf))  # scored references (G unless some are -inf)
        if m == 0:
            conv[qi] = True
            continue
        kq = min(params.k_q, m)
        scale = params.beta / (kq * (g - 1))
        s = s0.copy()
        order = np.argsort(-s, kind="stable")
        s0_sorted = s0[order]
        for it in range(1, params.max_iter + 1):
            r = ranks[order[:kq]].astype(np.int64)  # r(I_p, i), p = 1..K_q
            alpha_int = np.where(r <= kg, g - r, 0)  # (G - 1) * alpha[r], Eq. 5 (inf -> 0)
            inc = (alpha_int.sum(axis=0).astype(np.float64) * scale).astype(np.float32)
            if params.mode == "paper":
                s = s + inc
            else:
                new_s = np.empty_like(s)
                new_s[order] = s0_sorted + inc[order]
                s = new_s
            new_order = np.argsort(-s, kind="stable")
            changed = bool(np.any(new_order != order))
            order = new_order
            iters[qi], conv[qi] = it, not changed
            if params.stop_when_stable and not changed:
                break
        out[qi] = s
    return ICFRRResult(out, iters, conv)
