"""Retrieval metrics for instance search, exactly as defined in the project's specification papers.

Every function here is pure, works on numpy arrays and is vectorized across queries.

Input representation (shared by every per-query function)
-----------------------------------------------------------
``rel`` : array of shape (Q, N)
    ``rel[q, j]`` is the relevance of the reference shown at **rank j + 1** for query ``q``
    (row ``q`` is the ranking of query ``q``, best first). Booleans, or integer grades
    (0 = not relevant, 1..3 = graded relevance for nDCG). Every binary metric treats a
    reference as relevant iff its grade is ``> 0``. ``N`` may be the whole collection or a
    truncated top-N list.
``n_rel`` : array of shape (Q,)
    Number of relevant references of each query **in the whole collection**, retrieved or not.
    This is ``REL_q`` of paper 004 and ``NG(q)`` of paper 001. It can never be smaller than the
    number of relevant references in the row.

Conventions
-----------
* Ranks are 1-based: the first column is rank 1.
* Ties: the metrics see positions, not scores. Ties in the scores must be broken before the
  metrics are called; :func:`museum_search.core.ranking.order` breaks them deterministically by the lower
  reference index (a stable sort on ``-score``). trec_eval breaks score ties differently (by
  document name), so comparisons against trec_eval must use distinct scores.
* Open-set queries (``n_rel == 0``: the query's instance has no reference image) have no defined
  value for any metric here: per-query functions return NaN for them, every mean ("M...", "A...")
  is taken over the evaluated queries only (``nanmean``), and :func:`summarize` reports how many
  queries were evaluated (``"queries"``) and how many were excluded (``"open_set_queries"``).
  Paper 004 removes such queries from CLICIDE ("12 query images which contain objects not present
  in the reference images ... have been filtered out").
* Per-instance relevance (the subtlety of instance search): a reference is relevant to a query iff
  **the reference's instance id is in the query's set of relevant instance ids**
  (:func:`relevance_matrix`). It is *not* "the reference has the same label as the query image
  file", *not* "the instance was found once": every reference image of a relevant instance is a
  separate relevant item (``n_rel`` counts images, not instances), and a query showing several
  instances (e.g. a glass cabinet) has several relevant instances. MP@1 therefore asks whether
  the top-ranked *reference image* belongs to a relevant instance; AP divides by the number of
  relevant *reference images*.
* Truncated rankings (``N`` smaller than the collection): relevant references that are not in
  the row ("not retrieved") contribute 0 to P@k, AP, mAP@p, R-precision and RR (trec_eval's
  convention; precision at k always divides by k). The rank-based measures (NMRR, NAR, MNRO)
  need a rank for them: they are placed at the end of the collection, at ranks
  ``n_collection - m + 1 .. n_collection`` (m = number not retrieved), i.e. the ranking is
  completed pessimistically. ``n_collection`` defaults to ``N`` (full rankings) and must leave
  room for them.
* All values are fractions in [0, 1] (MNRO, NMRR and NAR: 0 is perfect, lower is better; all the
  others: 1 is perfect, higher is better — see :data:`HIGHER_IS_BETTER`).

The metric table
----------------
:data:`METRICS` says, for every metric a run reports, its one key (the same for the mean and for
each query's value: per query, ``"map"`` holds the AP), its labels, its direction, its number
format and where it is shown; the runner, the reports, the statistics, the exports, the CLI and
the GUI take their lists of metrics from it (:data:`SUMMARY_METRICS`, :data:`QUERY_METRICS`,
:data:`HEADLINE_METRICS`, :data:`COMPARED`, :data:`PRINTED_METRICS`). Adding a metric: its
function here, its line in :func:`summarize`, its row in :data:`METRICS`, and a test.

Sources
-------
* 004 (evaluation protocol): P@k (Eq. preck), MP@1 (Eq. prec1), AP (Eq. ap), MAP (Eq. map).
* 001 (MNRO paper): AP (Eq. 3), ANMRR (Eqs. 5-9), NAR/ANAR (Eqs. 10-11), MNRO/AMNRO
  (Eqs. 13-19), P(10)/P(20); Table 1 is reproduced in ``tests/test_metrics.py``.
* 002: mAP@p (Eqs. 2-5) and nDCG@p with grades 0..3 (Eqs. 6-9).
* 000: Kendall tau-B with ties.
* The Met dataset (Ypsilantis et al., NeurIPS 2021 Datasets and Benchmarks track) and the Google
  Landmark Recognition challenge: GAP (Global Average Precision, micro-AP), the open-set
  recognition metric of :func:`global_average_precision` and :func:`gap_known`. Unlike the
  functions above it does not rank references per query: it ranks the *queries* by the
  confidence of their top-1 prediction, and open-set queries take part in it (as distractors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "COMPARED",
    "HEADLINE_METRICS",
    "HIGHER_IS_BETTER",
    "METRICS",
    "Metric",
    "OLD_QUERY_KEYS",
    "PRIMARY",
    "PRINTED_METRICS",
    "QUERY_METRICS",
    "SUMMARY_METRICS",
    "current_keys",
    "all_objects_found",
    "extra_objects_named",
    "MNRO_B",
    "MNRO_C",
    "relevance_matrix",
    "ideal_relevance",
    "precision_at_k",
    "mean_precision_at_1",
    "average_precision",
    "mean_average_precision",
    "average_precision_at_p",
    "map_at_p",
    "r_precision",
    "reciprocal_rank",
    "nmrr",
    "anmrr",
    "nar",
    "anar",
    "mnro_cutoff",
    "nro",
    "mnro",
    "amnro",
    "ndcg_at_p",
    "mean_ndcg_at_p",
    "kendall_tau_b",
    "global_average_precision",
    "gap_known",
    "summarize",
]

#: Gompertz parameters of paper 001 (Eq. 16, as printed). They solve NRO(ARANK=1) = 0.95 and
#: NRO(ARANK=0.5) = 0.5 (exactly: b = ln 0.5 / (ln 0.95 / ln 0.5)**0.5 = -9.36684...,
#: c = 2 ln(ln 0.95 / ln 0.5) = -5.20741...); the printed 4-decimal values are used, they are what
#: Table 1 was computed with.
MNRO_B = -9.3668
MNRO_C = -5.2074

# --------------------------------------------------------------------------------------------
# The metric table: how every view names, orders and shows the metrics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One metric as the runner, the reports, the exports, the CLI and the GUI name and show it.

    ``key`` is its only key: :func:`summarize`'s (the mean, and each query's value under
    ``per_query``), the run summary's, ``QueryRecord.metrics``' and the exports' per-query fields'
    (per query, ``"map"`` holds the query's AP, ``"amnro"`` its MNRO). See :data:`METRICS`."""

    key: str
    label: str  # the mean's name in tables, plots and the CLI, e.g. "MAP"
    query_label: str  # one query's value, e.g. "AP" (the per-query table, the histograms)
    higher_is_better: bool
    #: in a run's summary (``EvalReport.summary``, the JSON's; :data:`SUMMARY_METRICS`)
    summary: bool = True
    #: position among the per-query figures kept in each record and export (:data:`QUERY_METRICS`);
    #: 0: not kept per query
    column: int = 0
    #: shown wherever a run is summed up (:data:`HEADLINE_METRICS`): the CLI, the Evaluation tab's
    #: status, run tooltips, sweep and comparison tables; with a per-query mean also given a 95 %
    #: interval, a paired test against a baseline, a running curve and a per-query column (:data:`COMPARED`)
    headline: bool = False
    printed: bool = False  # printed by ``evaluate`` after the headline ones (:data:`PRINTED_METRICS`)
    #: the mean of per-query values (False: GAP, over every answer's confidence, without per-query values)
    mean: bool = True
    binary: bool = False  # each query's value is 0 or 1 (P@1): no distribution to plot
    companion: str = ""  # a summary key shown with it in brackets (GAP: "gap_known")
    companion_label: str = ""  # the companion's name in brackets, e.g. "known"
    description: str = ""  # one query's value in words (tooltip of its per-query column)
    tip: str = ""  # the metric in words (tooltip of its column in the sweep and comparison tables)
    #: its per-query key in the exports written before the keys were unified (read back: :func:`current_keys`)
    old_key: str = ""
    fmt: str = ".3f"  # a value in the GUI's tables and texts (a fraction: 0.975)
    percent_fmt: str = "6.2f"  # a value in percent, as ``evaluate`` prints it (" 97.53")

    @property
    def better(self) -> str:
        """``"higher"`` or ``"lower"`` (is better)."""
        return "higher" if self.higher_is_better else "lower"

    @property
    def compared(self) -> bool:
        """A headline mean of per-query values: intervals, paired tests, running curves."""
        return self.headline and self.mean

    def text(self, value: float | None) -> str:
        """``value`` as the GUI shows it ("—" for None or NaN)."""
        return "—" if value is None or not np.isfinite(value) else format(value, self.fmt)

    def percent(self, value: float | None) -> str:
        """``value`` in percent as ``evaluate`` prints it ("   n/a" for None)."""
        return "   n/a" if value is None else format(100 * value, self.percent_fmt)


