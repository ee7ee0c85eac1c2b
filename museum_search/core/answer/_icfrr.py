"""ICFRR: Iterative Cluster-free Re-ranking (Hudson et al., spec ``003``, section 3.2).

Re-ranking reads *gallery-gallery ranks* ``r[i, j]`` (the 1-based position of reference ``j`` in the
ranking of the gallery against reference ``i``) and iterates the score update of Eq. 3-6::

    s(0)     = -D(q, x_i)                                            (Eq. 4)
    alpha[r] = 1 - (r - 1) / (G - 1)   if r <= K_g   else 0          (Eq. 5)
    Delta_i  = 1/K_q * sum_{p=1..K_q} alpha[ r[I_p, i] ]             (Eq. 6)
    s(t+1)   = s(t) + beta * Delta(t)                                 (Eq. 3)

until the ranking of the gallery against the query no longer changes, or ``max_iter`` updates.

Conventions of this module
--------------------------
* **Input** of :func:`icfrr` is the ``(Q, G)`` matrix of query-reference *dot products* (what
  ``search.score_matrix`` produces), converted inside to ``s(0) = -D = -sqrt(max(0, 2 - 2 dot))``
  (Eq. 4). Scores outside [-1, 1] (beyond rounding) are refused rather than clamped: re-rank
  with ICFRR before re-rankers that change the score scale, or pass ``scores_are="neg_distance"``
  to use the given scores (e.g. ``-D``) as ``s(0)`` directly.
* **Output** scores are the final ``s`` (float32, higher is better). They are *not* dot products:
  ``s(0)`` lies in ``[-2, 0]`` and every update adds ``beta * Delta`` with ``Delta`` in ``[0, 1]``.
  Rank them as everything else in the project: by descending score, ties by reference index
  (:func:`museum_search.core.ranking.order`).
* **Ties** are always broken by reference index (lower first), in the query ranking and in the
  gallery ranks, so results are deterministic.
* **Gallery ranks** ``r[i, j]`` rank the gallery against reference ``i`` by ``-D`` (ties by
  index), with the paper's ``r[i, i] = inf`` (self-matches excluded, section 3.2). Self is
  excluded explicitly, never assumed to be the nearest neighbour: museum collections hold
  near-duplicates, and an identical copy with a lower index ties with the image itself.
* **Neighbour lists** stand for the ranks: ICFRR only reads the ranks ``r <= K_g``, i.e. each
  reference's ``K_g`` nearest other references. A ``(G, K_max)`` array of them (best first,
  :func:`museum_search.core.index._neighbours.neighbour_lists`; the index stores it) gives the
  :class:`ICFRRGraph` of every ``K_g <= K_max`` (:func:`graph_from_neighbours`), never a (G, G)
  matrix. (The dense (G, G) ranks are the tests' oracle, ``tests/oracles.py``.)
* **Unscored references**: ``-inf`` in the query scores (an approximate search scored a
  shortlist only); ICFRR re-ranks the scored ones and leaves the others at ``-inf`` (see
  :func:`icfrr`).

Decisions (paper equation numbers)
----------------------------------
* Eq. 5: ``alpha[r] = 1 - (r-1)/(G-1)`` for ``r <= K_g``, normalized by ``G - 1`` (the number
  of other references, so the rank-1 neighbour gets 1), not by ``K_g`` -- as printed, and as
  in the public code (``linspace(1, 0, G)``). ``K_g`` is capped at ``G - 1``.
* Eq. 6: ``Delta_i = 1/K_q * sum_{p <= K_q} alpha[r(I_p, i)]``, a mean over the current
  ``K_q`` best references ``I_p`` of the ranking by ``s(t)`` (ties by index). A top reference
  does not vote for itself: ``r(I_p, I_p) = inf`` gives ``alpha = 0`` ("we set r_{i,i} =
  inf"). ``K_q`` is capped at ``G`` and the mean divides by the capped value.
* Eq. 3: ``s(t+1) = s(t) + beta Delta(t)`` (``mode="paper"``), or the public code's position
  rule (``mode="reference"``): ``s(t+1)[I_j(t)] = s(0)_(j) + beta Delta(t)[I_j(t)]`` with
  ``s(0)_(j)`` the j-th best initial score. Identical after one update.
* Stopping: after each update the full ranking is compared with the previous one; a query
  stops when it is unchanged ("until convergence (i.e. ranks no longer change)"), or after
  ``max_iter`` updates. In reference mode an unchanged ranking is a fixed point; in paper
  mode it is not (the same Delta would be added again), so the stopping rule matters there.
  The returned scores include the last update, which did not change the ranking.

Reranker protocol (shared with :mod:`.expansion`)
-------------------------------------------------
Every reranker class has a ``name`` and one method::

    rerank(scores, *, descriptors=None, labels=None, query_descriptors=None,
           **context) -> np.ndarray

``scores`` is the ``(Q, G)`` matrix of query-reference dot products, ``descriptors`` the ``(G, D)``
gallery as indexed (not DBA-augmented: ``DBAReranker`` augments it, or takes the cached result as
``dba_gallery=``), ``labels`` the ``G`` instance ids of the gallery, and ``query_descriptors``
the ``(Q, D)`` queries. ICFRR takes ``graph=`` (a prepared :class:`ICFRRGraph`, what the pipeline
passes) or ``neighbours=`` (neighbour lists). Keywords that a reranker does not use are accepted
and ignored (``**context``), so the same call works for every reranker. The result is a
``(Q, G)`` float32 matrix, higher is better, ranked with ties by reference index.

Differences from the public code (github.com/finlay-hudson/ICFRR, ``src/rerank.py``)
------------------------------------------------------------------------------------------
* From the second iteration on the public code adds ``beta * Delta`` to the *initial score of the
  position* (the item now at position ``j`` gets the ``j``-th best initial score), so Delta does
  not accumulate. The paper's Eq. 3 keeps the base score with the item. ``mode="paper"`` (default)
  follows Eq. 3, ``mode="reference"`` the public code; both agree after one iteration
  (spec README).
* The public code assumes every image is its own nearest neighbour (``argsort().argsort() - 1``);
  here the diagonal is masked explicitly (see above).
* The public code runs a fixed number of iterations (``--n_times 5``); here iteration stops when
  the ranking is stable, as section 3.2 says ("until convergence (i.e. ranks no longer change)"),
  unless ``stop_when_stable=False``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from museum_search.core.ranking import neg_distance, order, reorder

__all__ = [
    "ICFRRGraph",
    "ICFRRParams",
    "ICFRRReranker",
    "ICFRRResult",
    "graph_from_neighbours",
    "icfrr",
    "suggest_params",
]

log = logging.getLogger(__name__)

Mode = Literal["paper", "reference"]

# Elements (rows x columns) handled at once by the chunked loops, to bound temporary memory
# whatever G is: gallery-rank rows need about 40 bytes per element (4M elements: ~160 MB),
# ICFRR query rows about 100 bytes per query-reference pair (2M pairs: ~200 MB).
_CHUNK_ELEMENTS = 1 << 22
_QUERY_CHUNK_ELEMENTS = 1 << 21
_DOT_SLACK = 1e-3  # rounding tolerance of dot products of unit vectors beyond [-1, 1]


# --------------------------------------------------------------------------------------------
# The rank-based update (Eq. 3, 5, 6)
# --------------------------------------------------------------------------------------------


@dataclass
class ICFRRParams:
    """Hyper-parameters of ICFRR (section 3.2).

    ``k_q``: number of current top references that vote (Eq. 6). ``k_g``: gallery-gallery rank
    cut-off (Eq. 5). ``beta``: weight of the update (Eq. 3); the paper uses 0.5 in all
    experiments. ``max_iter``: maximum number of updates; 5 is the public code's default
    (``--n_times``), the paper's supplementary material reports 10 for Sketchy.
    ``stop_when_stable``: stop a query as soon as an update leaves its ranking unchanged
    ("until convergence (i.e. ranks no longer change)"); False runs exactly ``max_iter`` updates.
    ``mode``: ``"paper"`` (Eq. 3, default) or ``"reference"`` (public code, see module doc).
    """

    k_q: int
    k_g: int
    beta: float = 0.5
    max_iter: int = 5
    mode: Mode = "paper"
    stop_when_stable: bool = True

    def __post_init__(self) -> None:
        if int(self.k_q) < 1 or int(self.k_g) < 1:
            raise ValueError(f"k_q and k_g must be at least 1 (got {self.k_q}, {self.k_g})")
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0 (got {self.beta})")
        if int(self.max_iter) < 0:
            raise ValueError(f"max_iter must be >= 0 (got {self.max_iter})")
        if self.mode not in ("paper", "reference"):
            raise ValueError(f"mode must be 'paper' or 'reference' (got {self.mode!r})")
        self.k_q, self.k_g, self.max_iter = int(self.k_q), int(self.k_g), int(self.max_iter)


@dataclass
class ICFRRResult:
    """``scores``: (Q, G) float32 final ``s`` (higher is better; not dot products).
    ``iterations``: (Q,) number of updates (Eq. 3) applied to each query.
    ``converged``: (Q,) True when the last update left the query's ranking unchanged."""

    scores: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


