"""Each reference's nearest neighbours (ICFRR's gallery ranks), and their update after an index update.

:func:`neighbour_lists` gives each reference's ``k`` nearest *other* references with exactly the
arithmetic and tie rule of ICFRR's gallery ranks (``-D`` from float64 dot products
rounded to float32, self excluded, ties by lower row), without an N x N matrix: a float32 pass
pre-selects the candidates (with a proven error margin, so nothing is lost), and only those are
scored again in float64. With an :class:`._approximate.AnnIndex` (for indexes too large for an
O(N^2) pass) the candidates come from a k-NN graph method (:mod:`._knn`: balanced cells, each
reference against the members of its nearest cells), then the same exact re-scoring.

After an update of the index, :func:`update_neighbour_lists` keeps the lists that cannot change and
computes only the others again (identical to computing them all again).
"""

from __future__ import annotations

import time
from collections.abc import Generator

import numpy as np

from museum_search.core.errors import MuseumSearchError
from museum_search.core.index._approximate import AnnIndex
from museum_search.core.index._exact import _check_descriptors, _check_map, _chunk_rows, _gather
from museum_search.core.index._knn import KnnParams, knn_candidates
from museum_search.core.progress import Progress
from museum_search.core.ranking import grouped_order, merge_top, neg_distance

__all__ = ["NEIGHBOURS_STAGE", "neighbour_lists", "update_neighbour_lists"]

#: Stage name of the progress records.
NEIGHBOURS_STAGE = "finding each reference's nearest neighbours"

# rows x rows float32 score blocks of the exact neighbour pass (4096 x 4096 = 64 MB).
_BLOCK_ROWS = 4096
# float64 elements gathered at once when candidates are scored again exactly (64 MB).
_EXACT_ELEMENTS = 1 << 23


def _float32_margin(d: np.ndarray) -> float:
    """A bound on how far apart two candidates' float32 scores can be, relative to the final order.

    float32 dot products of D terms are within ``gamma_D |a||b|`` of the real value (any order of
    summation, ``gamma_D = D u / (1 - D u)``, ``u = 2^-24``); the float64 ones rounded to float32
    within half an ulp (``< 6e-8`` for |dot| <= 1) plus float64 rounding. Two candidates compared
    across the two computations: twice that; ``-D = -sqrt(2 - 2 dot)`` in float32 can also make
    dots up to a few ulps apart tie (``4e-6`` covers it). With the largest row norm ``r``:
    ``2 (gamma_D r^2 + 1e-7) + 4e-6`` (1.6e-4 for unit vectors at D = 1280).
    """
    n, dim = d.shape
    r2 = 0.0
    step = _chunk_rows(dim)
    for a in range(0, n, step):
        x = np.asarray(d[a:a + step], dtype=np.float32)
        r2 = max(r2, float(_norms2(x).max(initial=0.0)))
    return float(_margin(r2, dim))


def _norms2(x: np.ndarray) -> np.ndarray:
    """float64 squared norms of the float32 rows ``x``."""
    return np.einsum("ij,ij->i", x, x, dtype=np.float64)


def _margin(r2: float | np.ndarray, dim: int) -> float | np.ndarray:
    """:func:`_float32_margin` for rows of squared norm at most ``r2`` (a number or one per pair)."""
    u = 2.0 ** -24
    gamma = dim * u / (1 - dim * u)
    return 2.0 * (gamma * np.maximum(r2, 1.0) * 1.0001 + 1e-7) + 4e-6


def _exact_top_all(d: np.ndarray, kk: int, start: float) -> Generator[Progress, None, tuple[np.ndarray, np.ndarray]]:
    """Each row's ``kk`` best float32 scores among the other rows (self excluded), sorted by
    descending score: blocks of rows against blocks of rows, each product used for both blocks."""
    n = d.shape[0]
    vals = np.full((n, kk), -np.inf, dtype=np.float32)
    idx = np.full((n, kk), -1, dtype=np.int32)
    bs = _BLOCK_ROWS
    blocks = list(range(0, n, bs))
    nb = len(blocks)
    total_pairs = nb * (nb + 1) // 2
    done = 0
    for ai, a in enumerate(blocks):
        ae = min(n, a + bs)
        xa = np.asarray(d[a:ae], dtype=np.float32)
        for b in blocks[ai:]:
            be = min(n, b + bs)
            xb = xa if b == a else np.asarray(d[b:be], dtype=np.float32)
            s = xa @ xb.T
            if b == a:
                np.fill_diagonal(s, -np.inf)
            merge_top(vals[a:ae], idx[a:ae], s, b)
            if b != a:
                merge_top(vals[b:be], idx[b:be], s.T, a)
            done += 1
            yield Progress(int(n * done / total_pairs * 0.95), n, stage=NEIGHBOURS_STAGE,
                           elapsed=time.perf_counter() - start)
    return vals, idx


