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

from museum_search.core.answer import QueryPipeline, QuerySettings, RerankOptions, icfrr_advice, icfrr_k_g
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._querysets import LabelledQuery, QuerySet
from museum_search.core.evaluation._runner import (
    DESCRIBING,
    EVALUATING,
    Described,
    Measured,
    answered,
    described,
    measure,
    nmrr_gtm,
    objects_figures,
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
        QuerySettings(options=options_at(base, parameter, v))  # validates (as every query's settings are)
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
    values, option_sets = _option_sets(parameter, values, base_options, names)
    base = settings or QuerySettings()
    labels = index.labels
    first = yield from query_pipeline(index, replace(base, rerank=tuple(names), options=option_sets[0]),
                                      extractor=extractor, weights=weights,
                                      neighbours=max(icfrr_k_g(labels, o) for o in option_sets))
    pipes = [first] + [QueryPipeline(index, replace(base, rerank=tuple(names), options=o),
                                     extractor=first.extractor) for o in option_sets[1:]]
    known = set(index.instances)
    queries = queryset.restricted_to(known).queries
    unknown_of = [sorted(q.relevant - known) for q in queryset.queries]
    gtm = nmrr_gtm(labels, queries)
    # 1. decode and describe every query once, as the runner does
    usable, skipped = yield from _describe_all(first, queries, batch_size)
    unknown = [unknown_of[item.position] for item in usable]
    # 2. answer and measure at each value (one query at a time, as the runner does)
    m = len(usable)
    clock = _Clock(m * len(values))
    points: list[SweepPoint] = []
    for i, (value, pipe) in enumerate(zip(values, pipes)):
        name = f"{PARAMETER_NAMES[parameter]} = {value:g}"
        got = yield from _measured_at(pipe, usable, queries, labels, clock, i * m, f"answering at {name}")
        summary, per_query = summary_of(index, [g.relevance for g in got], [g.n_relevant for g in got], skipped,
                                        gtm, unknown)
        summary.update(pipeline_summary(pipe, [g.evidence for g in got]))
        summary.update(objects_figures(got))
        points.append(SweepPoint(value, option_sets[i], summary, per_query))
        yield SweepStep((i + 1) * m, clock.total, name, stage=EVALUATING, elapsed=clock.elapsed(), value=value,
                        summary=summary)
    return points


def _option_sets(parameter: str, values: Sequence[float], base_options: RerankOptions | None,
                 names: Sequence[str]) -> tuple[list[float], list[RerankOptions]]:
    """The sweep's values and the ICFRR options at each (checked: see :func:`sweep`)."""
    if parameter not in PARAMETERS:
        raise MuseumSearchError(f"unknown sweep parameter {parameter!r}; choose 'k' (K_q = K_g) or 'beta'")
    values = [float(v) for v in values]
    if not values:
        raise MuseumSearchError("no sweep values: give at least one value")
    if "icfrr" not in [n.lower() for n in names]:
        raise MuseumSearchError("a sweep varies ICFRR parameters: include 'icfrr' in the re-rankers")
    base_options = base_options or RerankOptions()
    return values, [options_at(base_options, parameter, v) for v in values]


def _describe_all(pipe: QueryPipeline, queries: Sequence[LabelledQuery],
                  batch_size: int) -> Generator[Progress, None, tuple[list[Described], int]]:
    """Decode and describe every query once (:func:`described`), yielding ``SweepStep`` records of
    :data:`DESCRIBING`: the usable queries, and how many could not be read."""
    usable: list[Described] = []
    seen = 0
    skipped = 0
    n = len(queries)
    start = time.perf_counter()
    feed = described(pipe, [q.path for q in queries], batch_size,
                     lambda path: Progress(seen, n, path, stage=DESCRIBING, elapsed=time.perf_counter() - start))
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
            yield SweepStep(seen, n, queries[item.position].path, stage=DESCRIBING, elapsed=time.perf_counter() - start)
    finally:
        feed.close()
    return usable, skipped


@dataclass
class _Clock:
    """The answering phase of a sweep: ``total`` answers, its start, and the last heartbeat."""

    total: int
    start: float = field(default_factory=time.perf_counter)
    beat_at: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def progress(self, done: int, path: str, stage: str) -> Progress:
        return Progress(done, self.total, path, stage=stage, elapsed=self.elapsed())

    def beat_due(self) -> bool:
        """A heartbeat is due (:data:`HEARTBEAT` since the last): fast answers still give a chance to stop."""
        if time.perf_counter() - self.beat_at < HEARTBEAT:
            return False
        self.beat_at = time.perf_counter()
        return True


def _measured_at(pipe: QueryPipeline, usable: list[Described], queries: Sequence[LabelledQuery], labels,
                 clock: _Clock, offset: int, stage: str) -> Generator[Progress, None, list[Measured]]:
    """Every usable query answered by ``pipe`` and measured; ``offset``: the answers done before."""
    out: list[Measured] = []
    for j, item in enumerate(usable):
        done = offset + j
        image = item.image
        assert image is not None  # usable: decoded queries only
        ans = yield from answered(pipe, item, partial(clock.progress, done, image.name, stage))
        out.append(measure(ans, queries[item.position], labels))
        if clock.beat_due():
            yield Progress(done + 1, clock.total, image.name, stage=stage, elapsed=clock.elapsed())
    return out


__all__ = ["PARAMETERS", "PARAMETER_NAMES", "SweepPoint", "SweepStep", "options_at", "parse_values", "sweep",
           "sweep_advice"]
