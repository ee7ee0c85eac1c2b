"""ICFRR parameter sweep: one evaluation per parameter value, the queries described once.

``sweep(index, queryset, "k", [1, 2, 3], RerankOptions(beta=0.5))`` decodes and describes every
query once, then for each value answers the queries with the query pipeline
(:class:`museum_search.core.answer._pipeline.QueryPipeline`, given the descriptors) with ICFRR at that value,
and computes the metrics. It is a generator (see
``docs/CONVENTIONS.md``):

* while the network loads and each reference's nearest neighbours are found (as many as the
  largest K_g of the sweep) it yields :class:`~museum_search.core.progress.Progress` records of
  those stages, as the runner does (:func:`~museum_search.core.evaluation._runner.query_pipeline`);
* as the queries are described it yields ``SweepStep(done, total, stage=DESCRIBING)`` with
  ``done``/``total`` counted in query images (and heartbeats of the same stage while a call runs);
* while the queries are answered at a value it yields ``Progress(done, total, stage="answering at
  K_q = K_g = 3")`` at least every 0.1 s, counted in answers (usable queries × values);
* after each value it yields ``SweepStep(done, total, stage=EVALUATING, value=…, summary=…)``,
  counted in answers too, with ``summary`` the same dict as
  :attr:`museum_search.core.evaluation._runner.EvalReport.summary`;
* it returns the list of :class:`SweepPoint` (one per value, in the order given).

``parameter="k"`` sets K_q = K_g = value (a whole number >= 1); ``parameter="beta"`` sets beta.
Every other ICFRR setting comes from ``base_options``. The numbers at a value are exactly those
of :func:`museum_search.core.evaluation._runner.evaluate` with the same settings, batch size and
``query_regions`` (each query described by its regions, the best region's score per reference):
queries are scored and re-ranked in the same batches, with the same relevance rules (open-set
queries are reported, not averaged; unreadable queries are skipped and counted).

Closing the generator stops the sweep; nothing is written.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Generator, Sequence

import numpy as np

from museum_search.core.answer import Evidence, QueryPipeline, QuerySettings, RerankOptions, icfrr_advice, icfrr_k_g
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._querysets import QuerySet
from museum_search.core.evaluation._runner import (
    DESCRIBING,
    EVALUATING,
    Described,
    answered,
    described,
    measure,
    nmrr_gtm,
    pipeline_summary,
    query_pipeline,
    summary_of,
)
from museum_search.core.index import Index
from museum_search.core.inference import DescriptorExtractor
from museum_search.core.progress import HEARTBEAT, Progress

PARAMETERS = ("k", "beta")
PARAMETER_NAMES = {"k": "K_q = K_g", "beta": "β"}


@dataclass
class SweepStep(Progress):
    """The progress record of a sweep: ``stage`` :data:`DESCRIBING` (units: queries) or
    :data:`EVALUATING` (units: answers), with the value just evaluated and its summary (None while
    describing)."""

    stage: str = EVALUATING
    value: float | None = None
    summary: dict[str, Any] | None = None


@dataclass
class SweepPoint:
    value: float
    options: RerankOptions  # the ICFRR settings used at this value
    summary: dict[str, Any]  # as EvalReport.summary
    per_query: dict[str, np.ndarray] = field(default_factory=dict)  # as EvalReport.per_query


def options_at(base: RerankOptions, parameter: str, value: float) -> RerankOptions:
    """``base`` with the swept parameter set to ``value`` (validated)."""
    if parameter == "k":
        if not float(value).is_integer() or int(value) < 1:
            raise MuseumSearchError(f"K_q = K_g must be a whole number >= 1, got {value:g}")
        return replace(base, k_q=int(value), k_g=int(value))
    if parameter == "beta":
        if not (math.isfinite(float(value)) and float(value) >= 0):
            raise MuseumSearchError(f"β must be a number >= 0, got {value:g}")
        return replace(base, beta=float(value))
    raise MuseumSearchError(f"unknown sweep parameter {parameter!r}; choose 'k' (K_q = K_g) or 'beta'")


def sweep_advice(labels, parameter: str, base_options: RerankOptions | None = None) -> str | None:
    """The ICFRR warning (:func:`museum_search.core.answer._rerank.icfrr_advice`) for a sweep of
    ``parameter`` from ``base_options`` on a collection with these ``labels``: a sweep of K sets
    K_q and K_g by hand; a sweep of β keeps the base's K (suggested when not set)."""
    base = base_options or RerankOptions()
    return icfrr_advice(labels, replace(base, k_q=1, k_g=1) if parameter == "k" else base)


