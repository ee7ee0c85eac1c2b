"""Re-rankers and the pipeline that chains them.

Every re-ranker has a ``name`` and ``rerank(scores, **context) -> scores`` over a (Q, G) score
matrix (higher is better). The pipeline builds the context each one needs from the index
(descriptors, labels, ICFRR's neighbour graph, query descriptors, query images/paths) so callers
only say ``pipeline.apply(index, scores, query_descriptors, query_paths=...)``. Only what a stage
needs is read: the gallery descriptors (a memory-mapped (N, D) matrix, converted to float32 whole)
only for ``aqe``/``dba``; ICFRR reads each reference's ``K_g`` nearest neighbours
(``index.neighbour_lists``), never an N x N matrix.

They change the global scores before the query pipeline verifies its shortlist
(:mod:`museum_search.core.answer._pipeline`; geometric verification is a step of that pipeline, not a
re-ranker). Combined, ``aqe`` or ``dba`` come first (they change descriptors, so they re-score from
scratch), e.g. ``dba,icfrr``.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from museum_search.core.answer._expansion import AQEReranker, DBAReranker, dba
from museum_search.core.answer._icfrr import ICFRRParams, ICFRRReranker, graph_from_neighbours, suggest_params
from museum_search.core.answer._search import whole_image
from museum_search.core.errors import MuseumSearchError

NAMES = ("icfrr", "aqe", "dba")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankOptions:
    k_q: int | None = None  # None: suggested from the collection
    k_g: int | None = None
    beta: float = 0.5
    iterations: int = 5
    icfrr_mode: str = "paper"
    qe_n: int = 2
    qe_alpha: float = 3.0


@dataclass
class Rerankers:
    names: list[str]
    options: RerankOptions
    _stages: list[Any] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.names)

    def summary(self) -> str:
        return "+".join(self.names) if self.names else "none"

    def apply(
        self,
        index,
        scores: np.ndarray,
        query_descriptors: np.ndarray,
        *,
        query_paths: Sequence[str] | None = None,
        query_images: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        """Re-rank the (Q, G) ``scores`` of ``query_descriptors`` against ``index``."""
        q = whole_image(query_descriptors)  # query expansion works on the whole-image descriptor
        desc = None  # the gallery as float32: only for the stages that read descriptors (aqe, dba)
        for position, (name, stage) in enumerate(zip(self.names, self._stages)):
            ctx: dict[str, Any] = dict(
                index=index, labels=index.labels, query_descriptors=q,
                query_paths=list(query_paths) if query_paths is not None else None,
                query_images=list(query_images) if query_images is not None else None,
            )
            if name in ("aqe", "dba"):
                if desc is None:
                    gallery = index.descriptors
                    _check_expansion_size(gallery, name)
                    desc = np.asarray(gallery, dtype=np.float32)
                ctx["descriptors"] = desc
                if name == "dba":
                    ctx["dba_gallery"] = _dba_gallery(index, desc, self.options)
            if name == "icfrr":
                params = stage.params_for(ctx["labels"])
                ctx["graph"] = icfrr_graph(index, params.k_g, np.shape(scores)[-1])
                # after another re-ranker the scores are no longer dot products: use them as s0
                ctx["scores_are"] = "dot" if position == 0 else "neg_distance"
            scores = np.asarray(stage.rerank(np.asarray(scores, dtype=np.float32), **ctx), dtype=np.float32)
        return scores


#: αQE and DBA re-score every reference with the whole gallery in float32 memory: refused above
#: this many bytes of it (a million 1280-d references are 5.1 GB), with what to use instead.
EXPANSION_MAX_BYTES = 2 << 30


def _check_expansion_size(gallery, name: str) -> None:
    n, dim = np.shape(gallery)
    if n * dim * 4 > EXPANSION_MAX_BYTES:
        raise MuseumSearchError(
            f"{'αQE' if name == 'aqe' else 'DBA'} re-scores every reference with the whole gallery in memory as "
            f"float32 ({n * dim * 4 / 1e9:.1f} GB for these {n:,} references): on an index this large use ICFRR "
            "(from the stored neighbour lists) or no re-ranking")


#: DBA-augmented gallery per index (dropped with the index), for the last (n, alpha) used.
_DBA_CACHE: "weakref.WeakKeyDictionary[Any, tuple[tuple[int, float], np.ndarray]]" = weakref.WeakKeyDictionary()


#: ICFRR graphs per index (dropped with the index): {(k_g, G): ICFRRGraph}, the last few used.
_GRAPH_CACHE: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Any]]" = weakref.WeakKeyDictionary()
_GRAPHS_PER_INDEX = 2  # a sweep of K uses one at a time; 12 bytes x N x K_g each


def icfrr_graph(index, k_g: int, size: int):
    """The :class:`~.icfrr.ICFRRGraph` of ``index`` for ``k_g`` (capped at ``size - 1``), cached
    per index and ``k_g``.

    Built from ``index.neighbour_lists(k_g)`` (each reference's nearest other references, best
    first) by :func:`~.icfrr.graph_from_neighbours`: O(N K_g), no N x N matrix. ``index``: any
    object with ``neighbour_lists(k)`` that can be weakly referenced. ``size``: the number of
    references (the columns of the scores).
    """
    kg = max(0, min(int(k_g), int(size) - 1))
    key = (kg, int(size))
    graphs = _GRAPH_CACHE.get(index)
    if graphs is None:
        graphs = {}
        _GRAPH_CACHE[index] = graphs
    graph = graphs.get(key)
    if graph is None:
        if kg == 0:  # fewer than 2 references: no neighbours
            graph = graph_from_neighbours(np.empty((int(size), 0), np.int32), 0, size=size)
        else:
            graph = graph_from_neighbours(index.neighbour_lists(kg), kg, size=size)
        while len(graphs) >= _GRAPHS_PER_INDEX:
            graphs.pop(next(iter(graphs)))
        graphs[key] = graph
    return graph


def icfrr_k_g(labels, options: RerankOptions | None = None) -> int:
    """The K_g ICFRR runs with: ``options.k_g`` when set by hand, else suggested from ``labels``
    (:func:`~.icfrr.suggest_params`). The neighbour lists must hold at least this many."""
    if options is not None and options.k_g is not None:
        return int(options.k_g)
    return suggest_params(labels).k_g


def _dba_gallery(index, desc: np.ndarray, opts: RerankOptions) -> np.ndarray:
    """DBA-augmented gallery, computed once per index and parameters."""
    params = (opts.qe_n, opts.qe_alpha)
    cached = _DBA_CACHE.get(index)
    if cached is None or cached[0] != params:
        cached = (params, dba(desc, n=opts.qe_n, alpha=opts.qe_alpha))
        _DBA_CACHE[index] = cached
    return cached[1]


def parse_names(spec: str | Sequence[str] | None) -> list[str]:
    if not spec:
        return []
    names = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    names = [n for n in names if n != "none"]
    for n in names:
        if n not in NAMES:
            raise MuseumSearchError(f"unknown re-ranker {n!r}; choose from {', '.join(NAMES)} (comma-separated)")
    if len(set(names)) != len(names):
        raise MuseumSearchError(f"re-ranker listed twice in {spec!r}")
    return names


def build_rerankers(spec: str | Sequence[str] | None, options: RerankOptions | None = None) -> Rerankers:
    """The re-rankers from a comma-separated list such as ``"dba,icfrr"``."""
    options = options or RerankOptions()
    names = parse_names(spec)
    stages: list[Any] = []
    for n in names:
        if n == "icfrr":
            if options.beta < 0 or options.iterations < 1:
                raise MuseumSearchError("ICFRR needs beta >= 0 and at least one iteration")
            if options.icfrr_mode not in ("paper", "reference"):
                raise MuseumSearchError("ICFRR mode must be 'paper' or 'reference'")
            stages.append(_ICFRRStage(options, ICFRRParams, ICFRRReranker))
        elif n == "aqe":
            stages.append(AQEReranker(n=options.qe_n, alpha=options.qe_alpha))
        elif n == "dba":
            stages.append(DBAReranker(n=options.qe_n, alpha=options.qe_alpha))
    return Rerankers(names, options, stages)


def icfrr_advice(labels, options: RerankOptions | None = None) -> str | None:
    """A warning when ICFRR cannot help this collection with these ``options``, else None.

    ICFRR moves up the references that the query's top results have as close neighbours in the
    collection. With one photo per object, those neighbours are always other objects, so it can
    only push wrong answers up, whatever K_q and K_g (the 287 paintings: MP@1 0.80 without it,
    0.30 at K = 2, 0.03 at K = 10). With two photos per object the suggested K_q = K_g = 1 has the
    same effect: the top result gets no support from itself (r[i, i] = inf) and is overtaken by its
    nearest gallery neighbour. ``options``: K_q/K_g set by hand (None: suggested from the labels).
    The Evaluation and Search tabs show this warning wherever ICFRR runs; the pipeline logs it.
    """
    if len(labels) == 0:
        return None
    counts = Counter(labels)
    single = sum(1 for c in counts.values() if c == 1)
    if 2 * single > len(counts):
        return (f"ICFRR cannot help this collection: {single:,} of its {len(counts):,} objects have a single "
                "reference photo, so ICFRR can only move other objects up, whatever K_q and K_g (lower MP@1 "
                "and MAP). Use geometric verification instead.")
    by_hand = options is not None and options.k_q is not None and options.k_g is not None
    if by_hand or suggest_params(labels).k_q >= 2:
        return None
    return ("ICFRR needs several reference photos per object; this collection has fewer than 3 per "
            "object, so ICFRR with the suggested K_q = K_g = 1 will likely make results worse "
            "(set K_q/K_g by hand, or use geometric verification).")


#: The ICFRR advice already logged by this process (each said once).
_ADVISED: set[str] = set()


class _ICFRRStage:
    """ICFRR with K_q/K_g suggested from the collection when not given.

    One :class:`ICFRRReranker` is kept per score convention so its prepared gallery graph is
    reused across calls on the same index.
    """

    name = "icfrr"

    def __init__(self, options: RerankOptions, params_cls, reranker_cls):
        self.options = options
        self._params_cls = params_cls
        self._reranker_cls = reranker_cls
        self._rerankers: dict[tuple, Any] = {}

    def params_for(self, labels) -> Any:
        o = self.options
        base = suggest_params(labels) if o.k_q is None or o.k_g is None else None
        advice = icfrr_advice(labels, o)
        if advice and advice not in _ADVISED:  # once per process, not at every run or retry
            _ADVISED.add(advice)
            log.warning("%s", advice)
        k_q, k_g = o.k_q, o.k_g
        if base is not None:  # one of them is not set by hand
            k_q = k_q if k_q is not None else base.k_q
            k_g = k_g if k_g is not None else base.k_g
        return self._params_cls(
            k_q=k_q,
            k_g=k_g,
            beta=o.beta, max_iter=o.iterations, mode=o.icfrr_mode,
        )

    def rerank(self, scores: np.ndarray, *, scores_are: str = "dot", **ctx: Any) -> np.ndarray:
        params = self.params_for(ctx["labels"])
        key = (scores_are, params.k_q, params.k_g, params.beta, params.max_iter, params.mode)
        if key not in self._rerankers:
            self._rerankers = {key: self._reranker_cls(params, scores_are=scores_are)}
        return self._rerankers[key].rerank(scores, **ctx)
