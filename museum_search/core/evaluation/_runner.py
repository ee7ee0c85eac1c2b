"""Evaluation runner: answers the queries with the query pipeline and yields one record per query.

The queries go through :class:`museum_search.core.answer._pipeline.QueryPipeline`, the same path as the CLI
``query``, the Search tab and the kiosk, so the figures measure what a visitor gets, the verdict
("in this collection" or not) included. ``evaluate(index, queryset)`` is a generator: each step yields an :class:`EvalStep` with the
record of the query just ranked (its full ranking, per-query metrics) and the running means, so
plots can follow live; it returns the :class:`EvalReport` at the end. Closing the generator
cancels the run (nothing is written by the runner itself).

Between the records it yields plain :class:`~museum_search.core.progress.Progress` records whose
``stage`` says what is happening (:data:`LOADING`, :data:`NEIGHBOURS`, :data:`DESCRIBING`,
:data:`VERIFYING` or :data:`SEARCHING`), at least every 0.1 s while a call runs
(:func:`~museum_search.core.progress.wait`), so a cancel takes effect within 0.1 s in every
phase. The network comes from the process-wide cache of :mod:`museum_search.core.inference._engines` (and
:func:`~museum_search.core.inference._backbones.build_torch_extractor`): loaded by the first job of a
process, reused by every later one, the CLI's, the Search tab's and the kiosk's included. The
first query is described alone so that the first record (and plotted point) comes after one
query, not a batch.

Conventions (see :mod:`museum_search.core.evaluation._metrics`): a reference is relevant to a
query iff its instance is in the query's relevant set; queries without a relevant reference in
the index are excluded from the means and counted apart: open-set queries (their ground truth is
explicitly empty: the object is not in the collection, by design) and unknown-instance queries
(their ground truth names instances the index does not have: a typo or the wrong index), whose
names are listed in the summary. Rankings cover the whole collection (ties broken by index row),
so AP and MNRO see every relevant reference.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Generator, Iterable, Sequence

import numpy as np

from museum_search.core import inference as engines
from museum_search.core.answer import (
    Answer,
    Evidence,
    QueryImage,
    QueryPipeline,
    QuerySettings,
    descriptor_query,
    icfrr_advice,
    icfrr_k_g,
    load_query,
    open_set_figures,
    recalibrated,
)
from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.evaluation._metrics import (
    COMPARED,
    QUERY_METRICS,
    SUMMARY_METRICS,
    all_objects_found,
    extra_objects_named,
    gap_known,
    global_average_precision,
    relevance_matrix,
    summarize,
)
from museum_search.core.evaluation._querysets import LabelledQuery, QuerySet
from museum_search.core.index import Index
from museum_search.core.inference import DescriptorExtractor, extractor_for_meta
from museum_search.core.progress import DecodePool, Progress, drive, wait

#: Stages of an evaluation (``Progress.stage``), in words a user reads.
LOADING = "loading the network"
NEIGHBOURS = "finding each reference's nearest neighbours (for ICFRR, once per index)"
DESCRIBING = "describing the query photos"
VERIFYING = "searching, verifying the top results"
SEARCHING = "searching the collection"
EVALUATING = "evaluating"  # an EvalStep: one query answered and measured


@dataclass
class QueryRecord:
    position: int  # order of the query in the query set
    query: str  # path of the query image
    relevant: list[str]  # relevant instances present in the index (empty: open-set)
    metrics: dict[str, float]  # the QUERY_METRICS: mp@1, p@5, map, amnro, ... (NaN for open-set queries)
    ranking: np.ndarray  # every reference row, best first
    scores: np.ndarray  # score of each ranked reference (same order)
    relevance: np.ndarray  # bool: is the reference at each rank relevant
    n_relevant: int  # relevant references in the collection
    unknown: list[str] = field(default_factory=list)  # ground-truth instances missing from the index
    in_collection: bool = True  # the pipeline's verdict
    reason: str = ""  # the verdict in words
    top_cosine: float = float("nan")  # evidence of the top result
    top_inliers: int | None = None  # (None: not verified)
    rival_inliers: int = 0  # most inliers of another object (see verdict.DISTINCT)
    top_margin: float = float("nan")  # top cosine minus the best other object's cosine
    confidence: float | None = None  # the answer's confidence (None: no answer, an empty collection)
    #: the answer's own evidence (``Answer.evidence``), with everything the verdict reads; None for a
    #: record made by hand (its evidence is then made from the fields above)
    answer_evidence: Evidence | None = None
    #: every object the answer names in the photo (``Answer.objects``): (instance, confidence)
    objects: list[tuple[str, float]] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        """The top-1 reference is relevant (always False for an open-set query)."""
        return bool(self.relevance[:1].any())

    @property
    def evidence(self) -> Evidence:
        """The top answer's evidence, for the verdict's figures, GAP and re-calibration."""
        if self.answer_evidence is not None:
            return self.answer_evidence
        return Evidence(self.top_cosine, self.top_inliers, not self.open_set, self.correct, self.rival_inliers,
                        margin=self.top_margin, confidence=self.confidence)

    @property
    def open_set(self) -> bool:
        """No relevant reference in the index: excluded from the means (see :attr:`unknown_only`)."""
        return self.n_relevant == 0

    @property
    def unknown_only(self) -> bool:
        """Excluded because every instance its ground truth names is missing from the index (not
        an open-set query by design: likely a typo in the ground truth or the wrong index)."""
        return self.n_relevant == 0 and bool(self.unknown)


@dataclass
class EvalStep(Progress):
    """The progress record of an evaluation (``stage`` "evaluating"), with the query just answered
    (None for an unreadable one, named in ``skipped``) and the running means so far."""

    stage: str = "evaluating"
    record: QueryRecord | None = None
    running: dict[str, float] = field(default_factory=dict)  # running means over the evaluated queries


@dataclass
class EvalReport:
    summary: dict[str, Any]
    records: list[QueryRecord]
    skipped: list[tuple[str, str]]
    index_description: str
    queryset_description: str
    rerank: str
    per_query: dict[str, np.ndarray]  # metric key → (evaluated + open-set queries,) values
    verdict: Any = None  # the Verdict the answers were given with
    #: the pipeline's settings (None for a report made by hand) and the search it used ("exact" or
    #: "ann": what ``settings.search`` "auto" chose), for an export that runs it again (:mod:`museum_search.core.evaluation._export`)
    settings: QuerySettings | None = None
    search_mode: str = ""
    #: the inference engine that ran the pipeline's network (:attr:`.answer.QueryPipeline.engine`; "": unknown)
    engine: str = ""

    @property
    def evidence(self) -> list[Evidence]:
        return [r.evidence for r in self.records]

    @property
    def verified(self) -> bool:
        return bool(self.summary.get("verified"))

    @property
    def can_recalibrate(self) -> bool:
        """The verdict can be re-calibrated on these queries: some show objects in the collection,
        some objects that are not (an empty ground truth)."""
        v = self.summary.get("verdict") or {}
        return bool(v.get("known_queries") and v.get("unknown_queries"))

    def recalibrated(self, max_known_rejected: float) -> tuple[Any, dict[str, Any]]:
        """The verdict's operating point on these queries that rejects the most unknown objects while
        wrongly rejecting at most ``max_known_rejected`` of the known ones, and its figures here."""
        if not 0 <= max_known_rejected < 1:
            raise MuseumSearchError("the share of known objects that may be rejected must be in [0, 1), "
                                    "e.g. 0.03")
        if not self.can_recalibrate:
            raise MuseumSearchError("re-calibrating the verdict needs queries of objects in the collection and "
                                    "queries of objects that are not (empty instance in the ground truth)")
        new = recalibrated(self.evidence, self.verdict, max_known_rejected, verified=self.verified)
        ev = self.evidence if self.verified else [replace(e, inliers=None, rival=0) for e in self.evidence]
        return new, open_set_figures(ev, new)

    def per_query_values(self, key: str) -> np.ndarray:
        """Values of ``key`` (one of :data:`QUERY_METRICS`, e.g. "mp@1", "map", "amnro") over the
        evaluated (non open-set) queries."""
        return np.array([r.metrics[key] for r in self.records if not r.open_set], dtype=float)


def evaluate(
    index: Index,
    queryset: QuerySet,
    settings: QuerySettings | None = None,
    *,
    extractor: DescriptorExtractor | None = None,
    weights: str | None = None,
    batch_size: int = 8,
    pipeline: QueryPipeline | None = None,
) -> Generator[Progress, None, EvalReport]:
    """Answer every query of ``queryset`` with the query pipeline (see the module docstring).

    ``settings``: the pipeline's settings (default: the defaults a visitor gets: query regions,
    verification, the index's calibrated verdict); or pass a ready ``pipeline``.
    ``batch_size``: queries described at once (after the first, described alone); each query is
    then answered on its own. Yields an :class:`EvalStep` per query and, while calls run,
    :class:`~museum_search.core.progress.Progress` records naming the stage.
    Queries given as descriptors (``queryset.descriptors``) are neither decoded nor described, and
    by default answered by :meth:`QueryPipeline.for_descriptors` (no network, not verified).
    """
    if queryset.descriptors is not None and pipeline is None:
        pipeline = QueryPipeline.for_descriptors(index, settings)
    pipe = yield from query_pipeline(index, settings, extractor=extractor, weights=weights, pipeline=pipeline)
    run = _Evaluation(index, queryset, pipe)
    feed = run.feed(batch_size)
    try:
        for item in feed:
            if isinstance(item, Progress):
                yield item
            else:
                yield from run.step(item)
    finally:
        feed.close()
    return run.report()


class _Evaluation:
    """One run of :func:`evaluate`: its queries, the records so far and the running means."""

    def __init__(self, index: Index, queryset: QuerySet, pipe: QueryPipeline) -> None:
        self.index, self.queryset, self.pipe = index, queryset, pipe
        known = set(index.instances)
        self.qs = queryset.restricted_to(known)
        self.queries = self.qs.queries
        self.unknown_of = [sorted(q.relevant - known) for q in queryset.queries]  # same order as qs.queries
        self.total = len(self.queries)
        self.labels = index.labels
        self.gtm = nmrr_gtm(self.labels, self.queries)
        self.records: list[QueryRecord] = []
        self.skipped: list[tuple[str, str]] = []
        self.done = 0
        self.means = _RunningMeans()
        self.running: dict[str, float] = self.means.current()
        self.answering = VERIFYING if pipe.settings.verify else SEARCHING
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def progress(self, done: int, path: str, stage: str) -> Progress:
        return Progress(done, self.total, path, stage=stage, elapsed=self.elapsed())

    def feed(self, batch_size: int) -> Generator[Progress | Described, None, None]:
        """The queries described (:func:`described`), or as given when they are descriptors."""
        if self.qs.descriptors is not None:  # queries given as descriptors: nothing to decode or describe
            descriptors = self.qs.descriptors
            return (Described(j, descriptor_query(descriptors[q.row], q.path), None)
                    for j, q in enumerate(self.queries))
        return described(self.pipe, [q.path for q in self.queries], batch_size,
                         lambda path: self.progress(self.done, path, DESCRIBING))

    def step(self, item: Described) -> Generator[Progress, None, None]:
        """Answer and measure one described query (skip an unreadable one); its :class:`EvalStep`."""
        q = self.queries[item.position]
        if item.image is None:
            self.skipped.append((q.path, item.reason))
            self.done += 1
            yield EvalStep(self.done, self.total, None, [(q.path, item.reason)], self.elapsed(), running=self.running)
            return
        ans = yield from answered(self.pipe, item, partial(self.progress, self.done, q.path, self.answering))
        rec = self.record(item.position, q, ans)
        self.records.append(rec)
        self.running = self.means.add(rec)
        self.done += 1
        yield EvalStep(self.done, self.total, rec.query, [], self.elapsed(), record=rec, running=self.running)

    def record(self, position: int, q: LabelledQuery, ans: Answer) -> QueryRecord:
        """The record of query ``q`` answered ``ans``: its ranking, its figures (:data:`QUERY_METRICS`)."""
        got = measure(ans, q, self.labels)
        per = summarize(got.relevance[None], np.array([got.n_relevant], np.int64), ks=precision_ks(QUERY_METRICS),
                        n_collection=len(self.index), gtm=self.gtm)["per_query"]
        top = ans.results[0] if ans.results else None
        return QueryRecord(
            position=position, query=q.path, relevant=sorted(q.relevant),
            metrics={key: float(per[key][0]) for key in QUERY_METRICS},
            ranking=got.ranking.astype(np.int32),
            scores=np.take(ans.scores, got.ranking).astype(np.float32),
            relevance=got.relevance, n_relevant=got.n_relevant,
            unknown=self.unknown_of[position],
            in_collection=ans.in_collection, reason=ans.reason,
            top_cosine=ans.top_cosine if top else float("nan"), top_inliers=ans.top_inliers,
            rival_inliers=ans.rival, confidence=ans.confidence,
            answer_evidence=got.evidence, top_margin=got.evidence.margin,
            objects=got.objects,
        )

    def report(self) -> EvalReport:
        """The run's report (the query set as loaded: restricting it would describe unknown
        instances as open-set)."""
        recs, pipe = self.records, self.pipe
        summary, per_query = summary_of(self.index, [r.relevance for r in recs], [r.n_relevant for r in recs],
                                        len(self.skipped), self.gtm, [r.unknown for r in recs])
        summary.update(pipeline_summary(pipe, [r.evidence for r in recs]))
        summary.update(objects_figures(recs))
        return EvalReport(summary, recs, self.skipped, self.index.summary(), self.queryset.summary(),
                          pipe.settings_text(), per_query, pipe.verdict, pipe.settings, pipe.search_mode,
                          pipe.engine)


def query_pipeline(index: Index, settings: QuerySettings | None = None, *, extractor: DescriptorExtractor | None = None,
                   weights: str | None = None, pipeline: QueryPipeline | None = None,
                   neighbours: int | None = None) -> Generator[Progress, None, QueryPipeline]:
    """The query pipeline of a job (``pipeline`` when given), built with progress: the network
    (:data:`LOADING`: the process-wide cache of :mod:`museum_search.core.inference._engines` and
    :mod:`museum_search.core.inference._backbones`, so only the first job of a process loads it), then, when
    ICFRR re-ranks, each reference's nearest neighbours (:data:`NEIGHBOURS`, once per index):
    ``neighbours`` of them (default: the pipeline's K_g; a sweep of K asks for its largest K), from
    ``index.neighbour_lists``. Both run through :func:`~museum_search.core.progress.wait`: a cancel
    does not wait for them, and a job started again meanwhile waits for the same call instead of
    starting another."""
    t0 = time.perf_counter()
    if pipeline is None:
        if extractor is None:
            engine = engines.resolve_engine(settings.engine if settings is not None else None)
            extractor = yield from wait(
                lambda: extractor_for_meta(index.meta, weights, engine=engine),
                lambda: Progress(0, 0, stage=LOADING, elapsed=time.perf_counter() - t0),
                key=("extractor", index.meta, weights, engine))
        pipeline = QueryPipeline(index, settings or QuerySettings(), extractor=extractor)
    if "icfrr" in pipeline.settings.rerank:
        k = neighbours if neighbours is not None else icfrr_k_g(index.labels, pipeline.settings.options)
        yield from neighbours_ready(index, k)
    return pipeline


def neighbours_ready(index: Index, k: int) -> Generator[Progress, None, None]:
    """Make each reference's ``k`` nearest neighbours available (``index.neighbour_lists(k)``),
    yielding :data:`NEIGHBOURS` records while they are computed (nothing when they are at hand)."""
    if index.has_neighbours(k):
        return
    t1 = time.perf_counter()
    yield from wait(lambda: index.neighbour_lists(k),
                    lambda: Progress(0, 0, stage=NEIGHBOURS, elapsed=time.perf_counter() - t1),
                    key=("neighbour lists", id(index), int(k)), announce=True)


@dataclass
class Described:
    """A query of :func:`described`: its decoded photo and descriptors, or why it cannot be used."""

    position: int  # in the list of paths
    image: QueryImage | None
    descriptors: np.ndarray | None  # (1, R, D)
    reason: str = ""  # why the photo cannot be used (image None)


def described(pipe: QueryPipeline, paths: list[str], batch_size: int,
              beat: Callable[[str], Progress]) -> Generator[Progress | Described, None, None]:
    """Decode (on two threads, ahead) and describe the photos at ``paths``, in order: the first
    alone (the first answer comes after one photo), then ``batch_size`` at a time. Yields one
    :class:`Described` per path, and ``beat(path)`` at least every 0.1 s while a decode or a
    description runs. Used by the runner and the sweep, so both describe alike."""
    pool = DecodePool(2, "eval-decode")
    pending: deque[Future] = deque()
    finished = False
    ahead = 0

    def fill(upto: int) -> None:
        nonlocal ahead
        while ahead < min(len(paths), upto):
            pending.append(pool.submit(_decode, paths[ahead]))
            ahead += 1

    try:
        i = 0
        while i < len(paths):
            n = 1 if i == 0 else max(1, batch_size)
            chunk: list[tuple[int, Any]] = []
            for j in range(i, min(len(paths), i + n)):
                fill(j + 1 + max(1, batch_size))
                decoded: QueryImage | str = yield from wait(pending.popleft(), partial(beat, paths[j]))
                chunk.append((j, decoded))
            ok = [(j, d) for j, d in chunk if not isinstance(d, str)]
            desc = None
            if ok:
                desc = yield from wait(partial(pipe.embed, [d for _, d in ok]), partial(beat, paths[ok[0][0]]))
            k = 0
            for j, d in chunk:
                if isinstance(d, str):
                    yield Described(j, None, None, d)
                else:
                    assert desc is not None  # d is decoded, so ok is not empty and desc was computed
                    yield Described(j, d, desc[k : k + 1])
                    k += 1
            i += len(chunk)
        finished = True
    finally:  # cancelled or interrupted: a decode still running is not waited for
        pool.shutdown(wait=finished, cancel_futures=True)


def answered(pipe: QueryPipeline, item: Described, beat: Callable[[], Progress]) -> Generator[Progress, None, Answer]:
    """The pipeline's answer to the described query ``item`` (with its full ranking), yielding
    ``beat()`` at least every 0.1 s while it runs (runner and sweep)."""
    image = item.image
    assert image is not None  # only a decoded query is answered (runner and sweep skip the others)
    return (yield from wait(lambda: pipe.answer([image], item.descriptors, full_ranking=True), beat))[0]


@dataclass
class Measured:
    """One answer measured against its query's ground truth (:func:`measure`)."""

    ranking: np.ndarray  # (G,) every reference row, best first
    relevance: np.ndarray  # (G,) bool: is the reference at each rank relevant
    n_relevant: int  # relevant references in the collection (0: open-set)
    evidence: Evidence  # the answer's evidence, knowing whether the query is known and the answer right
    relevant: list[str] = field(default_factory=list)  # the query's relevant instances
    objects: list[tuple[str, float]] = field(default_factory=list)  # (instance, confidence) named in the photo


def measure(answer: Answer, query: LabelledQuery, labels: np.ndarray) -> Measured:
    """``answer`` (given with its full ranking) against ``query``'s relevant instances, ``labels``
    the instance of every reference: the per-query measurement of the runner and the sweep. A
    query is known when it has a relevant reference in the collection, the answer right when its
    top-1 reference is relevant."""
    ranking = np.asarray(answer.ranking)
    rel, n_rel = relevance_matrix(ranking[None], labels, [set(query.relevant)])
    relevance = np.asarray(rel[0], bool)
    n = int(n_rel[0])
    return Measured(ranking, relevance, n, answer.evidence(n > 0, bool(relevance[:1].any())), sorted(query.relevant),
                    [(o.instance, float(o.confidence)) for o in answer.objects])


def pipeline_summary(pipe: QueryPipeline, evidence: list[Evidence]) -> dict[str, Any]:
    """The settings and the verdict's figures of a run, for its summary (runner and sweep).

    ``icfrr_advice``: when ICFRR re-ranks a collection it cannot help
    (:func:`~museum_search.core.answer._rerank.icfrr_advice`), the warning; else None."""
    icfrr = "icfrr" in pipe.settings.rerank
    return {"query_regions": bool(pipe.settings.regions), "verified": bool(pipe.settings.verify),
            **gap_figures(evidence),
            "icfrr_advice": icfrr_advice(pipe.index.labels, pipe.settings.options) if icfrr else None,
            "verdict": {**open_set_figures(evidence, pipe.verdict),
                        "rule": pipe.verdict.rule(pipe.settings.verify),
                        "threshold": pipe.verdict.threshold(pipe.settings.verify),
                        "min_inliers": pipe.verdict.min_inliers if pipe.settings.verify else None,
                        "min_cosine": None if pipe.settings.verify else pipe.verdict.min_cosine,
                        "calibration": pipe.verdict.source}}


def gap_figures(evidence: list[Evidence]) -> dict[str, float]:
    """``{"gap", "gap_known"}`` of a run's answers: the Met dataset's Global Average Precision
    (:func:`museum_search.core.evaluation._metrics.global_average_precision`: every answered query, known and unknown, sorted by
    its answer's confidence, ties by query order) and the same over the known queries only
    (:func:`museum_search.core.evaluation._metrics.gap_known`). A query is known when it has a relevant reference in the index
    (not open-set), right when its top-1 reference is relevant. NaN without a known query.
    Unreadable queries are not answered and not counted."""
    conf = np.array([np.nan if e.confidence is None else float(e.confidence) for e in evidence], float)
    correct = np.array([bool(e.correct) for e in evidence], bool)
    known = np.array([bool(e.known) for e in evidence], bool)
    return {"gap": float(global_average_precision(conf, correct, known)),
            "gap_known": float(gap_known(conf, correct, known))}


def objects_figures(records: Sequence[QueryRecord | Measured]) -> dict[str, float]:
    """``{"all_objects", "extra_objects"}`` of a run's answers: the share of the photos showing
    objects of the collection whose every such object the answer names among its objects
    (:func:`museum_search.core.evaluation._metrics.all_objects_found`), and the share of the photos
    whose answer names an object they do not show
    (:func:`museum_search.core.evaluation._metrics.extra_objects_named`)."""
    named = [[i for i, _ in r.objects] for r in records]
    relevant = [r.relevant for r in records]  # the relevant instances the index has
    return {"all_objects": all_objects_found(named, relevant), "extra_objects": extra_objects_named(named, relevant)}


def _decode(path: str):
    """The decoded query, or the reason it cannot be used (a str)."""
    try:
        return load_query(path)
    except ImageError as exc:
        return exc.reason
    except (OSError, ValueError, MemoryError) as exc:
        return f"cannot be read: {exc}"


def nmrr_gtm(labels, queries) -> int | None:
    """NMRR's GTM: the largest number of relevant references of any query of the whole set, so
    that per-batch values use the same one as the final summary."""
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    return max((sum(counts.get(i, 0) for i in q.relevant) for q in queries), default=0) or None


def summary_of(index: Index, rels: list[np.ndarray], nrels: list, skipped: int, gtm: int | None,
               unknown: list[list[str]] | None = None):
    """(summary dict, per-query arrays) of an evaluation from its relevance rows.

    ``unknown``: per relevance row, the ground-truth instances missing from the index. The summary
    counts the queries without a relevant reference (excluded from the means) in two parts:
    ``open_set_queries`` (ground truth explicitly empty) and ``unknown_instance_queries`` (every
    instance named is missing); ``partly_unknown_queries`` are evaluated on their other instances;
    ``unknown_instances`` lists the missing names (sorted). Without ``unknown``, every query without
    a relevant reference counts as open-set.
    """
    ks = precision_ks(SUMMARY_METRICS)
    if rels:
        n_rel = np.hstack(nrels)
        full = summarize(np.vstack(rels), n_rel, ks=ks, n_collection=len(index), gtm=gtm)
    else:
        n_rel = np.zeros(0, np.int64)
        full = summarize(np.zeros((0, len(index)), bool), n_rel, ks=ks)
    per_query = full.pop("per_query")
    unknown = list(unknown) if unknown is not None else []
    if unknown and len(unknown) != len(n_rel):
        raise ValueError(f"{len(unknown)} lists of unknown instances for {len(n_rel)} queries")
    unknown_only = sum(1 for u, n in zip(unknown, n_rel) if u and n == 0)
    partly = sum(1 for u, n in zip(unknown, n_rel) if u and n > 0)
    summary: dict[str, Any] = {"queries": full["queries"],
                               "open_set_queries": full["open_set_queries"] - unknown_only,
                               "unknown_instance_queries": unknown_only,
                               "partly_unknown_queries": partly,
                               "unknown_instances": sorted({i for u in unknown for i in u}),
                               "skipped_queries": skipped, "references": len(index),
                               "instances": len(index.instances)}
    for key in SUMMARY_METRICS:
        summary[key] = full[key]
    return summary, per_query


def precision_ks(keys: Iterable[str]) -> tuple[int, ...]:
    """The k of every ``"p@k"`` among ``keys``: what :func:`summarize` must compute for them."""
    return tuple(sorted({int(k[2:]) for k in keys if k.startswith("p@")}))


class _RunningMeans:
    """Running means of the :data:`COMPARED` metrics (MP@1, MAP, AMNRO) over the evaluated (non
    open-set) queries seen so far."""

    def __init__(self) -> None:
        self.n = 0
        self.sums = {key: 0.0 for key in COMPARED}

    def add(self, rec: QueryRecord) -> dict[str, float]:
        if not rec.open_set:
            self.n += 1
            for key in self.sums:
                self.sums[key] += rec.metrics[key]
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


def run_evaluation(index: Index, queryset: QuerySet, settings: QuerySettings | None = None, **kw: Any) -> EvalReport:
    """Non-generator convenience wrapper."""
    return drive(evaluate(index, queryset, settings, **kw))
