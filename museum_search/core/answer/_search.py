"""Search: the scores of query descriptors against every reference (one matrix product, the exact
top of the ranking only, or the approximate index's shortlist); they are ranked by :mod:`.ranking`.

Scores are dot products of L2-normalized descriptors (cosine similarity, in [-1, 1]; higher is
better); ``2 - 2·score`` is the squared Euclidean distance. Re-rankers may replace the scores by
their own (still higher = better).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from museum_search.core.index import Index, candidate_scores, exact_prefix, exact_scores
from museum_search.core.ranking import order

#: each region's faiss scan keeps this many best references for the exact prefix of a ranking
#: (:func:`museum_search.core.index.exact_prefix`): a heap of 1,024, not of N
PREFIX_ROWS = 1024
#: :func:`ranking_scores` uses the prefix from this many references (below, every score). Measured
#: (1280-d, one photo's 5 regions, the scores and the ranking of 5 objects, load 1-3.4): 5,000
#: references 5.5 ms against 7.3 ms for every score; 20,000: 22 against 42; 100,000: 107 against 291
PREFIX_MIN_REFERENCES = 4 * PREFIX_ROWS


@dataclass
class Result:
    """One reference in an answer: its rank, the evidence and the score it was ranked by (the one
    result class of core: :class:`museum_search.core.answer._pipeline.Answer` holds these; :func:`results_for` makes them from
    bare scores)."""

    rank: int  # 1-based
    row: int  # row of the reference in the index
    score: float  # what the ranking sorts by (cosine, re-ranked, plus the verification bonus)
    cosine: float  # best-region cosine of the global descriptors
    inliers: int | None  # homography inliers, None when not verified
    path: str  # relative to the collection root
    abspath: str
    instance: str
    metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "score": round(float(self.score), 6), "cosine": round(float(self.cosine), 6),
                "inliers": self.inliers, "path": self.abspath, "instance": self.instance,
                "metadata": self.metadata}


def score_matrix(index: Index, query_descriptors: np.ndarray, mode: str = "exact") -> np.ndarray:
    """(Q, G) float32 dot products of the queries with every reference.

    ``query_descriptors`` is (D,), (Q, D), or (Q, R, D) for multi-region queries (see
    ``extract.QUERY_REGIONS``), where a reference's score is its best score over the R regions.

    ``mode`` "exact" scores every reference (a float16 matrix is converted a block of rows at a
    time, never whole: :func:`museum_search.core.index.exact_scores`). "ann" scores only the candidates the index's
    approximate search finds for any of the query's regions, exactly, and gives the others -inf
    (ranked last): :func:`museum_search.core.index.resolve_mode` says which a search uses. :func:`top` ranks only what
    it must (the candidates, with "ann"; the exact prefix of the ranking, with "exact"), when the
    whole row of scores is not needed; :func:`ranking_scores` gives the query pipeline the scores
    its answer needs.
    """
    q, regions = _query_matrix(index, query_descriptors)
    if mode == "ann":
        out = np.full((q.shape[0], len(index)), -np.inf, dtype=np.float32)
        for i, (rows, scores) in enumerate(_candidate_scores(index, q)):
            out[i, rows] = scores
        return out
    scores = exact_scores(index.descriptors, q.reshape(-1, q.shape[-1]))
    if regions:
        return scores.reshape(q.shape[0], q.shape[1], -1).max(axis=1)
    return scores


def top(index: Index, query_descriptors: np.ndarray, k: int, mode: str = "exact") -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best references of each query: ``(rows (Q, k) int64, scores (Q, k) float32)``, in
    the order of :func:`.ranking.order` on :func:`score_matrix`'s scores (descending score, ties by
    lower row), rows -1 and scores -inf past the references scored.

    "exact" on a float16 memory map ranks each query's exact prefix (:func:`museum_search.core.index.exact_prefix`:
    every reference above the largest of its regions' :data:`PREFIX_ROWS`-th scores, with the same
    scores), and scores every reference only for a query whose prefix is shorter than ``k``; else
    it scores every reference and selects the ``k`` best (linear time). "ann" scores and ranks
    only the approximate search's candidates (``params.shortlist`` per region, a few hundred),
    not an N-long row. Either way the same result as ranking :func:`score_matrix` (the prefix is
    the first rows of that ranking, ties included; the -inf of the others come last).
    """
    q, regions = _query_matrix(index, query_descriptors)
    k = max(0, int(k))
    nq = q.shape[0]
    if mode != "ann":
        prefix = _prefix(index, q, max(PREFIX_ROWS, 2 * k)) if k > 0 else None
        if prefix is None:
            s = score_matrix(index, q if regions else q[:, 0], "exact")
            rows = order(s, k).astype(np.int64)
            return _pad(rows, np.take_along_axis(s, rows, axis=1), k)
        out_rows = np.full((nq, k), -1, dtype=np.int64)
        out_scores = np.full((nq, k), -np.inf, dtype=np.float32)
        short = [i for i, (rows, _) in enumerate(prefix) if len(rows) < k]
        full = score_matrix(index, q[short] if regions else q[short, 0], "exact") if short else None
        whole = {i: j for j, i in enumerate(short)}  # query -> its row of ``full``
        for i, (rows, scores) in enumerate(prefix):
            if i in whole:
                assert full is not None
                s = full[whole[i]]
                best = order(s, k)
                out_rows[i, :len(best)], out_scores[i, :len(best)] = best, s[best]
            else:
                best = order(scores, k)  # rows are ascending: ties in position are ties by row
                out_rows[i], out_scores[i] = rows[best], scores[best]
        return out_rows, out_scores
    if not regions and index.ann is not None and k <= index.ann.params.shortlist:
        return index.ann.search(index.descriptors, q[:, 0], k)
    out_rows = np.full((nq, k), -1, dtype=np.int64)
    out_scores = np.full((nq, k), -np.inf, dtype=np.float32)
    for i, (rows, scores) in enumerate(_candidate_scores(index, q)):
        best = order(scores, k)  # rows are sorted: ties in position are ties by row
        out_rows[i, :len(best)] = rows[best]
        out_scores[i, :len(best)] = scores[best]
    return out_rows, out_scores


