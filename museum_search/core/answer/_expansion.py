"""alpha-weighted query expansion (alpha-QE) and database-side augmentation (DBA).

Radenovic, Tolias, Chum, "Fine-tuning CNN image retrieval with no human annotation" (TPAMI 2018):

* **alpha-QE**: the query is replaced by ``normalize(q + sum_{i <= n} w_i d_i)`` over its top-``n``
  gallery neighbours ``d_i``, with ``w_i = s_i ** alpha`` and ``s_i = q . d_i`` (the query itself
  has weight ``1 = s(q, q) ** alpha``). ``alpha = 0`` is plain average query expansion.
* **DBA**: every reference is replaced by ``normalize(d + sum_{j <= n} w_j d_j)`` over its
  top-``n`` gallery neighbours *other than itself* (the diagonal is masked explicitly, so an
  identical near-duplicate counts as a neighbour), same weights. Queries are then scored against
  the augmented gallery. Note: implementations that take "the top n" from the raw gallery ranking
  (where the reference itself comes first) have one neighbour less for the same ``n``.

Conventions: descriptors are float32 and L2-normalized; scores are dot products. Negative
similarities get weight 0 (``w = max(s, 0) ** alpha`` with ``0 ** 0`` read as 0), so a neighbour
pointing away never pulls the query towards its opposite. Neighbours are chosen by descending
score, ties by reference index. ``n = 0`` returns the input descriptors unchanged.

The reranker classes follow the protocol documented in :mod:`.icfrr`:
``rerank(scores, *, descriptors=None, labels=None, query_descriptors=None,
**context) -> (Q, G) float32 scores`` (here: dot products with the expanded query / augmented
gallery), unused keywords ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from museum_search.core.ranking import order

__all__ = ["AQEReranker", "DBAReranker", "alpha_qe", "dba"]

_CHUNK_ELEMENTS = 1 << 22


def _matrix(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a (N, D) matrix, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contain NaN or infinite values")
    return x


def _check(n: int, alpha: float) -> tuple[int, float]:
    n, alpha = int(n), float(alpha)
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0 (got {alpha})")
    return n, alpha


def _weights(sims: np.ndarray, alpha: float) -> np.ndarray:
    """``max(s, 0) ** alpha`` in float64, with weight 0 for ``s <= 0`` (also when ``alpha = 0``)."""
    s = np.asarray(sims, dtype=np.float64)
    pos = s > 0
    return np.where(pos, np.power(np.where(pos, s, 1.0), alpha), 0.0)


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms > 0, norms, 1)).astype(np.float32)


# Reproducibility: similarities are accumulated in float64 and rounded to float32, and the sums
# run per row in float64, so results do not depend on chunking or on the BLAS code path chosen
# for a given matrix shape (a float32 GEMM of one row and of many rows can differ in the last bit).
def _dots(a: np.ndarray, b64: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b64.T).astype(np.float32)


def alpha_qe(
    query_desc: np.ndarray,
    gallery: np.ndarray,
    scores: np.ndarray | None = None,
    n: int = 2,
    alpha: float = 3.0,
) -> np.ndarray:
    """(Q, D) float32 expanded queries: ``normalize(q + sum_{i<=n} max(q.d_i, 0)**alpha d_i)``.

    ``scores`` (Q, G), higher is better, only selects the ``n`` neighbours (e.g. dot products
    already computed by search, or scores of another reranker); the weights always use the dot
    products ``q . d_i``. ``scores=None``: neighbours by dot product.
    """
    q = _matrix(query_desc, "query descriptors")
    g = _matrix(gallery, "gallery descriptors")
    n, alpha = _check(n, alpha)
    if g.shape[0] and q.shape[1] != g.shape[1]:
        raise ValueError(f"queries are {q.shape[1]}-d, the gallery is {g.shape[1]}-d")
    n = min(n, g.shape[0])
    if n == 0 or q.shape[0] == 0:
        return q.copy()
    if scores is not None:
        scores = np.asarray(scores)
        if scores.shape != (q.shape[0], g.shape[0]):
            raise ValueError(f"scores must be (Q, G) = {(q.shape[0], g.shape[0])}, got {scores.shape}")
    out = np.empty(q.shape, dtype=np.float64)
    g64 = g.astype(np.float64)
    step = max(1, _CHUNK_ELEMENTS // max(g.shape[0], n * q.shape[1]))
    for a in range(0, q.shape[0], step):
        b = min(q.shape[0], a + step)
        qa = q[a:b].astype(np.float64)
        sa = _dots(qa, g64) if scores is None else scores[a:b]
        top = order(sa, n)  # (m, n) best first, ties by index
        nb = g64[top]  # (m, n, D)
        sims = np.einsum("md,mnd->mn", qa, nb).astype(np.float32)
        out[a:b] = qa + np.einsum("mn,mnd->md", _weights(sims, alpha), nb)
    return _normalize(out)


def dba(gallery: np.ndarray, n: int = 2, alpha: float = 3.0, chunk: int | None = None) -> np.ndarray:
    """(G, D) float32 augmented gallery: ``normalize(d + sum_{j<=n} max(d.d_j, 0)**alpha d_j)``.

    The ``n`` neighbours exclude the reference itself (masked, not assumed first). Computed once
    per index: callers should cache the result (``DBAReranker`` caches the last gallery seen).
    Rows are processed ``chunk`` at a time (default: about 4M scores per chunk).
    Cost O(G^2 D) (float64 BLAS) + O(G^2) selection.
    """
    x = _matrix(gallery, "gallery descriptors")
    n, alpha = _check(n, alpha)
    gsize = x.shape[0]
    n = min(n, max(gsize - 1, 0))
    if n == 0:
        return x.copy()
    step = int(chunk) if chunk is not None else max(1, _CHUNK_ELEMENTS // gsize)
    if step < 1:
        raise ValueError("chunk must be at least 1")
    out = np.empty(x.shape, dtype=np.float64)
    x64 = x.astype(np.float64)
    for a in range(0, gsize, step):
        b = min(gsize, a + step)
        rows = np.arange(b - a)
        s = _dots(x64[a:b], x64)
        s[rows, rows + a] = -np.inf  # the reference itself is not its own neighbour
        top = order(s, n)
        w = _weights(np.take_along_axis(s, top, axis=1), alpha)
        out[a:b] = x64[a:b] + np.einsum("mn,mnd->md", w, x64[top])
    return _normalize(out)


class AQEReranker:
    """alpha-QE behind the reranker protocol: dot products of the expanded queries with the gallery."""

    name = "aqe"

    def __init__(self, n: int = 2, alpha: float = 3.0):
        self.n, self.alpha = _check(n, alpha)

    def rerank(
        self,
        scores: np.ndarray | None,
        *,
        descriptors: np.ndarray | None = None,
        query_descriptors: np.ndarray | None = None,
        **context: Any,
    ) -> np.ndarray:
        """(Q, G) float32; ``scores`` (when given) select the neighbours, see :func:`alpha_qe`."""
        if descriptors is None or query_descriptors is None:
            raise ValueError("alpha-QE needs the gallery descriptors and the query descriptors")
        g = np.asarray(descriptors, dtype=np.float32)
        q = alpha_qe(np.atleast_2d(query_descriptors), g, scores, self.n, self.alpha)
        return q @ g.T


class DBAReranker:
    """DBA behind the reranker protocol: dot products of the queries with the augmented gallery.

    The augmented gallery is taken from the ``dba_gallery`` keyword when the caller caches it,
    else computed with :func:`dba` and cached for the last ``descriptors`` array seen (identity).
    """

    name = "dba"

    def __init__(self, n: int = 2, alpha: float = 3.0):
        self.n, self.alpha = _check(n, alpha)
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def augmented(self, descriptors: np.ndarray) -> np.ndarray:
        if self._cache is None or self._cache[0] is not descriptors:
            self._cache = (descriptors, dba(descriptors, self.n, self.alpha))
        return self._cache[1]

    def rerank(
        self,
        scores: np.ndarray | None,
        *,
        descriptors: np.ndarray | None = None,
        query_descriptors: np.ndarray | None = None,
        dba_gallery: np.ndarray | None = None,
        **context: Any,
    ) -> np.ndarray:
        """(Q, G) float32 dot products with the augmented gallery (``scores`` are not used)."""
        if query_descriptors is None:
            raise ValueError("DBA needs the query descriptors")
        if dba_gallery is None:
            if descriptors is None:
                raise ValueError("DBA needs the gallery descriptors (or a cached dba_gallery)")
            dba_gallery = self.augmented(descriptors)
        q = np.atleast_2d(np.asarray(query_descriptors, dtype=np.float32))
        return q @ np.asarray(dba_gallery, dtype=np.float32).T
