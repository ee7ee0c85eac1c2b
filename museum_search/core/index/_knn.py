"""Candidates for each reference's nearest neighbours in a large index: balanced cells, each row
compared with the members of its ``probes`` nearest cells by dense matrix products.

The neighbour lists of an index too large for an O(N^2) pass (:func:`._neighbours.neighbour_lists` with an
approximate index) need, for every row, a candidate set that holds its true nearest neighbours;
:mod:`._neighbours` then ranks the candidates exactly. This module finds them:

1. **Cells.** Spherical k-means (dot products with unit centroids) on a seeded sample of
   ``train_per_cell`` rows per cell; a cell that holds more than ``2 x train_per_cell`` sample rows
   is split by k-means of its own sample rows, so the cells stay balanced (k-means on data grouped
   in themes makes a few cells thousands of times larger than the median: those would be scanned
   by every row probing them). ``C = sqrt(probes x N)`` cells balance the two costs below.
2. **Probes.** Every row's ``probes`` best cells (dot product with the centroid): one (N, C) pass
   of matrix products, a chunk of rows at a time. Its best cell holds it.
3. **Scan.** For each cell, the rows probing it (gathered, converted to float32) against its members:
   one dense product, merged into each row's kept top (:func:`.ranking.merge_top`). A pair of rows is
   scored at most once, so the lists hold no duplicates.

Cost: ``N x D x 2 x (C + probes x N / C)`` flops (2e13 at 1M x 1280 with 16 probes), all in BLAS,
memory: the (N, probes) cells and the (N, kk) kept top, no copy of the descriptors. Pure numpy (no
faiss): the kiosk build computes them too.

Recall is measured, not proven: ``bench/bench_knn.py`` (recall@32 against exact, and the share of
each object's other views found, on data grouped in themes and on objects with random centres; at
100,000: 0.9996 / 1.000 and 0.48 / 0.993, where the old IVF regions found 0.977 / 0.991 and
0.33 / 0.73; at 1M themes a sample of 500 rows was exact). On random object centres only the 9
other views are real neighbours; the rest of the 32 are near ties at cosine ~0, hence recall@32 0.48.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np

from museum_search.core.progress import Progress
from museum_search.core.ranking import merge_top

__all__ = ["KnnParams", "knn_candidates"]

# float32 elements converted at once (64 MB)
_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class KnnParams:
    """How :func:`knn_candidates` partitions and scans (measured by ``bench/bench_knn.py``)."""

    probes: int = 16  #: cells each row is compared with (its own first)
    train_per_cell: int = 24  #: sample rows per cell for k-means
    iterations: int = 5  #: k-means iterations
    seed: int = 0

    def cells(self, n: int) -> int:
        """The number of cells for ``n`` rows: ``sqrt(probes x n)`` (each row scans about as many
        rows as there are centroids), at least ``probes``, at most ``n // 4``."""
        return int(max(1, min(max(self.probes, round(math.sqrt(self.probes * n))), n // 4)))


def _rows(d: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``d[rows]`` (sorted rows) as float32."""
    return np.asarray(d[rows], dtype=np.float32)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1)


def _best(x: np.ndarray, cent: np.ndarray) -> np.ndarray:
    """Each row's best centroid (highest dot product), a chunk at a time."""
    out = np.empty(len(x), dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // max(1, len(cent)))
    for a in range(0, len(x), step):
        out[a:a + step] = np.argmax(x[a:a + step] @ cent.T, axis=1)
    return out


def _kmeans(x: np.ndarray, c: int, iterations: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means of the float32 rows ``x`` into ``c`` unit centroids: (centroids, assignment).
    An empty cell takes a random row as its centroid."""
    from scipy import sparse  # here: the app's window imports core (neighbours → knn) before it shows

    c = max(1, min(c, len(x)))
    cent = _unit_rows(x[np.sort(rng.choice(len(x), c, replace=False))].copy())
    assign = _best(x, cent)
    for _ in range(iterations):
        counts = np.bincount(assign, minlength=c)
        sums = np.asarray(sparse.csr_matrix((np.ones(len(x), np.float32), (assign, np.arange(len(x)))),
                                            shape=(c, len(x))) @ x)
        empty = np.flatnonzero(counts == 0)
        sums[empty] = x[rng.choice(len(x), len(empty), replace=len(empty) > len(x))]
        cent = _unit_rows(sums)
        assign = _best(x, cent)
    return cent, assign


def _centroids(d: np.ndarray, c: int, params: KnnParams, rows_of=_rows) -> np.ndarray:
    """(C', D) unit centroids: k-means on a sample of ``d``, the too-large cells split."""
    n = d.shape[0]
    rng = np.random.default_rng(params.seed)
    t = int(min(n, c * params.train_per_cell))
    sample = np.sort(rng.choice(n, t, replace=False)) if t < n else np.arange(n)
    x = np.empty((t, d.shape[1]), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // max(1, d.shape[1]))
    for a in range(0, t, step):
        x[a:a + step] = rows_of(d, sample[a:a + step])
    cent, assign = _kmeans(x, c, params.iterations, rng)
    cap = 2 * params.train_per_cell
    counts = np.bincount(assign, minlength=len(cent))
    parts = [cent[counts <= cap]]
    for big in np.flatnonzero(counts > cap):  # split by k-means of their own rows
        own = x[assign == big]
        sub, _ = _kmeans(own, -(-len(own) // params.train_per_cell), params.iterations, rng)
        parts.append(sub)
    return np.ascontiguousarray(np.concatenate(parts))


def knn_candidates(descriptors: np.ndarray, kk: int, params: KnnParams | None = None, *,
                   stage: str = "", share: float = 1.0, gather: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
                   ) -> Generator[Progress, None, tuple[np.ndarray, np.ndarray]]:
    """Each row's ``kk`` best float32 dot products among the members of its ``params.probes``
    nearest cells and the rows probing its own cell, itself excluded: ``(vals (N, kk) float32
    descending, idx (N, kk) int32)``, ``-inf`` / ``-1`` where fewer were scanned. A progress
    generator (``stage``, out of N rows; it reaches ``share`` x N, the scan from 20 % of it).
    ``gather(d, sorted_rows)``: those rows as float32 (default: numpy's conversion)."""
    params = params or KnnParams()
    rows_of = gather or _rows
    d = descriptors
    n, dim = d.shape
    start = time.perf_counter()

    def beat(done: float) -> Progress:
        return Progress(int(done * share * n), n, stage=stage, elapsed=time.perf_counter() - start)

    kk = max(1, int(kk))
    yield beat(0)
    cent = _centroids(d, params.cells(n), params, rows_of)
    c = len(cent)
    p = max(1, min(int(params.probes), c))
    yield beat(0.1)
    probes = np.empty((n, p), dtype=np.int32)
    step = max(1, _CHUNK_ELEMENTS // max(dim, c))
    for a in range(0, n, step):
        s = rows_of(d, np.arange(a, min(n, a + step))) @ cent.T
        top = np.argpartition(-s, p - 1, axis=1)[:, :p] if p < c else np.broadcast_to(np.arange(c), s.shape)
        best = np.take_along_axis(s, top, axis=1)
        probes[a:a + step] = np.take_along_axis(top, np.argsort(-best, axis=1, kind="stable"), axis=1)
        yield beat(0.1 + 0.1 * min(n, a + step) / n)
    own = probes[:, 0].astype(np.int64)
    members_order = np.argsort(own, kind="stable")  # rows by their cell, in row order within it
    member_bounds = np.searchsorted(own[members_order], np.arange(c + 1))
    flat = probes.ravel().astype(np.int64)
    probing_order = np.argsort(flat, kind="stable") // p  # rows probing each cell, in row order
    probing_bounds = np.searchsorted(np.sort(flat), np.arange(c + 1))
    del flat
    vals = np.full((n, kk), -np.inf, dtype=np.float32)
    idx = np.full((n, kk), -1, dtype=np.int32)
    done = 0
    for cell in range(c):
        cols = members_order[member_bounds[cell]:member_bounds[cell + 1]]
        rows = probing_order[probing_bounds[cell]:probing_bounds[cell + 1]]
        if not len(cols) or not len(rows):
            continue
        xc = rows_of(d, cols)
        probed = np.zeros((len(cols), c), dtype=bool)  # the cells each member probes
        probed[np.arange(len(cols))[:, None], probes[cols]] = True
        block = max(1, _CHUNK_ELEMENTS // max(dim, len(cols)))
        for a in range(0, len(rows), block):
            rr = rows[a:a + block]
            s = rows_of(d, rr) @ xc.T
            pos = np.searchsorted(cols, rr)  # the row itself among the columns: -inf
            hit = pos < len(cols)
            hit[hit] = cols[pos[hit]] == rr[hit]
            s[np.flatnonzero(hit), pos[hit]] = -np.inf
            v, i = vals[rr], idx[rr]
            merge_top(v, i, s, cols)
            vals[rr], idx[rr] = v, i
            # the other way: a member gets the probing row, unless it probes that row's cell
            # itself (then it scores the pair on its own: no pair twice in a list)
            back = s.T.copy()
            back[probed[:, own[rr]]] = -np.inf
            v, i = vals[cols], idx[cols]
            merge_top(v, i, back, rr)
            vals[cols], idx[cols] = v, i
        done += len(rows)
        yield beat(0.2 + 0.8 * done / (n * p))
    return vals, idx
