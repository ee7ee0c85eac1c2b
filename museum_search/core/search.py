"""Search: the scores of query descriptors against every reference (one matrix product, or the
approximate index's shortlist); they are ranked by :mod:`.ranking`.

Scores are dot products of L2-normalized descriptors (cosine similarity, in [-1, 1]; higher is
better); ``2 - 2·score`` is the squared Euclidean distance. Re-rankers may replace the scores by
their own (still higher = better).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .ann import exact_scores, rows_scores
from .store import Index


@dataclass
class Result:
    rank: int  # 1-based
    score: float
    row: int  # row of the reference in the index
    path: str  # relative to the collection root
    abspath: str
    instance: str
    metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "score": round(float(self.score), 6), "path": self.abspath,
                "instance": self.instance, "metadata": self.metadata}


def score_matrix(index: Index, query_descriptors: np.ndarray, mode: str = "exact") -> np.ndarray:
    """(Q, G) float32 dot products of the queries with every reference.

    ``query_descriptors`` is (D,), (Q, D), or (Q, R, D) for multi-region queries (see
    ``extract.QUERY_REGIONS``), where a reference's score is its best score over the R regions.

    ``mode`` "exact" scores every reference (a float16 matrix is converted a block of rows at a
    time, never whole: :func:`.ann.exact_scores`). "ann" scores only the candidates the index's
    approximate search finds for any of the query's regions, exactly, and gives the others -inf
    (ranked last): :func:`.ann.resolve_mode` says which a search uses.
    """
    q = np.asarray(query_descriptors, dtype=np.float32)
    regions = q.ndim == 3
    flat = q.reshape(-1, q.shape[-1])
    if flat.shape[1] != index.meta.dim:
        raise ValueError(f"query descriptors are {flat.shape[1]}-d, the index is {index.meta.dim}-d")
    if mode == "ann":
        if index.ann is None:
            raise ValueError("this index has no approximate-search index")
        q3 = q if regions else flat[:, None, :]
        n, r = q3.shape[0], q3.shape[1]
        cand = index.ann.candidates(flat).reshape(n, -1)
        out = np.full((n, len(index)), -np.inf, dtype=np.float32)
        for i in range(n):
            rows = np.unique(cand[i][cand[i] >= 0])
            if len(rows):
                out[i, rows] = rows_scores(index.descriptors, q3[i], np.broadcast_to(rows, (r, len(rows)))).max(axis=0)
        return out
    scores = exact_scores(index.descriptors, flat)
    if regions:
        return scores.reshape(q.shape[0], q.shape[1], -1).max(axis=1)
    return scores


def whole_image(query_descriptors: np.ndarray) -> np.ndarray:
    """(Q, D) whole-image descriptors of (Q, D) or multi-region (Q, R, D) queries (region 0)."""
    q = np.asarray(query_descriptors, dtype=np.float32)
    return q[:, 0] if q.ndim == 3 else np.atleast_2d(q)


def results_for(index: Index, rows: np.ndarray, scores: np.ndarray) -> list[Result]:
    res = []
    for rank, r in enumerate(rows, start=1):
        it = index.items[int(r)]
        res.append(Result(rank, float(scores[r]), int(r), it.path, str(index.root / it.path), it.instance,
                          dict(it.metadata)))
    return res