def parse_values(text: str, parameter: str = "k") -> list[float]:
    """Values from ``"1,2,5"`` or a range ``"start:stop:step"`` (stop included), or a mix.

    ``"1:10:3"`` gives 1, 4, 7, 10; ``"0:1:0.25"`` gives 0, 0.25, 0.5, 0.75, 1. Duplicates are
    dropped, order is kept.
    """
    out: list[float] = []
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise MuseumSearchError("no sweep values: enter e.g. 1,2,5 or a range start:stop:step")
    for part in parts:
        try:
            if ":" in part:
                bits = [float(b) for b in part.split(":")]
                if len(bits) == 2:
                    bits.append(1.0)
                if len(bits) != 3 or bits[2] <= 0 or bits[1] < bits[0]:
                    raise ValueError
                start, stop, step = bits
                n = int(math.floor((stop - start) / step + 1e-9)) + 1
                if n > 1000:
                    raise MuseumSearchError(f"the range {part} has {n} values; use a larger step (at most 1000 values)")
                out.extend(round(start + i * step, 10) for i in range(n))
            else:
                out.append(float(part))
        except ValueError:
            raise MuseumSearchError(
                f"cannot read sweep value {part!r}: use numbers separated by commas, or start:stop:step"
            ) from None
    values = list(dict.fromkeys(out))  # without repeats, in order
    base = RerankOptions()
    for v in values:
        options_at(base, parameter, v)  # validates
    return values


def sweep(
    index: Index,
    queryset: QuerySet,
    parameter: str,
    values: Sequence[float],
    base_options: RerankOptions | None = None,
    extractor: DescriptorExtractor | None = None,
    *,
    names: Sequence[str] = ("icfrr",),
    weights: str | None = None,
    batch_size: int = 8,
    settings: QuerySettings | None = None,
) -> Generator[Progress, None, list[SweepPoint]]:
    """Evaluate ICFRR at each of ``values`` of ``parameter`` (see the module docstring).

    ``names``: the re-rankers applied at each value (must include ``"icfrr"``), in order.
    ``settings``: the rest of the query pipeline's settings (regions, verification), as in
    :func:`~museum_search.core.evaluation._runner.evaluate`.
    """
    if parameter not in PARAMETERS:
        raise MuseumSearchError(f"unknown sweep parameter {parameter!r}; choose 'k' (K_q = K_g) or 'beta'")
    values = [float(v) for v in values]
    if not values:
        raise MuseumSearchError("no sweep values: give at least one value")
    if "icfrr" not in [n.lower() for n in names]:
        raise MuseumSearchError("a sweep varies ICFRR parameters: include 'icfrr' in the re-rankers")
    base_options = base_options or RerankOptions()
    base = settings or QuerySettings()
    option_sets = [options_at(base_options, parameter, v) for v in values]
    labels = index.labels
    first = yield from query_pipeline(index, replace(base, rerank=tuple(names), options=option_sets[0]),
                                      extractor=extractor, weights=weights,
                                      neighbours=max(icfrr_k_g(labels, o) for o in option_sets))
    pipes = [first] + [QueryPipeline(index, replace(base, rerank=tuple(names), options=o),
                                     extractor=first.extractor) for o in option_sets[1:]]
    known = set(index.instances)
    qs = queryset.restricted_to(known)
    queries = qs.queries
    unknown_of = [sorted(q.relevant - known) for q in queryset.queries]
    gtm = nmrr_gtm(labels, queries)
    n = len(queries)
    start = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - start

    def progress(done: int, path: str, stage: str) -> Progress:
        return Progress(done, total, path, stage=stage, elapsed=elapsed())

    # 1. decode and describe every query once, as the runner does
    usable: list[Described] = []
    seen = 0
    skipped = 0
    feed = described(first, [q.path for q in queries], batch_size,
                     lambda path: Progress(seen, n, path, stage=DESCRIBING, elapsed=elapsed()))
    try:
        for item in feed:
            if isinstance(item, Progress):
                yield item
                continue
            seen += 1
            if item.image is None:
                skipped += 1
            else:
                usable.append(item)
            yield SweepStep(seen, n, queries[item.position].path, stage=DESCRIBING, elapsed=elapsed())
    finally:
        feed.close()
    points: list[SweepPoint] = []

    # 2. answer and measure at each value (one query at a time, as the runner does)
    m = len(usable)
    total = m * len(values)
    start = time.perf_counter()
    beat_at = time.perf_counter()
    for i, (value, pipe) in enumerate(zip(values, pipes)):
        stage = f"answering at {PARAMETER_NAMES[parameter]} = {value:g}"
        rels: list[np.ndarray] = []
        nrels: list[int] = []
        unknown: list[list[str]] = []
        evidence: list[Evidence] = []
        for j, item in enumerate(usable):
            done = i * m + j
            image = item.image
            assert image is not None  # usable: decoded queries only
            ans = yield from answered(pipe, item, partial(progress, done, image.name, stage))
            got = measure(ans, queries[item.position], labels)
            rels.append(got.relevance)
            nrels.append(got.n_relevant)
            unknown.append(unknown_of[item.position])
            evidence.append(got.evidence)
            if time.perf_counter() - beat_at >= HEARTBEAT:  # fast answers: still a chance to stop
                beat_at = time.perf_counter()
                yield Progress(done + 1, total, image.name, stage=stage, elapsed=elapsed())
        summary, per_query = summary_of(index, rels, nrels, skipped, gtm, unknown)
        summary.update(pipeline_summary(pipe, evidence))
        points.append(SweepPoint(value, option_sets[i], summary, per_query))
        yield SweepStep((i + 1) * m, total, f"{PARAMETER_NAMES[parameter]} = {value:g}", stage=EVALUATING,
                        elapsed=elapsed(), value=value, summary=summary)
    return points


__all__ = ["PARAMETERS", "PARAMETER_NAMES", "SweepPoint", "SweepStep", "options_at", "parse_values", "sweep",
           "sweep_advice"]