def _column_chunks(d: np.ndarray, cols: np.ndarray | None):
    """(first id or ids, float32 rows) of the columns ``cols`` (None: every row), a chunk at a time."""
    n, dim = d.shape
    step = min(_BLOCK_ROWS, _chunk_rows(dim))
    if cols is None:
        for a in range(0, n, step):
            yield a, np.asarray(d[a:a + step], dtype=np.float32)
    else:
        for a in range(0, len(cols), step):
            c = cols[a:a + step]
            yield c, _gather(d, c)


def _mask_self(s: np.ndarray, rows: np.ndarray, ids: int | np.ndarray) -> None:
    """-inf where a column of ``s`` is the row itself (``rows`` and ``ids`` sorted)."""
    if isinstance(ids, (int, np.integer)):
        hit = (rows >= ids) & (rows < ids + s.shape[1])
        s[np.nonzero(hit)[0], rows[hit] - ids] = -np.inf
    else:
        pos = np.searchsorted(ids, rows)
        hit = pos < len(ids)
        hit[hit] = ids[pos[hit]] == rows[hit]
        s[np.nonzero(hit)[0], pos[hit]] = -np.inf


def _top_over(d: np.ndarray, rows: np.ndarray, cols: np.ndarray | None, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``rows``'s (sorted) ``kk`` best float32 scores among ``cols`` (sorted; None: all),
    itself excluded."""
    vals = np.full((len(rows), kk), -np.inf, dtype=np.float32)
    idx = np.full((len(rows), kk), -1, dtype=np.int32)
    few_cols = cols is not None and len(cols) <= _BLOCK_ROWS
    chunks = list(_column_chunks(d, cols)) if few_cols else None
    for ra in range(0, len(rows), _BLOCK_ROWS):
        rr = rows[ra:ra + _BLOCK_ROWS]
        x = _gather(d, rr)
        for ids, c in (chunks if chunks is not None else _column_chunks(d, cols)):  # chunks: few_cols
            s = x @ c.T
            _mask_self(s, rr, ids)
            merge_top(vals[ra:ra + _BLOCK_ROWS], idx[ra:ra + _BLOCK_ROWS], s, ids)
    return vals, idx


def _scan_above(d: np.ndarray, rows: np.ndarray, lows: np.ndarray,
                cols: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, column != row) of ``cols`` (None: all) with a float32 score >= ``lows[row]``:
    (owners (positions in ``rows``), columns), sorted by owner then column. For the rare rows whose
    kept list is full up to the margin (many equal or nearly equal references)."""
    owners, found = [], []
    for ra in range(0, len(rows), _BLOCK_ROWS):
        rr = rows[ra:ra + _BLOCK_ROWS]
        x = _gather(d, rr)
        for ids, c in _column_chunks(d, cols):
            s = x @ c.T
            _mask_self(s, rr, ids)
            o, j = np.nonzero(s >= lows[ra:ra + _BLOCK_ROWS, None])
            owners.append(o + ra)
            found.append(j + ids if isinstance(ids, (int, np.integer)) else ids[j])
    if not owners:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    o = np.concatenate(owners).astype(np.int64)
    c = np.concatenate(found).astype(np.int64)
    srt = np.lexsort((c, o))
    return o[srt], c[srt]


def _rank_exactly(d: np.ndarray, rows: np.ndarray, owners: np.ndarray, cols: np.ndarray, k: int) -> np.ndarray:
    """(len(rows), k) int32: for each row, its candidates ``cols[owners == i]`` ordered exactly as
    ICFRR's gallery ranks order them (-D from float64 dot products rounded to float32, ties by
    lower column: :func:`.ranking.grouped_order`), the first ``k``. ``owners`` sorted; each row has >= ``k``."""
    m = len(rows)
    if m == 0 or k == 0:
        return np.empty((m, k), dtype=np.int32)
    counts = np.bincount(owners, minlength=m)
    if counts.min() < k:
        raise AssertionError("a row has fewer candidates than neighbours asked for")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    dots = np.empty(len(cols), dtype=np.float32)
    dim = d.shape[1]
    per = max(1, _EXACT_ELEMENTS // dim)
    a = 0
    while a < m:  # rows whose candidates fit the float64 budget
        b = int(np.searchsorted(bounds, bounds[a] + per, side="right")) - 1
        b = min(m, max(a + 1, b))
        lo, hi = bounds[a], bounds[b]
        uniq, inv = np.unique(cols[lo:hi], return_inverse=True)
        g = _gather(d, uniq, np.float64)
        x = np.asarray(d[rows[a:b]], dtype=np.float64)
        for i in range(a, b):
            s, e = bounds[i] - lo, bounds[i + 1] - lo
            dots[lo + s:lo + e] = g[inv[s:e]] @ x[i - a]
        a = b
    nd = neg_distance(dots)
    ranked = grouped_order(owners, nd, cols)
    pos = np.arange(len(ranked)) - bounds[owners[ranked]]
    return cols[ranked[pos < k]].astype(np.int32).reshape(m, k)


def _rank_owned(d: np.ndarray, rows: np.ndarray, owners: np.ndarray, cols: np.ndarray, k: int,
                out: np.ndarray) -> None:
    """``out[rows]``: each row's ``k`` nearest among its candidates ``cols[owners == i]`` (pairs sorted
    by owner, the index into ``rows``), ranked exactly (:func:`_rank_exactly`), 1,024 rows at a time."""
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=len(rows)))])
    for a in range(0, len(rows), 1024):
        b = min(len(rows), a + 1024)
        lo, hi = bounds[a], bounds[b]
        out[rows[a:b]] = _rank_exactly(d, rows[a:b], owners[lo:hi] - a, cols[lo:hi], k)