# Cost model of the two ways of computing the Delta sums (seconds, rough, 2-core AVX2/AVX-512):
# a dense float32 GEMM (indicator @ W, W the dense (G, G) weights) costs about 2 n G^2 / 8e10,
# the sparse product about 5 ns per (vote, neighbour) pair. The cheaper one is used. Dense GEMMs
# also carry a fixed cost (BLAS threads start and synchronize: milliseconds on a busy machine),
# so small products always go the sparse way.
_DENSE_FLOPS = 8e10
_DENSE_OVERHEAD_SECONDS = 2e-3
_SPARSE_PAIR_SECONDS = 5e-9
_DENSE_MAX_BYTES = 1 << 28  # dense weights are used only up to 256 MB (G <= 8192)
_GATHER_MAX_PAIRS = 1 << 20  # up to this many (vote, neighbour) pairs, sums by gather + bincount


@dataclass(frozen=True, eq=False)
class ICFRRGraph:
    """Gallery ranks prepared for ICFRR with a given ``k_g`` (reusable across query batches).

    ``weights`` is a sparse (G, G) matrix with ``weights[j, i] = G - r[j, i]`` where
    ``r[j, i] <= k_g`` and 0 elsewhere (self included: ``r[j, j] = inf``). Since
    ``alpha[r] = (G - r) / (G - 1)`` (Eq. 5), the update of Eq. 6 is
    ``Delta = (top-K_q indicator @ weights) / (K_q (G - 1))``. The sums are sums of integers, exact
    whatever the summation order (float64, or float32 while below 2**24), so every code path
    (sparse, dense BLAS, chunked, per-query loop) gives bit-identical Deltas.
    Built by :func:`graph_from_neighbours` (from each reference's nearest neighbours: no (G, G)
    matrix anywhere); the same ``weights`` as from the dense ranks (tested). ``full_size``: the ``G`` of the weights, when this graph is the
    restriction of a larger gallery's graph to some of its references (:meth:`subgraph`;
    0: ``size``).
    Memory: ``G * min(k_g, G - 1)`` entries (12 bytes each), plus a dense float32 copy
    (``4 G^2`` bytes, built on first use) when dense products are faster (large k_g, small G).
    """

    size: int
    k_g: int
    weights: sp.csr_array
    full_size: int = 0
    _dense: dict = field(default_factory=dict, repr=False)

    @property
    def gallery_size(self) -> int:
        """``G`` of Eq. 5 (the whole gallery, also for a :meth:`subgraph`)."""
        return self.full_size or self.size

    def dense_weights(self) -> np.ndarray:
        w = self._dense.get("w")
        if w is None:
            w = self.weights.toarray().astype(np.float32)
            self._dense["w"] = w
        return w

    def product(self, x: np.ndarray, max_abs_row: int) -> np.ndarray:
        """``x @ weights`` as float64 for an (n, G) float32 ``x`` of small integers.

        ``max_abs_row`` bounds ``sum_i |x[r, i]|`` (exactness check of the float32 GEMM).
        """
        n, g = x.shape
        if n == 0:
            return np.zeros((0, g))
        dense_ok = (
            4 * g * g <= _DENSE_MAX_BYTES
            and max_abs_row * max(self.gallery_size - 1, 1) < (1 << 24)
        )
        r, c = np.nonzero(x)
        pairs = len(r) * self.k_g
        if dense_ok and _DENSE_OVERHEAD_SECONDS + 2.0 * n * g * g / _DENSE_FLOPS < pairs * _SPARSE_PAIR_SECONDS:
            return (x @ self.dense_weights()).astype(np.float64)
        if pairs > _GATHER_MAX_PAIRS:
            return (sp.csr_array(x.astype(np.float64)) @ self.weights).toarray()
        # Few votes (the usual case): gather the weight rows of the nonzero entries and add them up
        # with one bincount, without scipy's per-call overhead (~0.5 ms, the bulk of a small query).
        w = self.weights
        starts = w.indptr[c].astype(np.int64)
        counts = w.indptr[c + 1].astype(np.int64) - starts
        total = int(counts.sum())
        offsets = np.cumsum(counts) - counts
        flat = np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)
        vals = w.data[flat] * np.repeat(x[r, c].astype(np.float64), counts)
        keys = np.repeat(r.astype(np.int64) * g, counts) + w.indices[flat]
        return np.bincount(keys, weights=vals, minlength=n * g).reshape(n, g)

    def subgraph(self, rows: np.ndarray) -> "ICFRRGraph":
        """The weights among the references ``rows`` only (ascending, distinct): rows and columns
        ``rows`` of :attr:`weights`, renumbered 0..m-1, with the values of the whole gallery (its
        ranks and ``G``, kept as :attr:`gallery_size` for the normalizer of Eq. 5).

        Cost O(m k_g log m), nothing of size G: the rows are gathered, and their columns looked up
        in ``rows`` by binary search.
        """
        rows = np.asarray(rows, dtype=np.int64)
        m = len(rows)
        w = self.weights
        regular = self._dense.get("regular")
        if regular is None:  # every row holds exactly k_g entries (both builders): gather directly
            regular = bool(w.nnz == self.size * self.k_g and np.array_equal(
                w.indptr, np.arange(self.size + 1, dtype=np.int64) * self.k_g))
            self._dense["regular"] = regular
        if regular:
            cols = w.indices.reshape(self.size, self.k_g)[rows].ravel()
            vals = w.data.reshape(self.size, self.k_g)[rows].ravel()
            counts = np.full(m, self.k_g, dtype=np.int64)
        else:
            part = w[rows]
            cols, vals = part.indices, part.data
            counts = np.diff(part.indptr).astype(np.int64)
        pos = np.searchsorted(rows, cols)
        np.minimum(pos, max(m - 1, 0), out=pos)
        keep = rows[pos] == cols if m else np.zeros(len(cols), dtype=bool)
        row_of = np.repeat(np.arange(m), counts)
        indptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_of[keep], minlength=m), out=indptr[1:])
        sub = sp.csr_array((vals[keep], pos[keep].astype(np.int32), indptr), shape=(m, m))
        return ICFRRGraph(m, self.k_g, sub, self.gallery_size)


