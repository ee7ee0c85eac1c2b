"""Evaluation runner: describes the queries in batches and yields one record per query.

``evaluate(index, queryset)`` is a generator: each step yields an :class:`EvalStep` with the
record of the query just ranked (its full ranking, per-query metrics) and the running means, so
plots can follow live; it returns the :class:`EvalReport` at the end. Closing the generator
cancels the run (nothing is written by the runner itself).

Conventions (see :mod:`museum_search.core.evaluation.metrics`): a reference is relevant to a
query iff its instance is in the query's relevant set; queries whose instances have no reference
in the index are open-set queries, reported but excluded from the means; rankings cover the
whole collection (ties broken by index row), so AP and MNRO see every relevant reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Generator

import numpy as np

from ..backbones import Extractor, extractor_for_meta
from ..extract import extract, run
from ..index import Index
from ..search import full_ranking, score_matrix
from .metrics import relevance_matrix, summarize
from .querysets import QuerySet

#: Per-query metrics kept in every record (keys of :func:`metrics.summarize`'s ``per_query``).
RECORD_METRICS = {"p@1": "p@1", "p@5": "p@5", "ap": "map", "mnro": "amnro", "nmrr": "anmrr", "rr": "mrr"}
#: Means reported in the summary, in display order.
SUMMARY_KEYS = ("mp@1", "map", "amnro", "anmrr", "p@5", "mrr", "r-precision")


@dataclass
class QueryRecord:
    position: int  # order of the query in the query set
    query: str  # path of the query image
    relevant: list[str]  # relevant instances present in the index (empty: open-set)
    metrics: dict[str, float]  # p@1, p@5, ap, mnro, nmrr, rr (NaN for open-set queries)
    ranking: np.ndarray  # every reference row, best first
    scores: np.ndarray  # score of each ranked reference (same order)
    relevance: np.ndarray  # bool: is the reference at each rank relevant
    n_relevant: int  # relevant references in the collection

    @property
    def open_set(self) -> bool:
        return self.n_relevant == 0


@dataclass
class EvalStep:
    done: int
    total: int
    record: QueryRecord | None
    running: dict[str, float]  # running means over the evaluated queries so far
    skipped: list[tuple[str, str]] = field(default_factory=list)  # new unreadable queries
    elapsed: float = 0.0

    @property
    def current(self) -> str | None:
        return self.record.query if self.record else None


@dataclass
class EvalReport:
    summary: dict[str, Any]
    records: list[QueryRecord]
    skipped: list[tuple[str, str]]
    index_description: str
    queryset_description: str
    rerank: str
    per_query: dict[str, np.ndarray]  # metric key → (evaluated + open-set queries,) values

    def per_query_values(self, key: str) -> np.ndarray:
        """Values of ``key`` (e.g. "p@1", "ap", "mnro") over the evaluated (non open-set) queries."""
        return np.array([r.metrics[key] for r in self.records if not r.open_set], dtype=float)


def evaluate(
    index: Index,
    queryset: QuerySet,
    pipeline=None,
    *,
    extractor: Extractor | None = None,
    weights: str | None = None,
    batch_size: int = 8,
    query_regions: bool = True,
) -> Generator[EvalStep, None, EvalReport]:
    """Rank every query of ``queryset`` against ``index`` (see the module docstring).

    ``query_regions``: describe each query by its regions (``extract.QUERY_REGIONS``), as the
    search does by default; False describes the whole image only (the papers' protocol).
    """
    extractor = extractor or extractor_for_meta(index.meta, weights)
    index.check_compatible(extractor.meta)
    qs = queryset.restricted_to(index.instances)
    queries = qs.queries
    total = len(queries)
    labels = index.labels
    gtm = nmrr_gtm(labels, queries)
    records: list[QueryRecord] = []
    skipped: list[tuple[str, str]] = []
    rels: list[np.ndarray] = []
    nrels: list[int] = []
    start = time.perf_counter()
    done = 0
    means = _RunningMeans()
    running: dict[str, float] = means.current()
    for lo in range(0, total, batch_size):
        chunk = queries[lo : lo + batch_size]
        res = run(extract([q.path for q in chunk], extractor, batch_size=batch_size, query_regions=query_regions))
        new_skips = list(res.skipped)
        skipped.extend(new_skips)
        ok = [chunk[i] for i in res.ok]
        if ok:
            scores = score_matrix(index, res.descriptors)
            if pipeline:
                scores = pipeline.apply(index, scores, res.descriptors, query_paths=[q.path for q in ok])
            ranking = full_ranking(scores)
            rel, n_rel = relevance_matrix(ranking, labels, [set(q.relevant) for q in ok])
            per = summarize(rel, n_rel, ks=(1, 5), n_collection=len(index), gtm=gtm)["per_query"]
            for j, q in enumerate(ok):
                rec = QueryRecord(
                    position=lo + res.ok[j], query=q.path, relevant=sorted(q.relevant),
                    metrics={name: float(per[key][j]) for name, key in RECORD_METRICS.items()},
                    ranking=ranking[j].astype(np.int32), scores=np.take(scores[j], ranking[j]).astype(np.float32),
                    relevance=np.asarray(rel[j], bool), n_relevant=int(n_rel[j]),
                )
                records.append(rec)
                rels.append(rec.relevance)
                nrels.append(rec.n_relevant)
                running = means.add(rec)
                done += 1
                yield EvalStep(done, total, rec, running, new_skips if j == 0 else [], time.perf_counter() - start)
        for _ in range(len(chunk) - len(ok)):
            done += 1
            yield EvalStep(done, total, None, running, new_skips if not ok else [], time.perf_counter() - start)
            new_skips = []
    summary, per_query = summary_of(index, rels, nrels, len(skipped), gtm)
    summary["query_regions"] = bool(query_regions)
    return EvalReport(summary, records, skipped, index.describe(), qs.describe(),
                      pipeline.describe() if pipeline else "none", per_query)


def nmrr_gtm(labels, queries) -> int | None:
    """NMRR's GTM: the largest number of relevant references of any query of the whole set, so
    that per-batch values use the same one as the final summary."""
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    return max((sum(counts.get(i, 0) for i in q.relevant) for q in queries), default=0) or None


def summary_of(index: Index, rels: list[np.ndarray], nrels: list, skipped: int, gtm: int | None):
    """(summary dict, per-query arrays) of an evaluation from its relevance rows."""
    if rels:
        full = summarize(np.vstack(rels), np.hstack(nrels), ks=(1, 5, 10), n_collection=len(index), gtm=gtm)
    else:
        full = summarize(np.zeros((0, len(index)), bool), np.zeros(0, np.int64), ks=(1, 5, 10))
    per_query = full.pop("per_query")
    summary: dict[str, Any] = {"queries": full["queries"], "open_set_queries": full["open_set_queries"],
                               "skipped_queries": skipped, "references": len(index),
                               "instances": len(index.instances)}
    for key in SUMMARY_KEYS + ("p@10",):
        summary[key] = full[key]
    return summary, per_query


class _RunningMeans:
    """Running MP@1, MAP and AMNRO over the evaluated (non open-set) queries seen so far."""

    def __init__(self) -> None:
        self.n = 0
        self.sums = {"mp@1": 0.0, "map": 0.0, "amnro": 0.0}

    def add(self, rec: QueryRecord) -> dict[str, float]:
        if not rec.open_set:
            self.n += 1
            for key, metric in (("mp@1", "p@1"), ("map", "ap"), ("amnro", "mnro")):
                self.sums[key] += rec.metrics[metric]
        return self.current()

    def current(self) -> dict[str, float]:
        out: dict[str, float] = {k: (v / self.n if self.n else float("nan")) for k, v in self.sums.items()}
        out["queries"] = self.n
        return out


def precision_recall_curve(report: EvalReport, points: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Interpolated precision at ``points`` recall levels, averaged over the evaluated queries.

    Interpolated precision at recall r is the maximum precision at any rank whose recall is
    >= r (the TREC 11-point convention).
    """
    recall_levels = np.linspace(0.0, 1.0, points)
    curves = []
    for r in report.records:
        if r.open_set:
            continue
        hits = np.cumsum(r.relevance)
        ranks = np.arange(1, len(r.relevance) + 1)
        precision = hits / ranks
        recall = hits / r.n_relevant
        # max precision over ranks with recall >= level: suffix maximum
        suffix_max = np.maximum.accumulate(precision[::-1])[::-1]
        idx = np.searchsorted(recall, recall_levels, side="left")
        curve = np.where(idx < len(precision), suffix_max[np.minimum(idx, len(precision) - 1)], 0.0)
        curves.append(curve)
    if not curves:
        return recall_levels, np.full(points, np.nan)
    return recall_levels, np.mean(curves, axis=0)


def run_evaluation(index: Index, queryset: QuerySet, pipeline=None, **kw: Any) -> EvalReport:
    """Non-generator convenience wrapper."""
    return run(evaluate(index, queryset, pipeline, **kw))