def _lists_from_top(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, cols: np.ndarray | None,
                    vals: np.ndarray, idx: np.ndarray, margin: float, exhaustive: bool | np.ndarray = True) -> None:
    """``out[rows]`` from each row's kept float32 top (``vals``/``idx``, over ``cols``): every
    column within ``margin`` of the row's k-th float32 score is scored in float64 and ranked.
    ``exhaustive`` (one for all rows, or one per row) False (candidates of the k-NN graph method):
    the kept ones only, a row whose kept list is full up to the margin is not scanned again."""
    kk = vals.shape[1]
    available = (d.shape[0] if cols is None else len(cols)) - 1
    lows = vals[:, k - 1] - np.float32(margin)
    within = vals >= lows[:, None]
    full = within[:, -1] & (kk < available) & exhaustive  # the kept list may end before the margin does
    within[full] = False
    owners = np.repeat(np.arange(len(rows)), within.sum(axis=1))
    found = idx[within].astype(np.int64)
    if full.any():
        fo, fc = _scan_above(d, rows[full], lows[full], cols)
        owners = np.concatenate([owners, np.flatnonzero(full)[fo]])
        found = np.concatenate([found, fc])
        srt = np.argsort(owners, kind="stable")
        owners, found = owners[srt], found[srt]
    _rank_owned(d, rows, owners, found, k, out)