def graph_from_neighbours(neighbours: np.ndarray, k_g: int, size: int | None = None,
                          chunk: int | None = None) -> ICFRRGraph:
    """The :class:`ICFRRGraph` of ``k_g`` from each reference's nearest neighbours, no (G, G) matrix.

    ``neighbours``: (G, K_max) integers, row ``j`` = the references nearest to ``j`` (``j`` itself
    excluded), best first, with the arithmetic and tie rule of the gallery ranks (module doc): the
    reference at column ``p`` has rank ``r[j, neighbours[j, p]] = p + 1``. Only the first ``k_g``
    columns are read, so the weights (``G - r`` for ``r <= k_g``) are identical to
    the graph of the dense (G, G) ranks (tested against ``tests/oracles.py``). ``k_g`` is capped at ``G - 1``
    as there; a ``k_g`` beyond ``K_max`` is refused (ranks past ``K_max`` are unknown). ``size``:
    ``G``, checked against the rows. Cost O(G k_g log k_g), in row chunks (memory-mapped lists
    are read a chunk at a time); the lists are checked (in range, no self, no repeats).
    """
    nb = np.asarray(neighbours)  # a memmap stays one (read a chunk at a time below)
    if nb.ndim != 2:
        raise ValueError(f"neighbour lists must be a (G, K) matrix, got shape {nb.shape}")
    if nb.dtype.kind not in "iu":
        raise ValueError(f"neighbour lists must be integers, got {nb.dtype}")
    g = nb.shape[0]
    if size is not None and int(size) != g:
        raise ValueError(f"the neighbour lists have {g} rows, the gallery {int(size)} references")
    kg = max(0, min(int(k_g), g - 1))
    if kg > nb.shape[1]:
        raise ValueError(
            f"ICFRR with K_g = {kg} needs each reference's {kg} nearest neighbours, the neighbour lists "
            f"hold {nb.shape[1]}: compute them for K >= {kg} (or lower K_g)"
        )
    if g >= 1 << 31:
        raise ValueError("galleries of 2**31 references or more are not supported")
    step = max(1, _CHUNK_ELEMENTS // max(kg, 1)) if chunk is None else int(chunk)
    if step < 1:
        raise ValueError("chunk must be at least 1")
    cols, data = [], []
    for a in range(0, g, step):
        top = np.asarray(nb[a : a + step, :kg], dtype=np.int64)
        n = top.shape[0]
        if top.size and (top.min() < 0 or top.max() >= g):
            raise ValueError(f"neighbour lists hold rows outside 0..{g - 1}")
        if np.any(top == np.arange(a, a + n)[:, None]):
            raise ValueError("neighbour lists must not list a reference as its own neighbour")
        order = np.argsort(top, axis=1, kind="stable")  # columns ascending, as prepare_graph stores them
        c = np.take_along_axis(top, order, axis=1)
        if kg > 1 and np.any(c[:, 1:] == c[:, :-1]):
            raise ValueError("neighbour lists list a reference twice in a row: recompute them")
        cols.append(c.astype(np.int32).ravel())
        data.append((g - 1 - order).astype(np.float64).ravel())  # G - r, r = position + 1
    indices = np.concatenate(cols) if cols else np.empty(0, np.int32)
    values = np.concatenate(data) if data else np.empty(0, np.float64)
    indptr = np.arange(g + 1, dtype=np.int64) * kg
    w = sp.csr_array((values, indices, indptr), shape=(g, g))
    return ICFRRGraph(g, kg, w)


def _run_chunk(s0: np.ndarray, graph: ICFRRGraph, p: ICFRRParams, kq: int):
    """Vectorized ICFRR on a block of queries; ``s0`` (n, G) float32 = -D.

    On a :meth:`ICFRRGraph.subgraph` the columns are the sub-gallery's references and the
    normalizer is that of the whole gallery (``graph.gallery_size - 1``).
    """
    n, g = s0.shape
    scale = p.beta / (kq * (graph.gallery_size - 1))  # beta / (K_q (G - 1)): Eq. 3, 5, 6
    ref = p.mode == "reference"
    ranked = order(s0)
    s = s0.copy()
    s0_sorted = np.take_along_axis(s0, ranked, axis=1) if ref else None
    ind = np.zeros((n, g), dtype=np.float32)  # indicator of the current top-K_q set
    np.put_along_axis(ind, ranked[:, :kq], 1.0, axis=1)
    delta = graph.product(ind, kq)  # integer sums of (G - r) over the top K_q, Eq. 6
    iters = np.zeros(n, dtype=np.int64)
    conv = np.zeros(n, dtype=bool)
    active = np.arange(n)
    for it in range(1, p.max_iter + 1):
        sel: Any = slice(None) if len(active) == n else active
        inc = (delta[sel] * scale).astype(np.float32)  # beta * Delta(t)
        o = ranked[sel]
        if ref:
            assert s0_sorted is not None  # computed when ref
            # public code: the item at position j gets the j-th best initial score + beta Delta
            new_s = np.empty_like(inc)
            np.put_along_axis(new_s, o, s0_sorted[sel] + np.take_along_axis(inc, o, axis=1), axis=1)
            s[sel] = new_s
        else:
            s[sel] += inc  # Eq. 3
        # Only the rows whose ranking changed are sorted again (the last ranking is not needed).
        changed, new_o = reorder(s[sel], o, sort=it < p.max_iter)
        iters[sel] = it
        conv[sel] = ~changed
        if len(new_o):
            rows = active[changed]
            # Delta depends only on the top-K_q *set*: update it for the rows whose set
            # changed (rows with an unchanged ranking keep their Delta).
            new_ind = np.zeros((len(rows), g), dtype=np.float32)
            np.put_along_axis(new_ind, new_o[:, :kq], 1.0, axis=1)
            diff = new_ind - ind[rows]
            moved = np.any(diff != 0, axis=1)
            if moved.any():
                delta[rows[moved]] += graph.product(diff[moved], 2 * kq)
                ind[rows[moved]] = new_ind[moved]
            ranked[rows] = new_o
        if p.stop_when_stable:
            active = active[changed]
            if len(active) == 0:
                break
    return s, iters, conv


def _check_graph(graph: ICFRRGraph, k_g: int) -> ICFRRGraph:
    if not isinstance(graph, ICFRRGraph):
        raise TypeError("ICFRR needs an ICFRRGraph (graph_from_neighbours), not a dense rank matrix")
    kg = max(0, min(int(k_g), graph.size - 1))
    if graph.k_g != kg:
        raise ValueError(f"the prepared graph is for k_g={graph.k_g}, params ask for {kg}")
    return graph


def _check_scores(query_scores: np.ndarray, unscored: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The (Q, G) query scores and their finite mask (None when every score is finite).

    ``unscored``: -inf is allowed (a reference the search did not score); NaN and +inf are always
    refused."""
    q = np.asarray(query_scores)
    if q.ndim != 2:
        raise ValueError(f"query scores must be a (Q, G) matrix, got shape {q.shape}")
    finite = np.isfinite(q)
    n_finite = int(np.count_nonzero(finite))
    if n_finite == q.size:
        return q, None
    if not unscored or int(np.count_nonzero(np.isneginf(q))) != q.size - n_finite:
        what = "NaN or +inf (-inf marks a reference the search did not score)" if unscored else "NaN or infinite values"
        raise ValueError(f"query scores contain {what}")
    return q, finite


def _to_s0(q: np.ndarray, scores_are: str, finite: np.ndarray | None = None) -> np.ndarray:
    """``s(0)`` (float32) from checked scores (``finite``: their finite mask, None = all finite)."""
    if scores_are == "dot":
        if finite is None:
            lo, hi = (q.min(), q.max()) if q.size else (0.0, 0.0)
        else:  # over the scored references
            lo, hi = np.min(q, where=finite, initial=np.inf), np.max(q, where=finite, initial=-np.inf)
        if hi > 1 + _DOT_SLACK or lo < -1 - _DOT_SLACK:
            raise ValueError(
                f"query scores range over [{lo:.3g}, {hi:.3g}]: not dot products of "
                "L2-normalized descriptors, and -D = -sqrt(2 - 2 dot) would clamp them. Give ICFRR "
                "the dot products (re-rank with it before re-rankers that change the score scale), "
                "or pass scores_are='neg_distance' to use the scores as s(0) directly"
            )
        return neg_distance(q)
    if scores_are == "neg_distance":
        return np.asarray(q, dtype=np.float32) + np.float32(0.0)
    raise ValueError(f"scores_are must be 'dot' or 'neg_distance' (got {scores_are!r})")


def icfrr(
    query_scores: np.ndarray,
    graph: ICFRRGraph,
    params: ICFRRParams,
    *,
    scores_are: Literal["dot", "neg_distance"] = "dot",
    chunk_size: int | None = None,
) -> ICFRRResult:
    """ICFRR re-ranking of a batch of queries (section 3.2, Eq. 3-6).

    ``query_scores``: (Q, G) query-reference dot products (``scores_are="dot"``, converted to
    ``s(0) = -D``, Eq. 4; values outside [-1, 1] beyond rounding are refused, since the
    conversion would clamp them) or ``-D`` itself (``scores_are="neg_distance"``: the values are
    used as ``s(0)`` as they are, so any higher-is-better score on a comparable scale works;
    ``beta * Delta`` adds at most ``beta``).
    ``graph``: the :class:`ICFRRGraph` of ``params.k_g`` (:func:`graph_from_neighbours`; reuse it
    across batches).
    Returns :class:`ICFRRResult` with float32 final scores (higher is better).

    Rows with ``-inf`` entries (an approximate search's shortlist) are re-ranked on their scored
    references only, the others stay ``-inf``: see :func:`_run_partly_scored`. Rows without
    ``-inf`` take the full path: when every score is finite the result is bit-identical to the
    full-gallery implementation. How each equation is read: "Decisions" in the module doc.

    Arithmetic: float32 scores (as the project), integer Delta sums (exact, see
    :class:`ICFRRGraph`), so chunked, unchunked and per-query (the tests' oracle) results are
    bit-identical.
    Memory: about 100 bytes per query-reference pair of a chunk; ``chunk_size`` queries at a time
    (default: about 2M pairs, ~200 MB, per chunk), never Q x G x G.
    Cost per query: Delta from one sparse product, O(K_q K_g) (or a dense GEMM row, O(G^2), when
    that is cheaper: large K, small G); then per iteration a check that the ranking is still
    sorted (O(G)), a re-sort of the rows that changed (O(G log G), nearly linear when little
    moved) and a Delta update over only the references that entered or left the top K_q.
    """
    qs, finite = _checked_inputs(query_scores, graph, params, scores_are)
    q, g = qs.shape
    if q == 0 or g < 2 or params.max_iter == 0:
        # Nothing to re-rank (G < 2: no gallery-gallery ranks; the ranking cannot change).
        return ICFRRResult(_to_s0(qs, scores_are, finite), np.zeros(q, dtype=np.int64), np.full(q, g < 2))
    kq = min(params.k_q, g)
    step = chunk_size if chunk_size is not None else max(1, _QUERY_CHUNK_ELEMENTS // g)
    if step < 1:
        raise ValueError("chunk_size must be at least 1")
    if finite is None:
        return ICFRRResult(*_run_in_chunks(_to_s0(qs, scores_are), graph, params, kq, step))
    return _run_partly_scored(qs, finite, graph, params, kq, step, scores_are)


def _checked_inputs(query_scores: np.ndarray, graph: ICFRRGraph, params: ICFRRParams, scores_are: str
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """The checked (Q, G) query scores of :func:`icfrr` and their finite mask (None: all finite);
    raises on wrong parameters, NaN or +inf scores, or a graph of another ``k_g`` or size."""
    if not isinstance(params, ICFRRParams):
        raise TypeError("params must be an ICFRRParams")
    if scores_are not in ("dot", "neg_distance"):
        raise ValueError(f"scores_are must be 'dot' or 'neg_distance' (got {scores_are!r})")
    qs, finite = _check_scores(query_scores, unscored=True)
    graph = _check_graph(graph, params.k_g)
    if graph.size != qs.shape[1]:
        raise ValueError(f"query scores have {qs.shape[1]} columns, the gallery ranks {graph.size}")
    return qs, finite


def _run_in_chunks(s0: np.ndarray, graph: ICFRRGraph, p: ICFRRParams, kq: int, step: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_run_chunk` on the (n, G) ``s0``, ``step`` queries at a time (bounded memory);
    returns the final scores, the updates applied and the convergence of every query."""
    n = len(s0)
    out = np.empty_like(s0)
    iters = np.zeros(n, dtype=np.int64)
    conv = np.zeros(n, dtype=bool)
    for a in range(0, n, step):
        b = min(n, a + step)
        out[a:b], iters[a:b], conv[a:b] = _run_chunk(s0[a:b], graph, p, kq)
    return out, iters, conv


def _run_partly_scored(qs: np.ndarray, finite: np.ndarray, graph: ICFRRGraph, p: ICFRRParams, kq: int,
                       step: int, scores_are: str) -> ICFRRResult:
    """:func:`icfrr` of (Q, G) query scores ``qs`` of which some are ``-inf`` (``finite``: the mask
    of the others): the fully scored rows take the full path (in chunks of those rows); each other
    row runs on its scored references only (:func:`_run_scored`). s(0) is computed (and checked)
    for the scored entries only, all of it before any update.

    An approximate search scores only a shortlist per query and gives ``-inf`` to the other
    references. A row with ``-inf`` entries is re-ranked on its scored
    references ``S`` only (``m = |S|``): the sub-graph of ``S`` (:meth:`ICFRRGraph.subgraph`:
    the whole gallery's ranks, and its normalizer ``G - 1`` in Eq. 5), ``K_q`` capped at ``m``;
    the others stay ``-inf``. This is exactly the update of Eq. 3-6 run on the whole gallery with
    those ``-inf`` scores (``-inf + beta Delta = -inf``: they never move, and with ``K_q <= m``
    they never vote), and the tests' per-query oracle does that literally (bit-identical). It is
    also what ICFRR on the *true* scores of every reference gives at the top of the ranking: a
    reference outside ``S`` starts below every scored one, and an update adds at most ``beta``
    (``0 <= Delta <= 1``), so as long as the ``K_q``-th best scored reference stays above the
    best unscored start plus what the updates can add (``t beta`` after ``t`` updates in paper
    mode, ``beta`` in reference mode), the top-``K_q`` sets are the same, hence the same Delta and
    the same scores on ``S``; and every scored reference whose final score is above that bound is
    above every unscored one in both runs, so the two rankings agree down to it (tested on a
    clustered gallery: same top 10). The only other difference: the full run's stopping rule also
    watches the unscored tail, which a shortlist cannot see; in paper mode an extra update there
    adds Delta once more to ``S``.
    Cost of a partly scored row: O(G) to find ``S`` and write the row, O(m K_g log m) for the
    sub-graph, then the iterations on ``m`` references only (sorts O(m log m), never O(G log G),
    nothing O(G^2)).
    """
    q, g = qs.shape
    whole = np.flatnonzero(finite.all(axis=1))
    s0_whole = _to_s0(qs[whole], scores_are) if len(whole) else None
    partial = []
    for r in np.flatnonzero(~finite.all(axis=1)):
        scored = np.flatnonzero(finite[r])
        partial.append((r, scored, _to_s0(qs[r, scored][None, :], scores_are)[0]))
    out = np.full((q, g), -np.inf, dtype=np.float32)
    iters = np.zeros(q, dtype=np.int64)
    conv = np.zeros(q, dtype=bool)
    if s0_whole is not None:
        out[whole], iters[whole], conv[whole] = _run_in_chunks(s0_whole, graph, p, kq, step)
    for r, scored, s0_scored in partial:
        out[r, scored], iters[r], conv[r] = _run_scored(s0_scored, scored, graph, p)
    return ICFRRResult(out, iters, conv)


def _run_scored(s0: np.ndarray, scored: np.ndarray, graph: ICFRRGraph, p: ICFRRParams
                ) -> tuple[np.ndarray, int, bool]:
    """ICFRR on the scored references ``scored`` (ascending rows) of one partly scored query,
    ``s0`` their initial scores; returns their final scores, the updates applied, convergence.

    See :func:`_run_partly_scored`. The scored references are taken in ascending
    row order, so ties (by sub-gallery position) are still broken by reference index.
    """
    if len(scored) == 0:
        return s0, 0, True  # nothing scored: nothing to re-rank
    s, it, cv = _run_chunk(s0[None, :], graph.subgraph(scored), p, min(p.k_q, len(scored)))
    return s[0], int(it[0]), bool(cv[0])


def suggest_params(labels: Sequence[Hashable], *, beta: float = 0.5, max_iter: int = 5) -> ICFRRParams:
    """The paper's rule of thumb (section 3.2): K_q = K_g = 0.5 x images per positive class, beta 0.5.

    "A good rule of thumb is to set K_q and K_g at around 0.5 times the number of instances you
    believe there to be of the positive class in the gallery set and beta to 0.5." Here the
    positive class of a query is an instance, so the count is the *median* number of gallery
    images per instance (robust to a few heavily photographed objects), halved, rounded half up,
    at least 1.
    """
    counts = list(Counter(labels).values())
    if not counts:
        raise ValueError("no labels: cannot suggest ICFRR parameters for an empty gallery")
    k = max(1, math.floor(0.5 * float(np.median(counts)) + 0.5))
    return ICFRRParams(k_q=k, k_g=k, beta=beta, max_iter=max_iter)


class ICFRRReranker:
    """ICFRR behind the common reranker protocol (see module doc).

    ``params=None`` uses :func:`suggest_params` on the gallery ``labels`` at each call. The graph
    is ``graph=``, an :class:`ICFRRGraph` for the parameters' ``k_g`` (the pipeline builds it
    from the index's neighbour lists: :func:`museum_search.core.answer._rerank.icfrr_graph`).
    """

    name = "icfrr"

    def __init__(
        self,
        params: ICFRRParams | None = None,
        *,
        chunk_size: int | None = None,
        scores_are: Literal["dot", "neg_distance"] = "dot",
    ):
        self.params = params
        self.chunk_size = chunk_size
        self.scores_are = scores_are

    def rerank(
        self,
        scores: np.ndarray,
        *,
        graph: ICFRRGraph | None = None,
        labels: Sequence[Hashable] | None = None,
        **context: Any,
    ) -> np.ndarray:
        """(Q, G) float32 ICFRR scores (higher is better) from (Q, G) dot products ``scores``
        (``-inf``: references the search did not score, left at ``-inf``; see :func:`icfrr`)."""
        params = self.params
        if params is None:
            if labels is None:
                raise ValueError("ICFRR without explicit parameters needs the gallery labels")
            params = suggest_params(labels)
        if graph is None:
            raise ValueError("ICFRR needs the gallery's graph (graph=, from graph_from_neighbours)")
        return icfrr(np.atleast_2d(scores), graph, params, scores_are=self.scores_are,
                     chunk_size=self.chunk_size).scores
