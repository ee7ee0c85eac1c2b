"""ICFRR parameter sweep: one evaluation per parameter value, the queries described once.

``sweep(index, queryset, "k", [1, 2, 3], RerankOptions(beta=0.5))`` describes every query once
(:func:`museum_search.core.extract.extract`), then for each value scores the queries against the
index, re-ranks them with ICFRR at that value and computes the metrics. It is a generator (see
``docs/CONVENTIONS.md``):

* while the queries are described it yields ``SweepStep(value=None, summary=None, done, total,
  stage="describing")`` with ``done``/``total`` counted in query images;
* after each value it yields ``SweepStep(value, summary, done, total, stage="evaluating")`` with
  ``done``/``total`` counted in values and ``summary`` the same dict as
  :attr:`museum_search.core.evaluation.runner.EvalReport.summary`;
* it returns the list of :class:`SweepPoint` (one per value, in the order given).

``parameter="k"`` sets K_q = K_g = value (a whole number >= 1); ``parameter="beta"`` sets beta.
Every other ICFRR setting comes from ``base_options``. The numbers at a value are exactly those
of :func:`museum_search.core.evaluation.runner.evaluate` with the same settings, batch size and
``query_regions`` (each query described by its regions, the best region's score per reference):
queries are scored and re-ranked in the same batches, with the same relevance rules (open-set
queries are reported, not averaged; unreadable queries are skipped and counted).

Closing the generator stops the sweep; nothing is written.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Generator, Sequence

import numpy as np

from ..backbones import Extractor, extractor_for_meta
from ..errors import MuseumSearchError
from ..extract import ExtractResult, extract
from ..index import Index
from ..rerank import RerankOptions, build_pipeline
from ..search import full_ranking, score_matrix
from .metrics import relevance_matrix
from .querysets import QuerySet
from .runner import nmrr_gtm, summary_of

PARAMETERS = ("k", "beta")
PARAMETER_NAMES = {"k": "K_q = K_g", "beta": "β"}


@dataclass
class SweepStep:
    value: float | None  # the value just evaluated (None while describing the queries)
    summary: dict[str, Any] | None  # its summary (None while describing)
    done: int
    total: int
    stage: str = "evaluating"  # "describing" (units: queries) or "evaluating" (units: values)
    elapsed: float = 0.0


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
    seen: set[float] = set()
    values = [v for v in out if not (v in seen or seen.add(v))]
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
    extractor: Extractor | None = None,
    *,
    names: Sequence[str] = ("icfrr",),
    weights: str | None = None,
    batch_size: int = 8,
    query_regions: bool = True,
) -> Generator[SweepStep, None, list[SweepPoint]]:
    """Evaluate ICFRR at each of ``values`` of ``parameter`` (see the module docstring).

    ``names``: the re-rankers applied at each value (must include ``"icfrr"``), in order.
    ``query_regions``: as in :func:`~museum_search.core.evaluation.runner.evaluate`.
    """
    if parameter not in PARAMETERS:
        raise MuseumSearchError(f"unknown sweep parameter {parameter!r}; choose 'k' (K_q = K_g) or 'beta'")
    values = [float(v) for v in values]
    if not values:
        raise MuseumSearchError("no sweep values: give at least one value")
    if "icfrr" not in [n.lower() for n in names]:
        raise MuseumSearchError("a sweep varies ICFRR parameters: include 'icfrr' in the re-rankers")
    base_options = base_options or RerankOptions()
    pipelines = [build_pipeline(list(names), options_at(base_options, parameter, v)) for v in values]
    extractor = extractor or extractor_for_meta(index.meta, weights)
    index.check_compatible(extractor.meta)
    qs = queryset.restricted_to(index.instances)
    queries = qs.queries
    labels = index.labels
    gtm = nmrr_gtm(labels, queries)
    start = time.perf_counter()

    # 1. describe every query once
    gen = extract([q.path for q in queries], extractor, batch_size=batch_size, query_regions=query_regions)
    try:
        while True:
            try:
                p = next(gen)
            except StopIteration as stop:
                res: ExtractResult = stop.value
                break
            yield SweepStep(None, None, p.done, len(queries), "describing", time.perf_counter() - start)
    finally:
        gen.close()

    # Batches as in runner.evaluate: the described queries of each block of ``batch_size``.
    batches: dict[int, list[int]] = {}
    for j, pos in enumerate(res.ok):
        batches.setdefault(pos // batch_size, []).append(j)
    points: list[SweepPoint] = []

    # 2. score, re-rank and measure at each value
    for i, (value, pipeline) in enumerate(zip(values, pipelines)):
        rels: list[np.ndarray] = []
        nrels: list[np.ndarray] = []
        for js in batches.values():
            desc = res.descriptors[js]
            ok = [queries[res.ok[j]] for j in js]
            scores = score_matrix(index, desc)
            scores = pipeline.apply(index, scores, desc, query_paths=[q.path for q in ok])
            rel, n_rel = relevance_matrix(full_ranking(scores), labels, [set(q.relevant) for q in ok])
            rels.append(np.asarray(rel, bool))
            nrels.append(np.asarray(n_rel))
        summary, per_query = summary_of(index, rels, nrels, len(res.skipped), gtm)
        summary["query_regions"] = bool(query_regions)
        points.append(SweepPoint(value, pipeline.options, summary, per_query))
        yield SweepStep(value, summary, i + 1, len(values), "evaluating", time.perf_counter() - start)
    return points


__all__ = ["PARAMETERS", "PARAMETER_NAMES", "SweepPoint", "SweepStep", "options_at", "parse_values", "sweep"]