#: Every metric, in display order (the summary's, the CLI's, the GUI's). Adding a metric: its
#: function above, its line in :func:`summarize`, its row here, and a test.
METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("mp@1", "MP@1", "P@1", True, column=1, headline=True, binary=True, old_key="p@1",
           description="Is the top-ranked reference relevant?"),
    Metric("map", "MAP", "AP", True, column=3, headline=True, old_key="ap",
           description="Average precision (higher is better)"),
    Metric("amnro", "AMNRO", "MNRO", False, column=4, headline=True, old_key="mnro",
           description="Mean normalized retrieval order (0 is perfect, lower is better)"),
    Metric("gap", "GAP", "", True, headline=True, mean=False, companion="gap_known", companion_label="known",
           tip="GAP (Global Average Precision, the Met dataset's open-set metric): every query, known and unknown, "
               "sorted by its answer's confidence; the precision of the right top-1 answers along that order, "
               "averaged over the known queries (1 is perfect: every known query right and surer than every "
               "unknown one). In brackets: over the known queries only."),
    Metric("anmrr", "ANMRR", "NMRR", False, column=5, printed=True, old_key="nmrr"),
    Metric("p@5", "P@5", "P@5", True, column=2, printed=True, old_key="p@5"),
    Metric("mrr", "MRR", "RR", True, column=6, old_key="rr"),
    Metric("r-precision", "R-precision", "R-precision", True),
    Metric("p@10", "P@10", "P@10", True),
    Metric("anar", "ANAR", "NAR", False, summary=False),
    Metric("all_objects", "All-objects", "", True, mean=False, printed=True,
           tip="All objects found: the share of the photos showing objects of the collection whose every "
               "such object is named among the answer's objects (a photo of two works counts both)"),
    Metric("extra_objects", "Extra-objects", "", False, mean=False, printed=True,
           tip="Extra objects named: the share of the photos whose answer names an object they do not show "
               "(0 is perfect)"),
)}
#: The means of a run's summary, in order (the runner's ``summary_of``; GAP comes from the answers).
SUMMARY_METRICS = {k: m for k, m in METRICS.items() if m.summary and m.mean}
#: The per-query figures kept in each record (``QueryRecord.metrics``) and export, in column order.
QUERY_METRICS = {m.key: m for m in sorted((m for m in METRICS.values() if m.column), key=lambda m: m.column)}
#: The figures shown wherever a run is summed up.
HEADLINE_METRICS = {k: m for k, m in METRICS.items() if m.headline}
#: The headline means: 95 % intervals, paired tests against a baseline, running means, per-query columns.
COMPARED = {k: m for k, m in METRICS.items() if m.compared}
#: What ``evaluate`` prints, in order.
PRINTED_METRICS = {k: m for k, m in METRICS.items() if m.headline or m.printed}
#: The metric a sweep's best value is chosen by (and plotted first).
PRIMARY = METRICS["map"]
#: Direction of every metric of the table (``True``: higher is better).
HIGHER_IS_BETTER: dict[str, bool] = {k: m.higher_is_better for k, m in METRICS.items()}
#: Per-query keys of older exports → today's keys.
OLD_QUERY_KEYS = {m.old_key: m.key for m in QUERY_METRICS.values() if m.old_key and m.old_key != m.key}