def _kept(k: int, available: int) -> int:
    """How many float32 scores to keep per row for ``k`` neighbours (a few more than ``k``)."""
    return min(available, k + max(8, k // 4))


def neighbour_lists(descriptors: np.ndarray, k: int, ann: AnnIndex | None = None, *,
                    knn: KnnParams | None = None) -> Generator[Progress, None, np.ndarray]:
    """(N, min(k, N - 1)) int32: row ``i`` = the ``k`` nearest *other* references of ``i``, best first.

    The order is exactly that of ICFRR's gallery ranks: ``-D = neg_distance(float32(float64
    dot))``, self excluded, ties by lower row, so ``lists[:, :kg]`` are the references at
    ranks 1..kg of the dense gallery ranks (also with duplicate descriptors and float16 input).

    Without ``ann``: exact, O(N^2 D) time but no N x N matrix. A float32 pass keeps each row's
    ``k + extra`` best scores (blocks of rows against blocks of rows, each product serving both
    blocks); every reference within a proven rounding margin of the row's k-th float32 score is a
    candidate (a row whose kept list is full up to the margin is scanned again), and the
    candidates are scored again in float64 and ranked.

    With ``ann`` (an index too large for that; only its size is checked): the candidates come from
    a k-NN graph method, :func:`._knn.knn_candidates` (balanced cells, each row against the members
    of its ``knn.probes`` nearest cells and the rows probing its own, by dense float32 products), and
    are ranked with the same exact arithmetic and tie rule. Wherever a row's kept candidates hold
    its true nearest neighbours its list is the exact one; what the cells miss is the only
    approximation (measured by ``bench/bench_knn.py``). A row whose cells held fewer than ``k``
    others is done exactly against every row.
    Progress stage: "finding each reference's nearest neighbours".
    """
    d = _check_descriptors(descriptors)
    n = d.shape[0]
    k = max(0, min(int(k), n - 1))
    start = time.perf_counter()
    if k == 0:
        yield Progress(n, n, stage=NEIGHBOURS_STAGE)
        return np.empty((n, 0), dtype=np.int32)
    if ann is not None and ann.ntotal != n:
        raise MuseumSearchError(f"the approximate index holds {ann.ntotal:,} references, the descriptors "
                                f"{n:,}: rebuild the index")
    yield Progress(0, n, stage=NEIGHBOURS_STAGE)
    out = np.empty((n, k), dtype=np.int32)
    margin = _float32_margin(d)
    if ann is None:
        vals, idx = yield from _exact_top_all(d, _kept(k, n - 1), start)
        rows = np.arange(n)
        for a in range(0, n, 16_384):
            b = min(n, a + 16_384)
            _lists_from_top(d, k, out, rows[a:b], None, vals[a:b], idx[a:b], margin)
            yield Progress(int(n * 0.95 + 0.05 * b), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
        return out
    yield from _approximate_lists(d, k, out, np.arange(n), margin, knn, start)
    return out


def _approximate_lists(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, margin: float,
                       knn: KnnParams | None, start: float) -> Generator[Progress, None, None]:
    """``out[rows]`` (every row) from :func:`._knn.knn_candidates`, ranked exactly."""
    n = d.shape[0]
    kk = _kept(k, n - 1)
    vals, idx = yield from knn_candidates(d, kk, knn, stage=NEIGHBOURS_STAGE, share=0.9, gather=_gather)
    few = ~np.isfinite(vals[:, k - 1])  # cells holding fewer than k others: done exactly
    ok = np.flatnonzero(~few)
    # rows whose kept candidates are all within the margin of their k-th (many equal references):
    # scanned again against every row as the exact path does, when there are few of them
    full = np.zeros(n, dtype=bool)
    full[ok] = vals[ok, -1] >= vals[ok, k - 1] - np.float32(margin)
    if full.sum() > _BLOCK_ROWS:
        full[:] = False
    for a in range(0, len(ok), 16_384):
        rr = ok[a:a + 16_384]
        _lists_from_top(d, k, out, rr, None, vals[rr], idx[rr], margin, exhaustive=full[rr])
        yield Progress(int(n * (0.9 + 0.1 * (a + len(rr)) / n)), n, stage=NEIGHBOURS_STAGE,
                       elapsed=time.perf_counter() - start)
    whole = np.flatnonzero(few)
    for a in range(0, len(whole), _BLOCK_ROWS):
        rr = whole[a:a + _BLOCK_ROWS]
        v, i = _top_over(d, rr, None, kk)
        _lists_from_top(d, k, out, rr, None, v, i, margin)
        yield Progress(n, n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# Updating the neighbour lists after an update of the index
# --------------------------------------------------------------------------------------------

#: Past this share of rows to compute again, an update computes every list from scratch (the
#: symmetric pass of :func:`neighbour_lists` halves the work of scoring rows one way).
_RECOMPUTE_SHARE = 0.5
#: A kept row with more new candidates than this is computed again instead of merged.
_MERGE_CAP = 256
#: Candidate (row, new reference) pairs held at once while merging (beyond it, the rows holding
#: them are computed again): bounds the memory of an update that adds many similar references.
_PAIRS_MAX = 1 << 23


def _new_candidates(d: np.ndarray, x: np.ndarray, last: np.ndarray | None, short: bool, new_r2: float,
                    s: np.ndarray, owners: np.ndarray, new_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (owner, new reference) pairs that may enter kept rows' lists.

    ``x``: the kept rows (float32), ``owners`` their positions; ``last``: each one's k-th neighbour
    (its row); ``s``: (rows, new) their float32 scores with the new references ``new_ids`` (of
    squared norms at most ``new_r2``). A new reference is a candidate when its score is within the
    rounding margin of the row's k-th neighbour's (any one below cannot beat it exactly); with
    ``short`` lists (every other old reference, fewer than k) every new reference is one."""
    if short:
        o, j = np.nonzero(np.ones(s.shape, dtype=bool))
    else:
        assert last is not None  # given unless short
        uniq, inv = np.unique(last, return_inverse=True)
        g = _gather(d, uniq)
        thr = np.einsum("ij,ij->i", x, g[inv])
        r2 = np.maximum(np.maximum(_norms2(x), _norms2(g)[inv]), new_r2)
        low = thr - _margin(r2, d.shape[1])
        o, j = np.nonzero(s >= low[:, None])
    return owners[o], new_ids[j]


class _Pairs:
    """Candidate (kept position, new row) pairs, with the kept rows that got too many (``over``)."""

    def __init__(self, kept: int):
        self.counts = np.zeros(kept, dtype=np.int64)
        self.over = np.zeros(kept, dtype=bool)
        self.o: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.held = 0

    def add(self, o: np.ndarray, c: np.ndarray) -> None:
        if not len(o):
            return
        rows, counts = np.unique(o, return_counts=True)
        self.counts[rows] += counts
        self.over[rows] |= self.counts[rows] > _MERGE_CAP
        self.o.append(o)
        self.c.append(c)
        self.held += len(o)
        if self.held > _PAIRS_MAX:  # compute the rows holding the most pairs again instead
            o, c = self.arrays()
            busiest = self.counts > max(1, int(np.quantile(self.counts[self.counts > 0], 0.5)))
            self.over |= busiest if busiest.any() else self.counts > 0
            keep = ~self.over[o]
            self.o, self.c, self.held = [o[keep]], [c[keep]], int(keep.sum())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.o:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        o, c = np.concatenate(self.o), np.concatenate(self.c)
        keep = ~self.over[o]
        return o[keep], c[keep]


def _merge_lists(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, lists: np.ndarray,
                 po: np.ndarray, pc: np.ndarray) -> None:
    """``out[rows[i]]``: the exact top ``k`` of row ``rows[i]``'s list ``lists[i]`` (the top of the
    kept references, renumbered) and its new candidates ``pc[po == i]`` (:func:`_rank_exactly`)."""
    if not len(rows):
        return
    touched = np.unique(po)
    plain = np.ones(len(rows), dtype=bool)
    plain[touched] = False
    if plain.any():
        if lists.shape[1] != k:
            raise AssertionError("a short list without new candidates")
        out[rows[plain]] = lists[plain]
    if not len(touched):
        return
    w = lists.shape[1]
    owners = np.concatenate([np.repeat(np.arange(len(touched)), w), np.searchsorted(touched, po)])
    cols = np.concatenate([lists[touched].ravel(), pc]).astype(np.int64)
    srt = np.argsort(owners, kind="stable")
    owners, cols = owners[srt], cols[srt]
    _rank_owned(d, rows[touched], owners, cols, k, out)


def update_neighbour_lists(old_lists: np.ndarray, old_to_new: np.ndarray, descriptors: np.ndarray, k: int,
                           ann: AnnIndex | None = None, old_ann: AnnIndex | None = None, *,
                           knn: KnnParams | None = None) -> Generator[Progress, None, np.ndarray]:
    """The lists of :func:`neighbour_lists` after an update, recomputing only the rows that can
    change; a progress generator (stage "finding each reference's nearest neighbours"), closing it
    cancels (nothing is changed).

    ``old_lists``: (N_old, K_old) the lists before the update (old rows); ``old_to_new``: each old
    reference's row in ``descriptors``, -1 if removed (kept references keep their order; the other
    rows of ``descriptors`` are the new references, usually appended); ``descriptors``: (N, D) after
    the update; ``k``: neighbours per row (at most N - 1). ``old_lists`` must have been computed by
    :func:`neighbour_lists` (exactly, or with ``old_ann``) with ``K_old >= min(k, N - 1)``, or hold
    every other old reference (``K_old = N_old - 1``); else ValueError.

    * A kept row whose list (its first ``k``) holds no removed reference keeps it, renumbered: it is
      the top of the kept references. Any new reference may enter it: the kept rows are
      scored (float32) against the new ones, those within the proven rounding margin of the row's
      k-th neighbour are candidates, and the list with its candidates is ranked exactly (float64
      dot products, ties by lower row), as :func:`neighbour_lists` ranks its own candidates.
    * A kept row that lost a removed reference, and every new row, is computed again exactly
      against every row (float32 top, then the exact ranking); all of them in one pass over the
      descriptors, which also scores the kept rows against the new ones.
    * When more than half the rows would be computed again, every list is computed from scratch
      (with ``ann``: also when more than :data:`_APPROX_REDO_MAX` would, each costing a pass over
      every row).

    Without ``ann`` the result is identical, bit for bit and in its ties, to
    ``neighbour_lists(descriptors, k)``. It reads the descriptors once (plus one float32 dot per
    kept row for its k-th neighbour's score) instead of scoring N^2 / 2 pairs.

    With ``ann`` (the approximate index after the update, :meth:`AnnIndex.updated` of ``old_ann``;
    only the sizes are checked) the old lists are approximate (:func:`neighbour_lists` with an
    index: the k-NN graph method), and the update is the same pass: the rows computed again and the
    new ones get their exact lists, and a kept row gets every new reference that belongs in its
    list; a kept list keeps what its old one missed. So the result is at least as close to the exact
    lists as the old ones were (not equal to what a rebuild's k-NN graph would give: it misses other
    neighbours). 1,000 new references in a 1M index: one pass over the 1M rows (``bench_knn.py``).
    """
    d = _check_descriptors(descriptors)
    n, dim = d.shape
    old = np.asarray(old_lists)
    m = _check_map(old_to_new, len(old), n)
    if old.ndim != 2:
        raise ValueError(f"old_lists must be (N_old, K_old), got shape {old.shape}")
    if (ann is None) != (old_ann is None):
        raise ValueError("give both the updated approximate index and the old one, or neither")
    n_old, k_old = old.shape
    k = max(0, min(int(k), n - 1))
    start = time.perf_counter()
    if k == 0:
        yield Progress(n, n, stage=NEIGHBOURS_STAGE)
        return np.empty((n, 0), dtype=np.int32)
    short = k_old < k
    if short and k_old < n_old - 1:
        raise ValueError(f"the old lists hold {k_old} neighbours, fewer than the {k} asked for: compute them again")
    if old.size and (old.min() < 0 or old.max() >= n_old):
        raise ValueError("the old lists hold rows outside the old index")
    if ann is not None and ann.ntotal != n:
        raise MuseumSearchError(f"the approximate index holds {ann.ntotal:,} references, the descriptors "
                                f"{n:,}: rebuild the index")
    if old_ann is not None and old_ann.ntotal != n_old:
        raise ValueError(f"the old approximate index holds {old_ann.ntotal:,} references, the old lists {n_old:,}")
    yield Progress(0, n, stage=NEIGHBOURS_STAGE)
    kept_old = np.flatnonzero(m >= 0)
    kept = m[kept_old]
    is_new = np.ones(n, dtype=bool)
    is_new[kept] = False
    new_rows = np.flatnonzero(is_new)
    w = min(k_old, k)
    lists = m[np.asarray(old[kept_old, :w], dtype=np.int64)]  # the kept rows' lists, renumbered (-1: removed)
    redo = (lists < 0).any(axis=1)
    out = np.empty((n, k), dtype=np.int32)
    if len(new_rows) + int(redo.sum()) > _redo_max(n, ann):
        return (yield from neighbour_lists(d, k, ann=ann, knn=knn))
    return (yield from _update_exact(d, k, out, kept, lists, redo, new_rows, short, start, ann, knn))


#: With an approximate index, past this many rows to compute again (each against every row) an
#: update computes every list from scratch with the k-NN graph method instead.
_APPROX_REDO_MAX = 2 * _BLOCK_ROWS


def _redo_max(n: int, ann: AnnIndex | None) -> float:
    """How many rows an update may compute again before computing every list from scratch."""
    return _RECOMPUTE_SHARE * n if ann is None else min(_RECOMPUTE_SHARE * n, _APPROX_REDO_MAX)


def _update_exact(d, k, out, kept, lists, redo, new_rows, short, start, ann=None, knn=None):
    """:func:`update_neighbour_lists`: one fused pass (the new rows and the rows computed again
    against every row, the kept rows against the new ones)."""
    n, dim = d.shape
    keep_rows, keep_lists = kept[~redo], lists[~redo]
    keep_at = np.full(n, -1, dtype=np.int64)
    keep_at[keep_rows] = np.arange(len(keep_rows))
    redo_rows = np.union1d(kept[redo], new_rows)  # sorted
    kk = _kept(k, n - 1)
    vals = np.full((len(redo_rows), kk), -np.inf, dtype=np.float32)
    idx = np.full((len(redo_rows), kk), -1, dtype=np.int32)
    new_r2 = float(_norms2(_gather(d, new_rows)).max(initial=0.0)) if len(new_rows) else 0.0
    pairs = _Pairs(len(keep_rows))
    r2 = 0.0
    bs = _BLOCK_ROWS
    blocks = list(range(0, len(redo_rows), bs))
    steps = max(1, len(blocks) * -(-n // min(bs, _chunk_rows(dim))))
    step = 0
    for bi, a in enumerate(blocks):
        rr = redo_rows[a:a + bs]
        x = _gather(d, rr)
        new_pos = np.flatnonzero(np.isin(rr, new_rows))
        for c0, c in _column_chunks(d, None):
            s = x @ c.T  # (block rows, chunk rows)
            if bi == 0:
                r2 = max(r2, float(_norms2(c).max(initial=0.0)))
            if len(new_pos):  # the kept rows of this chunk against the new rows of this block
                kp = keep_at[c0:c0 + len(c)]
                sel = np.flatnonzero(kp >= 0)
                if len(sel):
                    last = None if short else keep_lists[kp[sel], k - 1]
                    o, j = _new_candidates(d, c[sel], last, short, new_r2, s[new_pos][:, sel].T, kp[sel],
                                           rr[new_pos])
                    pairs.add(o, j)
            _mask_self(s, rr, c0)
            merge_top(vals[a:a + bs], idx[a:a + bs], s, c0)
            step += 1
            yield Progress(int(0.9 * n * step / steps), n, stage=NEIGHBOURS_STAGE,
                           elapsed=time.perf_counter() - start)
    margin = float(_margin(r2, dim))
    for a in range(0, len(redo_rows), 16_384):
        b = min(len(redo_rows), a + 16_384)
        _lists_from_top(d, k, out, redo_rows[a:b], None, vals[a:b], idx[a:b], margin)
    yield Progress(int(0.92 * n), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    over = np.flatnonzero(pairs.over)
    if len(over) > _redo_max(n, ann):  # pragma: no cover - many new references like many kept ones
        return (yield from neighbour_lists(d, k, ann=ann, knn=knn))
    if len(over):  # kept rows with too many new candidates: computed again
        if not len(blocks):  # pragma: no cover - there are new rows, so there was a pass
            margin = _float32_margin(d)
        rows = keep_rows[over]
        for a in range(0, len(rows), bs):
            v, i = _top_over(d, rows[a:a + bs], None, kk)
            _lists_from_top(d, k, out, rows[a:a + bs], None, v, i, margin)
            yield Progress(int(0.92 * n), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    po, pc = pairs.arrays()
    ok = ~pairs.over
    pos = np.flatnonzero(ok)
    remap = np.full(len(keep_rows), -1, dtype=np.int64)
    remap[pos] = np.arange(len(pos))
    _merge_lists(d, k, out, keep_rows[pos], keep_lists[pos], remap[po], pc)
    yield Progress(n, n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    return out