def ranking_scores(index: Index, query_descriptors: np.ndarray, mode: str = "exact", *, rows: int,
                   objects: int) -> np.ndarray:
    """(Q, N) float32 global scores for the query pipeline's ranking: :func:`score_matrix`'s, or,
    for a query whose answer does not need them all, only the top of its ranking (-inf elsewhere).

    In "exact" mode on a float16 memory map of at least :data:`PREFIX_MIN_REFERENCES` references
    (a few query regions, as a photo's), a query's row holds its exact prefix
    (:func:`museum_search.core.index.exact_prefix`: every reference whose score is above a threshold ``T``, with
    :func:`score_matrix`'s very scores, bit for bit; none at or below ``T``) when that prefix has at
    least ``rows`` references of at least ``objects`` objects (``index.labels``); otherwise the
    whole row of :func:`score_matrix`. In other modes, or without the prefix, :func:`score_matrix`.

    Why an answer is the same (with no re-ranker and no reference left out, the pipeline's callers'
    business): every reference in the prefix scores above every one outside it, and the order within
    it is :func:`score_matrix`'s. The pipeline uses the top ``rows`` = max(k, verify_top) references
    (the results, the verified shortlist: the same rows), the top ``objects`` = k + 1 objects (one
    result per object, and the margin to the best reference of another object than the top
    result's: both within the prefix), and verification only adds a bonus to verified references,
    all in the prefix, which keeps them above the others. It ranks the finite scores only (as with
    "ann"); ``Answer.scores`` and ``Answer.cosine`` hold -inf outside the prefix.
    """
    q, regions = _query_matrix(index, query_descriptors)
    n = len(index)
    prefix = None
    if mode != "ann" and n >= PREFIX_MIN_REFERENCES:
        prefix = _prefix(index, q, max(PREFIX_ROWS, 2 * max(int(rows), int(objects))))
    if prefix is None:
        return score_matrix(index, query_descriptors, mode)
    labels = index.labels
    out = np.full((q.shape[0], n), -np.inf, dtype=np.float32)
    short = []
    for i, (found, scores) in enumerate(prefix):
        if len(found) >= rows and len(set(labels[found].tolist())) >= objects:
            out[i, found] = scores
        else:
            short.append(i)
    if short:
        out[short] = score_matrix(index, q[short] if regions else q[short, 0], "exact")
    return out


def _prefix(index: Index, q3: np.ndarray, m: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """:func:`museum_search.core.index.exact_prefix` of the (Q, R, D) queries when it leaves references out (``m`` < N)."""
    if m >= len(index):
        return None
    return exact_prefix(index.descriptors, q3, m)


def _pad(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    pad = k - rows.shape[1]
    if pad > 0:
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    return rows, scores


def _query_matrix(index: Index, query_descriptors: np.ndarray) -> tuple[np.ndarray, bool]:
    """(Q, R, D) float32 queries (R = 1 without regions) and whether they had regions."""
    q = np.asarray(query_descriptors, dtype=np.float32)
    regions = q.ndim == 3
    q3 = q if regions else np.atleast_2d(q)[:, None, :]
    if q3.shape[-1] != index.meta.dim:
        raise ValueError(f"query descriptors are {q3.shape[-1]}-d, the index is {index.meta.dim}-d")
    return q3, regions


def _candidate_scores(index: Index, q3: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each query of (Q, R, D) ``q3``: (its candidate rows, sorted, distinct; their exact scores,
    the best over its R regions), the candidates being those of any of its regions."""
    if index.ann is None:
        raise ValueError("this index has no approximate-search index")
    nq, r = q3.shape[0], q3.shape[1]
    if r == 1:  # one region: the approximate search's own shortlist and scores
        rows, scores = index.ann.search(index.descriptors, q3[:, 0], index.ann.params.shortlist)
        out = []
        for i in range(nq):
            found = rows[i] >= 0
            by_row = np.argsort(rows[i][found])
            out.append((rows[i][found][by_row], scores[i][found][by_row]))
        return out
    cand = index.ann.candidates(q3.reshape(nq * r, -1)).reshape(nq, -1)
    out = []
    for i in range(nq):
        rows = np.unique(cand[i][cand[i] >= 0])
        out.append((rows, candidate_scores(index.descriptors, q3[i], rows).max(axis=0)))
    return out


def whole_image(query_descriptors: np.ndarray) -> np.ndarray:
    """(Q, D) whole-image descriptors of (Q, D) or multi-region (Q, R, D) queries (region 0)."""
    q = np.asarray(query_descriptors, dtype=np.float32)
    return q[:, 0] if q.ndim == 3 else np.atleast_2d(q)


def results_for(index: Index, rows: np.ndarray, scores: np.ndarray, cosine: np.ndarray | None = None
                ) -> list[Result]:
    """The :class:`Result` of each of ``rows`` (best first) of the (G,) ``scores``; ``cosine``: the
    (G,) cosines when the scores are not them (default: the scores are the cosines). Not verified:
    ``inliers`` is None."""
    cos = scores if cosine is None else cosine
    res = []
    for rank, r in enumerate(rows, start=1):
        it = index.items[int(r)]
        res.append(Result(rank, int(r), float(scores[r]), float(cos[r]), None, it.path, str(index.root / it.path),
                          it.instance, dict(it.metadata)))
    return res
