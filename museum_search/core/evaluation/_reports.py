"""Evaluation reports: JSON (summary + per-query records), CSV per query, TREC run + qrels.

The TREC files let anyone check the numbers with trec_eval: ``trec_eval -m map -m P.1 RUN.qrels
RUN.run`` gives the same MAP and P@1 as the summary (the run lists every reference with
strictly decreasing scores, so trec_eval's own tie-breaking cannot change the order).
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from museum_search.core.answer import QuerySettings, RerankOptions
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._metrics import COMPARED, PRIMARY, QUERY_METRICS, current_keys
from museum_search.core.evaluation._querysets import unknown_instances_note
from museum_search.core.evaluation._runner import EvalReport
from museum_search.core.evaluation._stats import PairedTestResult, bootstrap_ci, paired_test_by_query

#: The verdict's columns of the CSV export, after the metrics: "in the collection" (1/0), the
#: reason in words, the top object's inliers (empty: not verified) and the answer's confidence.
CSV_VERDICT_COLUMNS = ("in_collection", "reason", "inliers", "confidence")


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def unknown_instances_warning(summary: dict[str, Any], limit: int = 5) -> str | None:
    """The warning to show when the ground truth names instances the index does not have, else None.

    ``summary``: an evaluation summary (``EvalReport.summary`` or the JSON's). Such queries are not
    open-set queries: the ground truth has a typo, or the query set belongs to another index.
    """
    names = list(summary.get("unknown_instances") or [])
    if not names:
        return None
    excluded = int(summary.get("unknown_instance_queries") or 0)
    n = excluded + int(summary.get("partly_unknown_queries") or 0)
    return unknown_instances_note(n, names, excluded, limit)


def report_dict(report: EvalReport, index, rankings: bool = False, ci: bool = True, seed: int = 0) -> dict[str, Any]:
    """The JSON document of a run (metrics as fractions in 0..1).

    The summary counts the excluded queries in ``open_set_queries`` (ground truth explicitly
    empty) and ``unknown_instance_queries`` (ground truth names only instances missing from the
    index), lists those names in ``unknown_instances`` and counts ``partly_unknown_queries``
    (evaluated on their other instances); each query lists its ``unknown`` instances.
    """
    summary = {k: (_num(v) if isinstance(v, float) else v) for k, v in report.summary.items()}
    summary["rerank"] = report.rerank
    summary["index"] = report.index_description
    summary["query_set"] = report.queryset_description
    if ci:
        intervals = {}
        for key in COMPARED:
            values = report.per_query_values(key)
            if len(values):
                lo, hi = bootstrap_ci(values, seed=seed)
                intervals[key] = [_num(lo), _num(hi)]
        summary["ci95"] = intervals
    queries = []
    for r in report.records:
        q: dict[str, Any] = {"query": r.query, "relevant": r.relevant, "unknown": list(r.unknown)}
        q.update({k: _num(v) for k, v in r.metrics.items()})
        q["top"] = [index.items[int(i)].instance for i in r.ranking[:5]]
        q.update(in_collection=r.in_collection, reason=r.reason,
                 cosine=None if np.isnan(r.top_cosine) else round(float(r.top_cosine), 6), inliers=r.top_inliers,
                 rival_inliers=r.rival_inliers if r.top_inliers is not None else None,
                 confidence=_num(r.confidence),
                 objects=[{"instance": i, "confidence": round(float(c), 4)} for i, c in r.objects])
        if rankings:
            q["ranking"] = [str(index.root / index.items[int(i)].path) for i in r.ranking]
        queries.append(q)
    return {"summary": summary, "queries": queries,
            "skipped": [{"query": p, "reason": why} for p, why in report.skipped]}


def confidence_intervals(report: EvalReport, index, seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """``{metric: (mean, low, high)}`` for the :data:`COMPARED` metrics (MP@1, MAP, AMNRO): the report's
    95 % bootstrap intervals."""
    ci = report_dict(report, index, seed=seed)["summary"]["ci95"]
    return {m: (report.summary[m], *(math.nan if x is None else x for x in ci.get(m, (None, None))))
            for m in COMPARED}


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a crash leaves the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, path)


#: The CSV's per-query columns: the metrics, the top result, the verdict. ``top1_rank_score`` is
#: what the final ranking sorted by (the cosine, or a re-ranker's score such as ICFRR's, plus the
#: verification bonus of a verified reference: it can exceed 1); ``top1_cosine`` is the cosine.
CSV_METRICS = tuple(QUERY_METRICS)
CSV_QUERY_COLUMNS = ("query", "relevant", "open_set", *CSV_METRICS, "top1_instance", "top1_path",
                     "top1_rank_score", "top1_cosine", "unknown_instances", *CSV_VERDICT_COLUMNS)


def _cell(x: Any) -> str:
    """A CSV cell: empty for None or NaN, 1/0 for a bool, 6 decimals for a float."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, (bool, np.bool_)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6f}"
    return str(x)


def write_csv(report: EvalReport, index, path: Path, run: Mapping[str, Any] | None = None) -> None:
    """One line per query (:data:`CSV_QUERY_COLUMNS`); ``run``: more columns, the same on every line
    (the run's settings: :func:`museum_search.core.evaluation._export.write_run_csv`)."""
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    extra = dict(run or {})
    w.writerow([*CSV_QUERY_COLUMNS, *extra])
    tail = [_cell(v) for v in extra.values()]
    for r in report.records:
        top = index.items[int(r.ranking[0])]
        # open_set: the ground truth says the object is not in the collection (not an unknown name)
        w.writerow([r.query, ";".join(r.relevant), int(r.open_set and not r.unknown_only),
                    *(_cell(float(r.metrics[k])) for k in CSV_METRICS), top.instance, top.path,
                    _cell(float(r.scores[0])), _cell(float(r.top_cosine)), ";".join(r.unknown),
                    int(r.in_collection), r.reason, _cell(r.top_inliers), _cell(r.confidence), *tail])
    atomic_write(path, buf.getvalue())


def write_trec(report: EvalReport, index, prefix: Path, run_name: str = "museum-search") -> tuple[Path, Path]:
    """``PREFIX.run`` (qid Q0 docno rank score tag) and ``PREFIX.qrels`` (qid 0 docno 1)."""
    prefix = Path(prefix)
    run_lines, qrel_lines = [], []
    docnos = [it.path.replace(" ", "_") for it in index.items]
    labels = index.labels
    for r in report.records:
        qid = f"q{r.position:05d}"
        n = len(r.ranking)
        # strictly decreasing pseudo-scores that keep our (tie-broken) order for trec_eval
        for rank, row in enumerate(r.ranking, start=1):
            run_lines.append(f"{qid} Q0 {docnos[row]} {rank} {n - rank + 1} {run_name}")
        for row in np.flatnonzero(np.isin(labels, r.relevant)):
            qrel_lines.append(f"{qid} 0 {docnos[row]} 1")
    run_path, qrels_path = prefix.with_name(prefix.name + ".run"), prefix.with_name(prefix.name + ".qrels")
    atomic_write(run_path, "\n".join(run_lines) + "\n")
    atomic_write(qrels_path, "\n".join(qrel_lines) + "\n")
    return run_path, qrels_path


def values_by_query(report: EvalReport) -> dict[str, dict[str, float]]:
    """``{metric: {query: value}}`` for the metrics of :data:`COMPARED`, over the report's evaluated
    (non open-set) queries: what :func:`paired_tests` compares."""
    return {key: {r.query: float(r.metrics[key]) for r in report.records if not r.open_set}
            for key in COMPARED}


def paired_tests(run: Mapping[str, Mapping[str, float]], baseline: Mapping[str, Mapping[str, float]],
                 seed: int | None = 0) -> dict[str, PairedTestResult | None]:
    """The comparison of a run with a baseline run: for each metric of :data:`COMPARED`, the paired
    two-sided randomization test (the bootstrap test's p alongside) that the run differs, with its
    ``direction`` ("better", "worse", "same"), on the queries both evaluated (:func:`museum_search.core.evaluation._stats.paired_test_by_query`; for AMNRO lower is better).

    ``run``, ``baseline``: ``{metric: {query: value}}`` (:func:`values_by_query`, or the
    queries of a run's JSON). A metric's result is None when fewer than 2 queries are common."""
    return {key: paired_test_by_query(dict(run.get(key, {})), dict(baseline.get(key, {})), m.higher_is_better, seed)
            for key, m in COMPARED.items()}


def compare_with_baseline(doc: dict[str, Any], baseline_path: Path, seed: int = 0) -> dict[str, Any]:
    """Paired two-sided tests of this run against a baseline run JSON, on the queries both evaluated.

    ``{"baseline", "paired_queries", metric: {"test", "alternative", "direction", "p_value", "exact",
    "differing_queries", "bootstrap_p_value", "delta", "run_mean", "baseline_mean", "significant"}}``:
    ``direction`` is "better", "worse" or "same"; ``p_value`` and ``significant`` are the
    randomization test's (:func:`museum_search.core.evaluation._stats.paired_test_by_query`), ``bootstrap_p_value`` the bootstrap
    test's on the same queries. A baseline exported with the older per-query keys (``ap``...) is
    read with today's (:func:`museum_search.core.evaluation._metrics.current_keys`)."""
    try:
        base = json.loads(Path(baseline_path).read_text(encoding="utf-8"))
        base_q = {q["query"]: current_keys(q) for q in base["queries"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MuseumSearchError(f"cannot read baseline run {baseline_path}: {exc}") from None
    pairs = [(q, base_q[q["query"]]) for q in doc["queries"] if q["query"] in base_q and _evaluated(q)
             and _evaluated(base_q[q["query"]])]
    if not pairs:
        raise MuseumSearchError(f"the baseline run {baseline_path} has no query in common with this run")
    out: dict[str, Any] = {"baseline": str(baseline_path), "paired_queries": len(pairs)}
    tests = paired_tests({k: {a["query"]: a[k] for a, _ in pairs} for k in COMPARED},
                         {k: {b["query"]: b[k] for _, b in pairs} for k in COMPARED}, seed)
    for name, res in tests.items():
        if res is None:
            raise MuseumSearchError(f"the baseline run {baseline_path} has fewer than 2 queries in common "
                                    "with this run")
        out[name] = {"test": res.test, "alternative": res.alternative, "direction": res.direction,
                     "run_mean": _num(res.run_mean), "baseline_mean": _num(res.baseline_mean),
                     "p_value": _num(res.p_value), "exact": res.exact,
                     "differing_queries": res.differing_queries, "bootstrap_p_value": _num(res.bootstrap_p_value),
                     "delta": _num(res.delta), "significant": {str(k): bool(v) for k, v in res.significant_at.items()}}
    return out


def _evaluated(query: Mapping[str, Any]) -> bool:
    """A query of a run's JSON that was evaluated (not open-set): its :data:`museum_search.core.evaluation._metrics.PRIMARY` figure
    (AP) is not null."""
    return query.get(PRIMARY.key) is not None


def _rerank_name(settings: QuerySettings) -> str:
    """The re-rankers in upper case, each with its options that differ from the defaults."""
    o, d = settings.options, RerankOptions()
    out = []
    for name in settings.rerank:
        params = []
        if name == "icfrr":
            if (o.k_q, o.k_g) != (d.k_q, d.k_g):
                params.append(f"K {o.k_q or 'auto'}/{o.k_g or 'auto'}")
            if o.beta != d.beta:
                params.append(f"β {o.beta:g}")
            if o.iterations != d.iterations:
                params.append(f"{o.iterations} it")
            if o.icfrr_mode != d.icfrr_mode:
                params.append(f"{o.icfrr_mode} mode")
        elif name in ("aqe", "dba"):
            if o.qe_n != d.qe_n:
                params.append(f"n {o.qe_n}")
            if o.qe_alpha != d.qe_alpha:
                params.append(f"α {o.qe_alpha:g}")
        out.append(" ".join([name.upper(), *params]))
    return " + ".join(out)


def settings_difference(settings: QuerySettings) -> str:
    """What ``settings`` change from ``QuerySettings()``'s defaults, in words ("default" when nothing),
    e.g. ``ICFRR K 2/2, not verified``; the re-rankers' options only when they differ."""
    default = QuerySettings()
    changed = {f.name for f in fields(QuerySettings) if getattr(settings, f.name) != getattr(default, f.name)}
    parts = [_rerank_name(settings)] if settings.rerank else []
    if not settings.verify:
        parts.append("not verified")
    elif "verify_top" in changed:
        parts.append(f"verified top {settings.verify_top}")
    words = {"search": f"{settings.search} search", "regions": "whole image" if not settings.regions else "regions",
             "per_instance": "one per object" if settings.per_instance else "all photos",
             "k": f"k {settings.k}", "verdict": "own verdict",
             "rivals_anywhere": "rivals anywhere" if settings.rivals_anywhere else "rivals elsewhere"}
    parts += [text for key, text in words.items() if key in changed]
    return ", ".join(p for p in parts if p) or "default"


def run_name(settings: QuerySettings, queryset_name: str | None = None, when: datetime | None = None) -> str:
    """A run's name: the query set, what its settings change from the defaults
    (:func:`settings_difference`) and the time, joined by " · ", e.g.
    ``qsd2_w3 · ICFRR K 2/2 · 14:37:43`` or ``qsd2_w3 · default · 14:37:43`` (the Evaluation tab's run
    list and comparison, the CLI's summary). ``queryset_name`` or ``when`` None: left out."""
    parts = [queryset_name or "", settings_difference(settings), f"{when:%H:%M:%S}" if when is not None else ""]
    return " · ".join(p for p in parts if p)