def current_keys(query: Mapping[str, Any]) -> dict[str, Any]:
    """One query of an exported run (JSON) with today's per-query keys: an export written before
    the keys were unified names them ``p@1``, ``ap``, ``mnro``, ``nmrr``, ``rr``
    (:data:`OLD_QUERY_KEYS`); a key already there wins."""
    renamed = {old: new for old, new in OLD_QUERY_KEYS.items() if old in query and new not in query}
    return {renamed.get(k, k): v for k, v in query.items()}


# --------------------------------------------------------------------------------------------
# Building the relevance matrix
# --------------------------------------------------------------------------------------------


def _label_grades(
    ref_labels: np.ndarray, relevant: Sequence[Iterable | Mapping]
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(codes of the references, (Q, n_codes) grade table, graded?)."""
    ref_labels = np.asarray(ref_labels)
    if ref_labels.ndim != 1:
        raise ValueError(f"ref_labels must be 1-D, got shape {ref_labels.shape}")
    uniq, codes = np.unique(ref_labels, return_inverse=True)
    graded = any(isinstance(r, Mapping) for r in relevant)
    table = np.zeros((len(relevant), len(uniq)), dtype=np.int64 if graded else bool)
    lookup = {lab.item() if hasattr(lab, "item") else lab: i for i, lab in enumerate(uniq)}
    for q, rset in enumerate(relevant):
        items = rset.items() if isinstance(rset, Mapping) else ((lab, 1) for lab in rset)
        for lab, grade in items:
            i = lookup.get(lab)
            if i is None:  # an instance with no reference image: contributes nothing
                continue
            if graded:
                if int(grade) < 0:
                    raise ValueError(f"query {q}: negative grade {grade} for instance {lab!r}")
                table[q, i] = int(grade)
            else:
                table[q, i] = True
    return codes.reshape(-1), table, graded


def relevance_matrix(
    rankings: np.ndarray,
    ref_labels: np.ndarray,
    relevant: Sequence[Iterable | Mapping],
) -> tuple[np.ndarray, np.ndarray]:
    """Relevance of each ranked reference, and the number of relevant references per query.

    Parameters
    ----------
    rankings : (Q, N') int
        Reference indices, best first (``rankings[q, j]`` is the reference at rank ``j + 1``).
        ``N'`` may be smaller than the number of references (truncated lists).
    ref_labels : (N,)
        The instance id of every reference of the collection.
    relevant : list of Q sets (or mappings)
        ``relevant[q]`` is the set of instance ids relevant to query ``q``. A mapping
        ``{instance id: grade}`` gives graded relevance (grades ``> 0`` are relevant).

    Returns
    -------
    rel : (Q, N') bool (int64 grades if any ``relevant[q]`` is a mapping)
        ``rel[q, j]`` is True iff **the instance of reference ``rankings[q, j]`` is in
        ``relevant[q]``**. This is the per-instance rule: a reference counts because of its
        instance, every reference image of a relevant instance counts separately.
    n_rel : (Q,) int64
        Number of references in the *whole collection* (all of ``ref_labels``, not only the
        ranked ones) whose instance is relevant to the query. 0 marks an open-set query.
    """
    rankings = np.asarray(rankings)
    if rankings.ndim != 2:
        raise ValueError(f"rankings must be 2-D (queries, ranks), got shape {rankings.shape}")
    if len(relevant) != rankings.shape[0]:
        raise ValueError(
            f"{len(relevant)} relevant sets for {rankings.shape[0]} ranked queries"
        )
    codes, table, graded = _label_grades(ref_labels, relevant)
    if rankings.size and (rankings.min() < 0 or rankings.max() >= codes.size):
        raise ValueError(f"rankings hold indices outside 0..{codes.size - 1}")
    ranked_codes = codes[rankings]  # (Q, N')
    rel = np.take_along_axis(table, ranked_codes, axis=1)
    per_code = np.bincount(codes, minlength=table.shape[1])
    n_rel = ((table > 0).astype(np.int64) @ per_code).astype(np.int64)
    return rel, n_rel


def ideal_relevance(
    ref_labels: np.ndarray, relevant: Sequence[Iterable | Mapping], depth: int | None = None
) -> np.ndarray:
    """Grades of the ideal ranking of the whole collection, best first, (Q, depth).

    This is what :func:`ndcg_at_p` needs as ``ideal`` when the rankings are truncated (the ideal
    DCG is over the whole collection, not over the retrieved list).
    """
    codes, table, _ = _label_grades(ref_labels, relevant)
    grades = table.astype(np.int64)[:, codes]
    ideal = -np.sort(-grades, axis=1)
    return ideal if depth is None else ideal[:, :depth]


# --------------------------------------------------------------------------------------------
# Shared internal representation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pos:
    """Positions of the relevant references, computed once and shared by all metrics."""

    n_q: int
    n_ranked: int
    n_rel: np.ndarray  # (Q,) int64
    evaluated: np.ndarray  # (Q,) bool, n_rel > 0
    q: np.ndarray  # (R,) query index of each retrieved relevant reference (sorted)
    rank: np.ndarray  # (R,) its 1-based rank
    k: np.ndarray  # (R,) 1-based index among the query's relevant references (k-th relevant)
    found: np.ndarray  # (Q,) int64 number of relevant references in the row


def _positions(rel, n_rel) -> _Pos:
    rel = np.asarray(rel)
    if rel.ndim != 2:
        raise ValueError(f"rel must be 2-D (queries, ranks), got shape {rel.shape}")
    relb = rel if rel.dtype == bool else rel > 0
    n_rel = np.asarray(n_rel)
    if n_rel.shape != (rel.shape[0],):
        raise ValueError(f"n_rel must have shape ({rel.shape[0]},), got {n_rel.shape}")
    if n_rel.size and (np.any(n_rel < 0) or np.any(n_rel != np.round(n_rel))):
        raise ValueError("n_rel must hold non-negative integers")
    n_rel = n_rel.astype(np.int64)
    q, col = np.nonzero(relb)
    found = np.bincount(q, minlength=rel.shape[0]).astype(np.int64)
    bad = np.flatnonzero(found > n_rel)
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"query {i}: {found[i]} relevant references ranked but n_rel says {n_rel[i]}; "
            "n_rel must count the relevant references of the whole collection"
        )
    start = np.concatenate(([0], np.cumsum(found)[:-1]))
    k = np.arange(q.size, dtype=np.int64) - start[q] + 1
    return _Pos(
        n_q=rel.shape[0],
        n_ranked=rel.shape[1],
        n_rel=n_rel,
        evaluated=n_rel > 0,
        q=q,
        rank=col.astype(np.int64) + 1,
        k=k,
        found=found,
    )


def _nan_open(values: np.ndarray, pos: _Pos) -> np.ndarray:
    out = np.asarray(values, dtype=np.float64).copy()
    out[~pos.evaluated] = np.nan
    return out


def _mean(per_query: np.ndarray) -> float:
    """Mean over the evaluated (non-NaN) queries; NaN if there is none (no warning)."""
    ok = ~np.isnan(per_query)
    return float(per_query[ok].mean()) if ok.any() else float("nan")


def _qsum(pos: _Pos, values: np.ndarray) -> np.ndarray:
    return np.bincount(pos.q, weights=values, minlength=pos.n_q)


def _collection(pos: _Pos, n_collection: int | None) -> tuple[int, np.ndarray]:
    """Collection size and the number of relevant references missing from each row."""
    n_col = pos.n_ranked if n_collection is None else int(n_collection)
    if n_col < pos.n_ranked:
        raise ValueError(f"n_collection={n_col} is smaller than the ranking length {pos.n_ranked}")
    missing = np.where(pos.evaluated, pos.n_rel - pos.found, 0)
    short = np.flatnonzero(pos.n_ranked + missing > n_col)
    if short.size:
        i = short[0]
        raise ValueError(
            f"query {i}: {missing[i]} relevant references are not in its ranking of "
            f"{pos.n_ranked}, but the collection has only {n_col} references; pass the "
            "collection size as n_collection (truncated rankings) or check n_rel"
        )
    return n_col, missing


# --------------------------------------------------------------------------------------------
# Precision-oriented metrics (papers 004, 001, 002)
# --------------------------------------------------------------------------------------------


def _p_at_k(pos: _Pos, k: int) -> np.ndarray:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    hits = np.bincount(pos.q[pos.rank <= k], minlength=pos.n_q)
    return _nan_open(hits / float(k), pos)


def precision_at_k(rel: np.ndarray, n_rel: np.ndarray, k: int) -> np.ndarray:
    """P_q@k = RR_q^k / k (paper 004, Eq. preck; paper 001's P(10), P(20)), shape (Q,).

    RR_q^k is the number of relevant references among ranks 1..k (1-based). The denominator is
    always ``k``, also when the row is shorter than ``k`` (missing positions count as not
    relevant, as in trec_eval). NaN for open-set queries (``n_rel == 0``).

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _p_at_k(_positions(rel, n_rel), k)


def mean_precision_at_1(rel: np.ndarray, n_rel: np.ndarray) -> float:
    """MP@1 = (1/Q) sum_q P_q@1 (paper 004, Eq. prec1), as a fraction in [0, 1].

    P_q@1 is 1 iff the reference at rank 1 is relevant (its instance is in the query's relevant
    set). Q counts the evaluated queries only: open-set queries are excluded.
    """
    return _mean(precision_at_k(rel, n_rel, 1))


def _ap(pos: _Pos) -> np.ndarray:
    prec_at_hits = pos.k / pos.rank  # P@rank(k) at the k-th relevant reference
    with np.errstate(divide="ignore", invalid="ignore"):
        ap = _qsum(pos, prec_at_hits) / pos.n_rel
    return _nan_open(ap, pos)


def average_precision(rel: np.ndarray, n_rel: np.ndarray) -> np.ndarray:
    """AP_q = (1/REL_q) sum_{k=1}^{RET} rel(k) P_q@k (paper 004, Eq. ap; paper 001, Eq. 3).

    ``k`` runs over the 1-based ranks of the row, ``rel(k)`` is 1 iff the reference at rank k is
    relevant, REL_q = ``n_rel[q]`` counts **all** relevant references of the collection, so a
    relevant reference that is not retrieved contributes 0 (trec_eval's ``map``). Shape (Q,),
    NaN for open-set queries.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _ap(_positions(rel, n_rel))


def mean_average_precision(rel: np.ndarray, n_rel: np.ndarray) -> float:
    """MAP = (1/Q) sum_q AP_q over the evaluated queries (paper 004, Eq. map; paper 001, Eq. 4)."""
    return _mean(average_precision(rel, n_rel))


def _ap_at_p(pos: _Pos, p: int) -> np.ndarray:
    if int(p) < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    top = pos.rank <= p
    num = np.bincount(pos.q[top], weights=(pos.k / pos.rank)[top], minlength=pos.n_q)
    den = np.bincount(pos.q[top], minlength=pos.n_q)
    with np.errstate(divide="ignore", invalid="ignore"):
        ap = np.where(den > 0, num / np.maximum(den, 1), 0.0)
    return _nan_open(ap, pos)


def average_precision_at_p(rel: np.ndarray, n_rel: np.ndarray, p: int) -> np.ndarray:
    """AP_q@p of paper 002 (Eq. 2): sum_{r<=p} P_q(r) R_q(r) / sum_{r<=p} R_q(r).

    Unlike :func:`average_precision`, the denominator is the number of relevant references
    **within the top p** (ranks 1..p), not all relevant references of the collection. Paper 002
    leaves 0/0 (no relevant reference in the top p) undefined; it is 0 here (the query found
    nothing), which is what the reference hashing evaluation code effectively does (it skips the
    query in the sum but still divides by the number of queries). Shape (Q,), NaN for open-set
    queries. Eq. 2 prints ``R_r`` in the denominator: read as ``R_q`` (typo).

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _ap_at_p(_positions(rel, n_rel), p)


def map_at_p(rel: np.ndarray, n_rel: np.ndarray, p: int) -> float:
    """mAP@p = (1/U3) sum_q AP_q@p (paper 002, Eq. 5), over the evaluated queries."""
    return _mean(average_precision_at_p(rel, n_rel, p))


def _r_precision(pos: _Pos) -> np.ndarray:
    hits = np.bincount(pos.q[pos.rank <= pos.n_rel[pos.q]], minlength=pos.n_q)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _nan_open(hits / pos.n_rel, pos)


def r_precision(rel: np.ndarray, n_rel: np.ndarray) -> np.ndarray:
    """R-precision: P_q@R with R = ``n_rel[q]`` (trec_eval ``Rprec``). Shape (Q,), NaN if open-set.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _r_precision(_positions(rel, n_rel))


def _rr(pos: _Pos) -> np.ndarray:
    first = np.zeros(pos.n_q)
    is_first = pos.k == 1
    first[pos.q[is_first]] = 1.0 / pos.rank[is_first]
    return _nan_open(first, pos)


def reciprocal_rank(rel: np.ndarray, n_rel: np.ndarray) -> np.ndarray:
    """1 / (1-based rank of the first relevant reference); 0 if none is in the row. (Q,).

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _rr(_positions(rel, n_rel))


# --------------------------------------------------------------------------------------------
# Rank-based measures of paper 001 (lower is better)
# --------------------------------------------------------------------------------------------


def _missing_ranks(pos: _Pos, n_col: int, missing: np.ndarray):
    """(query, rank, k) of the relevant references not in the row, placed at the end."""
    qm = np.repeat(np.arange(pos.n_q), missing)
    if qm.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    start = np.concatenate(([0], np.cumsum(missing)[:-1]))
    i = np.arange(qm.size, dtype=np.int64) - start[qm] + 1  # 1..m
    rank = n_col - missing[qm] + i
    k = pos.found[qm] + i
    return qm, rank, k


def _nmrr(pos: _Pos, x, gtm, n_collection) -> np.ndarray:
    n_col, missing = _collection(pos, n_collection)
    ng = pos.n_rel.astype(np.float64)
    if x is None:
        xq = np.where(pos.n_rel > 50, 2.0, 4.0)  # MPEG-7 rule, paper 001 below Eq. 6
    else:
        if float(x) <= 0:
            raise ValueError(f"x must be positive, got {x}")
        xq = np.full(pos.n_q, float(x))
    max_ng = int(pos.n_rel.max()) if pos.n_q else 0
    if gtm is None:
        gtm = max_ng  # GTM = max NG(q) over the queries of the data set (paper 001)
    elif float(gtm) < max_ng:
        raise ValueError(
            f"gtm={gtm} is smaller than the largest ground truth ({max_ng}); GTM is the "
            "maximum NG(q) over all queries of the data set"
        )
    big_k = np.minimum(xq * ng, 2.0 * float(gtm))  # Eq. 6
    qm, rank_m, _ = _missing_ranks(pos, n_col, missing)
    q_all = np.concatenate((pos.q, qm))
    r_all = np.concatenate((pos.rank, rank_m)).astype(np.float64)
    kq = big_k[q_all]
    eff = np.where(r_all <= kq, r_all, 1.25 * kq)  # Rank(k) = R if within the first K, else 1.25K
    with np.errstate(divide="ignore", invalid="ignore"):
        avr = np.bincount(q_all, weights=eff, minlength=pos.n_q) / ng  # Eq. 5
        mrr = avr - 0.5 * (1.0 + ng)  # Eq. 7
        out = mrr / (1.25 * big_k - 0.5 * (1.0 + ng))  # Eq. 8
    return _nan_open(out, pos)


def nmrr(
    rel: np.ndarray,
    n_rel: np.ndarray,
    *,
    x: float | None = None,
    gtm: float | None = None,
    n_collection: int | None = None,
) -> np.ndarray:
    """NMRR(q) of MPEG-7 (paper 001, Eqs. 5-8), shape (Q,), 0 is perfect, 1 is worst.

    K = min(X * NG(q), 2 * GTM) (Eq. 6). A relevant reference at 1-based rank R counts as R if
    R <= K, else as 1.25 * K (not retrieved). AVR = mean of these over the NG(q) relevant
    references, MRR = AVR - 0.5 (1 + NG), NMRR = MRR / (1.25 K - 0.5 (1 + NG)).

    ``x``: None applies the MPEG-7 rule of paper 001 (X = 2 if NG(q) > 50 else 4); a number fixes
    X for every query. ``gtm``: None uses GTM = max NG(q) over the *queries passed in* (the paper's
    "for all q's of a data set": pass all the data set's queries together, or pass ``gtm``
    explicitly); ``np.inf`` makes the 2·GTM bound inactive, which is how Table 1 of paper 001
    reproduces (K = 4·NG = 20 for NG = 5, although that table has a single query). Relevant
    references outside a truncated row are ranked at the end of the collection (module doc).
    NaN for open-set queries.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _nmrr(_positions(rel, n_rel), x, gtm, n_collection)


def anmrr(rel: np.ndarray, n_rel: np.ndarray, **kwargs) -> float:
    """ANMRR = mean NMRR over the evaluated queries (paper 001, Eq. 9). Keywords as :func:`nmrr`."""
    return _mean(nmrr(rel, n_rel, **kwargs))


def _nar(pos: _Pos, n_collection) -> np.ndarray:
    n_col, missing = _collection(pos, n_collection)
    qm, rank_m, _ = _missing_ranks(pos, n_col, missing)
    rank_sum = _qsum(pos, pos.rank.astype(np.float64)) + np.bincount(
        qm, weights=rank_m.astype(np.float64), minlength=pos.n_q
    )
    ng = pos.n_rel.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (rank_sum - ng * (ng + 1) / 2) / (n_col * ng)  # Eq. 10
    return _nan_open(out, pos)


def nar(rel: np.ndarray, n_rel: np.ndarray, *, n_collection: int | None = None) -> np.ndarray:
    """Normalized Averaged Rank (paper 001, Eq. 10), shape (Q,), 0 is perfect.

    NAR = (sum_i Rank(i) - sum_{i=1}^{NG} i) / (N * NG) with 1-based ranks of the NG(q) relevant
    references and N = ``n_collection`` (default: the row length, i.e. full rankings).
    NaN for open-set queries.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _nar(_positions(rel, n_rel), n_collection)


def anar(rel: np.ndarray, n_rel: np.ndarray, *, n_collection: int | None = None) -> float:
    """ANAR = mean NAR over the evaluated queries (paper 001, Eq. 11)."""
    return _mean(nar(rel, n_rel, n_collection=n_collection))


def mnro_cutoff(n_rel: np.ndarray, n_collection: int, *, literal_eq15: bool = False) -> np.ndarray:
    """K of MNRO (paper 001, Eqs. 14-15) from the query generality g(q) = NG(q) / N.

    K = 4·NG(q) if g(q) >= 0.01, else F[g(q)]·NG(q).

    * Default, continuous reading (README of the specification): F[g] = 0.04 / g, so
      K = 0.04·N below g = 0.01; K is continuous at g = 0.01 (both branches give 4·NG).
    * ``literal_eq15=True``: Eq. 15 as printed, F[g] = 0.04 / g × NG(q), so K = 0.04·N·NG(q)
      below g = 0.01; K jumps from 4·NG to 4·NG² at g = 0.01 when NG > 1 (identical for NG = 1).

    The test g >= 0.01 is done exactly in integers (100·NG >= N). Returns float64 (Q,); NaN where
    NG = 0 (open set).
    """
    ng = np.asarray(n_rel, dtype=np.int64)
    n_col = int(n_collection)
    if n_col < 1:
        raise ValueError(f"n_collection must be >= 1, got {n_collection}")
    high = 100 * ng >= n_col
    low_k = 0.04 * n_col * (ng if literal_eq15 else 1)
    k = np.where(high, 4.0 * ng, low_k).astype(np.float64)
    k[ng <= 0] = np.nan
    return k


def nro(rank, k, big_k) -> np.ndarray:
    """NRO of the k-th relevant reference found at 1-based rank ``rank`` (paper 001, Eqs. 16-17).

    NRO = 0 if k / Rank(k) = 1 (the first k ranks are all relevant), else
    exp(-9.3668 · exp(-5.2074 · ARANK)) with ARANK = (Rank(k) - 1) / (K - 1).
    Broadcasts over its arguments. NRO(K) = 0.95, NRO((K+1)/2) = 0.5; it tends to 1, never 0.
    """
    rank = np.asarray(rank, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    big_k = np.asarray(big_k, dtype=np.float64)
    arank = (rank - 1.0) / (big_k - 1.0)
    val = np.exp(MNRO_B * np.exp(MNRO_C * arank))
    return np.where(rank == k, 0.0, val)


def _mnro(pos: _Pos, n_collection, literal_eq15: bool) -> np.ndarray:
    n_col, missing = _collection(pos, n_collection)
    big_k = mnro_cutoff(pos.n_rel, n_col, literal_eq15=literal_eq15)
    qm, rank_m, k_m = _missing_ranks(pos, n_col, missing)
    total = _qsum(pos, nro(pos.rank, pos.k, big_k[pos.q]))
    if qm.size:
        total += np.bincount(qm, weights=nro(rank_m, k_m, big_k[qm]), minlength=pos.n_q)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = total / pos.n_rel  # Eq. 18
    return _nan_open(out, pos)


def mnro(
    rel: np.ndarray,
    n_rel: np.ndarray,
    *,
    n_collection: int | None = None,
    literal_eq15: bool = False,
) -> np.ndarray:
    """MNRO(q) = (1/NG(q)) sum_{k=1}^{NG(q)} NRO(k) (paper 001, Eq. 18), shape (Q,), 0 is perfect.

    Every relevant reference contributes, however late (no cut-off as in NMRR): the k-th
    relevant reference at 1-based rank Rank(k) gets :func:`nro` (Gompertz curve, Eqs. 16-17)
    with K from :func:`mnro_cutoff` (Eqs. 14-15; ``literal_eq15`` selects the reading, see
    there). The generality uses N = ``n_collection`` (default: the row length, full rankings).
    Relevant references outside a truncated row are placed at the end of the collection.
    Lower is better. NaN for open-set queries.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); a reference is relevant
    iff its grade is > 0, i.e. its instance is in the query's relevant set (per-instance rule);
    score ties must already be broken in ``rel`` (see :func:`museum_search.core.ranking.order`).
    """
    return _mnro(_positions(rel, n_rel), n_collection, literal_eq15)


def amnro(rel: np.ndarray, n_rel: np.ndarray, **kwargs) -> float:
    """AMNRO = mean MNRO over the evaluated queries (paper 001, Eq. 19); keywords: :func:`mnro`."""
    return _mean(mnro(rel, n_rel, **kwargs))


# --------------------------------------------------------------------------------------------
# Graded relevance (paper 002) and rank correlation (paper 000)
# --------------------------------------------------------------------------------------------


def _dcg(grades: np.ndarray, p: int) -> np.ndarray:
    g = np.asarray(grades, dtype=np.float64)[:, :p]
    disc = 1.0 / np.log2(np.arange(2, g.shape[1] + 2, dtype=np.float64))  # 1/log2(r+1), r>=1
    return (np.exp2(g) - 1.0) @ disc


def ndcg_at_p(rel: np.ndarray, p: int, ideal: np.ndarray | None = None) -> np.ndarray:
    """nDCG_q@p of paper 002 (Eqs. 6-8), graded relevance V in {0, 1, 2, 3}. Shape (Q,).

    DCG_q@p = sum_{r=1}^{p} (2^V(r) - 1) / log2(r + 1) over 1-based ranks r of the row;
    nDCG_q@p = DCG_q@p / iDCG_q@p, where iDCG is the DCG of the best possible ranking of the
    **whole collection**. ``ideal`` (Q, M): the grades of the query's references in any order
    (e.g. :func:`ideal_relevance`); by default the row itself (correct when the rows rank the
    whole collection, or contain every reference with a grade > 0). Queries whose ideal DCG is 0
    (no reference with grade > 0: open set) are NaN. Boolean ``rel`` means grades 0/1.

    Relation to ``sklearn.metrics.ndcg_score``: identical when sklearn is given the gains
    ``2**V - 1`` as ``y_true`` (sklearn uses the grade itself as the gain), scores without ties
    (sklearn averages the gains of tied scores) and only queries with a relevant reference
    (sklearn returns 0 for an all-zero ``y_true``, here it is NaN/excluded). trec_eval's
    ``ndcg_cut`` likewise uses linear gains.

    Conventions: ranks are 1-based (column j of ``rel`` is rank j + 1); the grade of a reference
    is the grade of its instance for the query; score ties must already be broken in ``rel``.
    """
    rel = np.asarray(rel)
    if rel.ndim != 2:
        raise ValueError(f"rel must be 2-D (queries, ranks), got shape {rel.shape}")
    if int(p) < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    if np.any(rel < 0):
        raise ValueError("grades must be >= 0")
    ideal_src = rel if ideal is None else np.asarray(ideal)
    if ideal_src.ndim != 2 or ideal_src.shape[0] != rel.shape[0]:
        raise ValueError(f"ideal must have shape ({rel.shape[0]}, M), got {ideal_src.shape}")
    best = -np.sort(-np.asarray(ideal_src, dtype=np.int64), axis=1)
    idcg = _dcg(best, p)
    dcg = _dcg(rel, p)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(idcg > 0, dcg / idcg, np.nan)
    return out


def mean_ndcg_at_p(rel: np.ndarray, p: int, ideal: np.ndarray | None = None) -> float:
    """nDCG@p = (1/U3) sum_q nDCG_q@p (paper 002, Eq. 9), over queries with a relevant reference."""
    return _mean(ndcg_at_p(rel, p, ideal))


def kendall_tau_b(
    system,
    ground_truth,
    *,
    system_is_rank: bool = False,
    ground_truth_is_rank: bool = False,
    max_block_elements: int = 4_000_000,
):
    """Kendall tau-B between a system's ordering and a human ground truth, with ties (paper 000).

    tau_B = (|C| - |D|) / sqrt((|C| + |D| + |T_x|)(|C| + |D| + |T_y|)) over all pairs i < j,
    with C concordant, D discordant, T_x tied only in x (ground truth), T_y tied only in y
    (system); pairs tied in both are ignored. Same as ``scipy.stats.kendalltau(variant='b')``.

    ``system``: scores (higher = more similar, default) or 1-based rank positions
    (``system_is_rank=True``, 1 = best). ``ground_truth``: grades/mean scores (higher = more
    similar) or ranks (``ground_truth_is_rank=True``). Ranks are negated internally, so a
    positive tau always means "the system orders like the humans". 1-D inputs give a float;
    2-D (G, n) inputs give one tau per row (G,). NaN when either side is constant. Cost O(n²)
    per row, computed in blocks of at most ``max_block_elements`` pair elements.
    """
    x = np.asarray(ground_truth, dtype=np.float64)
    y = np.asarray(system, dtype=np.float64)
    if x.shape != y.shape or x.ndim not in (1, 2):
        raise ValueError(
            f"system {y.shape} and ground_truth {x.shape} must be equal 1-D or 2-D shapes"
        )
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("kendall_tau_b does not accept NaN")
    single = x.ndim == 1
    x2, y2 = np.atleast_2d(x), np.atleast_2d(y)
    if ground_truth_is_rank:
        x2 = -x2
    if system_is_rank:
        y2 = -y2
    g, n = x2.shape
    s_xy = np.zeros(g)
    s_xx = np.zeros(g)
    s_yy = np.zeros(g)
    block = max(1, int(max_block_elements // max(1, g * n)))
    # Sum over all ordered pairs (i, j): symmetric, so twice the i < j sums; the ratio is unchanged.
    for a in range(0, n, block):
        sx = np.sign(x2[:, a : a + block, None] - x2[:, None, :])
        sy = np.sign(y2[:, a : a + block, None] - y2[:, None, :])
        s_xy += np.einsum("gij,gij->g", sx, sy)
        s_xx += np.abs(sx).sum(axis=(1, 2))  # pairs not tied in x: C + D + T_y
        s_yy += np.abs(sy).sum(axis=(1, 2))  # pairs not tied in y: C + D + T_x
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = np.where((s_xx > 0) & (s_yy > 0), s_xy / np.sqrt(s_xx * s_yy), np.nan)
    return float(tau[0]) if single else tau


# --------------------------------------------------------------------------------------------
# Open-set recognition: GAP (The Met dataset; Google Landmark Recognition)
# --------------------------------------------------------------------------------------------


def _gap_inputs(confidence, correct, known) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated (Q,) float64 confidence, bool correct, bool known."""
    try:
        conf = np.asarray(confidence, dtype=np.float64)  # None -> NaN
    except (TypeError, ValueError) as exc:
        raise ValueError(f"confidence must be numbers (or None/NaN): {exc}") from None
    if conf.ndim != 1:
        raise ValueError(f"confidence must be 1-D (one value per query), got shape {conf.shape}")
    out = [conf]
    for name, arr in (("correct", correct), ("known", known)):
        a = np.asarray(arr)
        if a.shape != conf.shape:
            raise ValueError(f"{name} must have shape {conf.shape} like confidence, got {a.shape}")
        if a.dtype != bool:
            if a.size and not np.all((a == 0) | (a == 1)):
                raise ValueError(f"{name} must be boolean (or 0/1)")
            a = a.astype(bool)
        out.append(a)
    return out[0], out[1], out[2]


def _gap(conf: np.ndarray, rel: np.ndarray, m: int) -> float:
    if m == 0:
        return float("nan")
    order = np.argsort(-conf, kind="stable")  # descending; ties keep query order; NaN last
    hits = np.cumsum(rel[order])
    prec = hits / np.arange(1, conf.size + 1, dtype=np.float64)  # P(i), i = 1..Q
    return float(prec[rel[order]].sum() / m)


def global_average_precision(confidence, correct, known) -> float:
    """GAP = (1/M) sum_{i=1}^{Q} rel(i) P(i), Global Average Precision (micro-AP), a float.

    The open-set recognition metric of the Met dataset (NeurIPS 2021 Datasets and Benchmarks
    track, "GAP") and of the Google Landmark Recognition challenge ("GAP at k = 1"). Every query
    makes one prediction, its top-1 instance, with a confidence; **all** Q queries, known and
    unknown, are sorted by that confidence, highest first, and i is the 1-based position of a
    query in that order. rel(i) = 1 iff the query at position i is known and its top-1 instance
    is right; P(i) = (number of rel among positions 1..i) / i; M = number of known queries.

    Parameters
    ----------
    confidence : (Q,) float
        Confidence of each query's top-1 prediction (higher = surer). NaN or None means the query
        made no prediction.
    correct : (Q,) bool (or 0/1)
        ``correct[q]`` is True iff the top-1 instance of query ``q`` is (one of) its relevant
        instance(s). Ignored for unknown queries (they have no right instance).
    known : (Q,) bool (or 0/1)
        ``known[q]`` is True iff the ground truth of query ``q`` is an instance of the
        collection; False for open-set queries / distractors ("not in the collection", Met's
        label -1, GLR's empty ground truth).

    Conventions
    -----------
    * Positions are 1-based (P(1) is the precision of the most confident query alone).
    * Unknown queries are ranked with the others: a confident prediction for a query whose
      object is not in the collection has rel = 0 and lowers P of every later query, so GAP
      rewards confidences that put distractors last. They never count in M.
    * M counts *all* known queries, whether predicted right or not: a known query that is wrong
      or makes no prediction contributes 0 to the sum but still 1 to M. With R right
      predictions, GAP = (R / M) x the average precision of the query order with the R right
      ones as positives (``tests/test_gap.py`` checks this against sklearn). GAP = 1 iff every
      known query is right and comes before every unknown query in the order.
    * Ties in confidence are broken by query order: a stable sort on ``-confidence``, so the
      earlier query comes first (the order changes the value: a right and a wrong query tied
      give P = 1 to the right one only if it comes first). The published reference codes
      (Met's ``gap``, the GLR Kaggle ``GAP_vector``) sort with an unstable quicksort and leave
      tied orders unspecified; without ties they agree with this function.
    * No prediction (NaN/None confidence): the query counts as *not right* (rel = 0, whatever
      ``correct`` says) and is placed after every query with a confidence (as GLR's reference
      code does with ``na_position='last'``), so it changes nothing but M if it is known.
      ``+inf``/``-inf`` are ordinary, extreme confidences.
    * No known query (M = 0, including Q = 0): NaN, like the per-query metrics of this module
      for open-set queries (no warning, no exception).

    The value is a fraction in [0, 1], higher is better. See :func:`gap_known` for the variant
    without distractors.
    """
    conf, correct_b, known_b = _gap_inputs(confidence, correct, known)
    rel = correct_b & known_b & ~np.isnan(conf)
    return _gap(conf, rel, int(known_b.sum()))


def gap_known(confidence, correct, known) -> float:
    """GAP over the known queries only: :func:`global_average_precision` of the subset ``known``.

    The Met dataset's "GAP without distractors" (its ``gap_non_distr``): the unknown (open-set)
    queries are removed *before* sorting, so they cannot push the known ones down; M, the
    denominator, is unchanged (the number of known queries). Always ``>=``
    :func:`global_average_precision` on the same inputs. Same parameters, conventions (stable
    tie-break by query order, NaN/None confidence = no prediction, placed last) and NaN for
    M = 0.
    """
    conf, correct_b, known_b = _gap_inputs(confidence, correct, known)
    conf_k = conf[known_b]
    rel = correct_b[known_b] & ~np.isnan(conf_k)
    return _gap(conf_k, rel, int(known_b.sum()))


def all_objects_found(named: Sequence[Iterable[str]], relevant: Sequence[Iterable[str]]) -> float:
    """The share of the photos with a relevant object (``relevant``: per photo, the instances it
    shows that the collection has) whose every relevant object is ``named`` (per photo, the
    instances the answer lists: ``Answer.objects``); NaN without such a photo."""
    shown = [(set(n), set(r)) for n, r in zip(named, relevant, strict=True) if set(r)]
    return float(np.mean([r <= n for n, r in shown])) if shown else float("nan")


def extra_objects_named(named: Sequence[Iterable[str]], relevant: Sequence[Iterable[str]]) -> float:
    """The share of the photos whose answer names an object that is not ``relevant`` to it (open-set
    photos included: any object named is extra); NaN without a photo."""
    pairs = [(set(n), set(r)) for n, r in zip(named, relevant, strict=True)]
    return float(np.mean([bool(n - r) for n, r in pairs])) if pairs else float("nan")


# --------------------------------------------------------------------------------------------
# Everything at once
# --------------------------------------------------------------------------------------------


def summarize(
    rel: np.ndarray,
    n_rel: np.ndarray,
    *,
    ks: Sequence[int] = (1, 5, 10, 20),
    n_collection: int | None = None,
    x: float | None = None,
    gtm: float | None = None,
    literal_eq15: bool = False,
    map_at: Sequence[int] = (),
) -> dict:
    """All binary-relevance metrics at once, sharing one pass over the relevant positions.

    Returns a dict with

    * ``"queries"``: number of evaluated queries (``n_rel > 0``),
      ``"open_set_queries"``: number of excluded open-set queries (``n_rel == 0``);
    * means over the evaluated queries, all fractions in [0, 1]: ``"mp@1"`` (= ``"p@1"``),
      ``"p@k"`` for each ``k`` in ``ks``, ``"map"``, ``"mrr"``, ``"r-precision"``,
      ``"map@p"`` for each ``p`` in ``map_at`` (paper 002), and the lower-is-better
      ``"anmrr"``, ``"anar"``, ``"amnro"``;
    * ``"per_query"``: dict with the same metric keys mapping to (Q,) arrays (AP under ``"map"``,
      NMRR under ``"anmrr"``, MNRO under ``"amnro"``, ...), NaN for open-set queries — the input
      of :mod:`museum_search.core.evaluation._stats`.

    Keywords are passed to :func:`nmrr` (``x``, ``gtm``), :func:`mnro` (``literal_eq15``) and
    the rank-based measures (``n_collection``). See :data:`HIGHER_IS_BETTER` for directions.
    """
    pos = _positions(rel, n_rel)
    per: dict[str, np.ndarray] = {}
    for k in sorted(set(int(k) for k in ks) | {1}):
        per[f"p@{k}"] = _p_at_k(pos, k)
    per["mp@1"] = per["p@1"]
    per["map"] = _ap(pos)
    for p in map_at:
        per[f"map@{int(p)}"] = _ap_at_p(pos, int(p))
    per["mrr"] = _rr(pos)
    per["r-precision"] = _r_precision(pos)
    ev = pos.evaluated
    per["anmrr"] = _nmrr(pos, x, gtm, n_collection)
    per["anar"] = _nar(pos, n_collection)
    per["amnro"] = _mnro(pos, n_collection, literal_eq15)
    out: dict = {
        "queries": int(ev.sum()),
        "open_set_queries": int((~ev).sum()),
    }
    for key, values in per.items():
        out[key] = _mean(values)
    out["per_query"] = per
    return out
