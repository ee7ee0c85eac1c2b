"""The approximate index: faiss IVF-PQ with exact re-scoring of its shortlist (:class:`AnnIndex`).

A faiss IVF-PQ index (compact codes, no second copy of the descriptors) proposes
``params.shortlist`` candidates per query; they are scored exactly (faiss's ``IndexRefine`` over the
same view of the file as :func:`._exact.exact_scores` scans, else :func:`._exact.rows_scores`) and
ordered by the ranking rule (descending score, ties by row), only them. Only what the shortlist
misses is approximate; the scores returned are exact dot products. At build time it tunes
``nprobe`` and the shortlist on its own data until its recall@10 against exact search is
:data:`TARGET_RECALL`, and measures both searches' speed (:class:`AnnTuning`, in the manifest,
with the rest of :class:`AnnParams`).

After an update of the index, :meth:`AnnIndex.updated` takes the removed references out of the
approximate index and adds the new ones, without training it again.

faiss is imported on first use (:func:`._exact._faiss`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index._exact import (
    _check_descriptors,
    _check_map,
    _chunk_rows,
    _exact_top,
    _faiss,
    _flat_view,
    _gather,
    _queries,
    exact_scores,
    rows_scores,
)
from museum_search.core.progress import Progress, wait
from museum_search.core.ranking import order

__all__ = [
    "ADD_STAGE",
    "TARGET_RECALL",
    "TRAIN_STAGE",
    "TUNE_STAGE",
    "AnnIndex",
    "AnnParams",
    "AnnTuning",
    "choose_params",
]

#: Stage names of the progress records.
TRAIN_STAGE = "training the approximate index"
ADD_STAGE = "adding to the approximate index"
TUNE_STAGE = "measuring the approximate index's recall"

# tuning (AnnIndex._tune): queries, the longest shortlist tried, exact queries timed
_TUNE_QUERIES = 200
_MAX_SHORTLIST = 8192
_TIMED_EXACT_QUERIES = 10
# after an update (AnnIndex.updated), tuning queries x references at most (the exact truth's cost):
# 100 queries at 1M (the truth of 200 took 15-23 s there under load, an append of 1,000 must take
# <= 60 s in all), 200 up to 500k; never fewer than _MIN_UPDATE_QUERIES
_UPDATE_PAIRS = 100_000_000
_MIN_UPDATE_QUERIES = 50
# AnnIndex.search by faiss's refine: results beyond k asked for, to settle ties by row
_TIE_MARGIN = 16

#: recall@10 against exact search that the approximate index is tuned to reach (:meth:`AnnIndex.build`)
TARGET_RECALL = 0.95
#: cosine of a tuning query to the reference it is made from (a noisy new "view" of it)
TUNE_COSINE = 0.8


@dataclass
class AnnTuning:
    """What :meth:`AnnIndex.build` measured on the index's own data (stored with :class:`AnnParams`).

    ``recall_at_10``: of the approximate search with the tuned ``nprobe``/``shortlist``, against the
    exact search, over ``queries`` queries (sampled references with noise, cosine ``query_cosine`` to
    them); ``held_out``: measured leave-one-out, each query's own reference left out of both the
    exact top 10 and the approximate result, so the recall is that of the *other* references (an
    index measured before this, without the field: False, its source reference counted as an easy
    hit); ``references``: how many the index held when the recall was measured (0: not recorded),
    at build time or again after an update (:meth:`AnnIndex.updated`); ``target``: the recall it was
    tuned to reach; ``ann_ms``, ``exact_ms``: p50 milliseconds per query of the approximate and the
    exact search (one query at a time, on the building machine: at build time; after an update the
    approximate one is timed again only when its settings were raised); ``steps``: the (nprobe,
    shortlist, recall) tried, in order, by the last measurement.
    """

    recall_at_10: float
    target: float
    queries: int
    query_cosine: float
    ann_ms: float
    exact_ms: float
    steps: list[tuple[int, int, float]] = field(default_factory=list)
    held_out: bool = False
    references: int = 0

    @property
    def meets_target(self) -> bool:
        return self.recall_at_10 >= self.target

    @property
    def faster(self) -> bool:
        """Whether the approximate search was measured faster than the exact one."""
        return self.ann_ms < self.exact_ms

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = [list(s) for s in self.steps]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> AnnTuning:
        try:
            if not isinstance(data, dict):
                raise TypeError(f"not a mapping: {type(data).__name__}")
            return cls(recall_at_10=float(data["recall_at_10"]), target=float(data["target"]),
                       queries=int(data["queries"]), query_cosine=float(data["query_cosine"]),
                       ann_ms=float(data["ann_ms"]), exact_ms=float(data["exact_ms"]),
                       steps=[(int(a), int(b), float(c)) for a, b, c in data.get("steps", [])],
                       held_out=bool(data.get("held_out", False)), references=int(data.get("references", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(
                f"the approximate index's measured recall and speed are damaged ({exc}): rebuild the index") from exc

    def summary(self) -> str:
        how = "held-out noisy references, leave-one-out" if self.held_out else "noisy references"
        on = f", on {self.references:,} references" if self.references else ""
        return (f"recall@10 {self.recall_at_10:.3f} against exact search (target {self.target:.2f}, "
                f"{self.queries} {how}{on}), {self.ann_ms:.1f} ms per query against {self.exact_ms:.1f} ms exact")


@dataclass
class AnnParams:
    """Parameters of an :class:`AnnIndex` (stored in the index manifest, :meth:`to_dict`).

    ``nlist``: inverted lists (k-means cells); ``m``: PQ sub-quantizers (bytes per reference with
    ``nbits = 8``); ``nprobe``: cells visited per query; ``shortlist``: candidates re-scored
    exactly per query; ``train_size``: references (a seeded random sample) the quantizers are
    trained on; ``seed``; ``train_iterations``: k-means iterations of the coarse quantizer;
    ``add_chunk``: references converted to float32 and added at once.
    """

    nlist: int
    m: int
    nbits: int = 8
    nprobe: int = 16
    shortlist: int = 800
    train_size: int = 65_536
    seed: int = 1234
    train_iterations: int = 10
    add_chunk: int = 16_384
    #: what :meth:`AnnIndex.build` measured when it tuned ``nprobe`` and ``shortlist`` on the
    #: index's own data (None: not tuned, e.g. an index built before tuning existed)
    tuning: AnnTuning | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tuning"}
        if self.tuning is not None:
            out["tuning"] = self.tuning.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnnParams:
        if not isinstance(data, dict):
            raise IndexFormatError("the approximate index's parameters are missing or damaged: rebuild the index")
        known = {f.name for f in fields(cls)} - {"tuning"}
        try:
            values: dict[str, Any] = {k: int(v) for k, v in data.items() if k in known}
            params = cls(**values)
        except (TypeError, ValueError) as exc:
            raise IndexFormatError(
                f"the approximate index's parameters are incomplete or damaged ({exc}): rebuild the index") from exc
        if data.get("tuning") is not None:
            params.tuning = AnnTuning.from_dict(data["tuning"])
        return params

    def padded_dim(self, dim: int) -> int:
        """The dimension the PQ works in: ``dim`` rounded up to a multiple of ``m`` (zero padded)."""
        return -(-int(dim) // self.m) * self.m


def choose_params(n: int, dim: int) -> AnnParams:
    """:class:`AnnParams` for ``n`` references of ``dim`` dimensions (measured on 1280-d clustered
    float16 descriptors, ``bench/bench_ann_threshold.py``).

    * ``nlist`` = the power of two nearest to sqrt(n) (256 at 100k, 1024 at 1M): fewer, fuller
      cells than the usual 4 sqrt(n), because on a small machine building (training, and
      assigning every reference to a cell: n x nlist x dim) is what costs, and the exact
      re-scoring of a long shortlist makes up for a coarser partition. At most n / 8.
    * ``m`` = dim / 16 sub-quantizers of 8 bits: 16 dimensions each, 80 bytes per reference at
      1280-d (zero padded to a multiple of ``m`` when needed). 8 dimensions each (160 bytes) is a
      better quantizer (recall@10 0.96 against 0.85 with 200 candidates at 100k) but faiss trains
      its 8-d k-means about 8 times slower (29 s against ~4 s on 10k samples): a longer shortlist
      is the cheaper way to the same recall.
    * ``nprobe`` = nlist / 32, at least 8 (recall did not move between 4 and 16 of 256 cells).
    * ``shortlist`` = 800 candidates re-scored exactly: recall@10 1.000 at 100k (0.971 with 400,
      0.845 with 200), for about 2-3 ms more per query (800 float16 rows read and converted).
    * ``train_size`` = 64 references per cell, at least 16,384 (the PQ's 256 centroids per
      sub-quantizer), at most 65,536 and ``n``; 10 k-means iterations.
    """
    n, dim = max(1, int(n)), max(1, int(dim))
    nlist = 1 << max(0, round(float(np.log2(np.sqrt(n)))))
    nlist = max(1, min(nlist, n // 8 or 1, 65_536))
    m = max(1, min(dim, round(dim / 16)))
    nbits = int(min(8, max(1, np.floor(np.log2(max(2, n // 4))))))  # PQ training needs >= 2**nbits points
    nprobe = min(nlist, max(8, nlist // 32))
    train_size = int(min(n, max(16_384, 64 * nlist), 65_536))
    return AnnParams(nlist=nlist, m=m, nbits=nbits, nprobe=nprobe, shortlist=800, train_size=train_size)


def _noisy_views(x: np.ndarray, rng: np.random.Generator, cosine: float) -> np.ndarray:
    """Unit vectors at ``cosine`` from each row of ``x`` (normalized), in random directions."""
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    u = rng.standard_normal(x.shape).astype(np.float32)
    u -= np.einsum("ij,ij->i", u, x)[:, None] * x
    u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(cosine * x + np.sqrt(1.0 - cosine * cosine) * u, dtype=np.float32)


def _add_rows(index: Any, x: np.ndarray, ids: np.ndarray | None = None) -> bool:
    """``index.add(x)`` (``ids`` None: numbered from ``ntotal`` on) or ``index.add_with_ids(x, ids)``:
    the same inverted lists (same rows, same order) and the same PQ codes, several times faster.

    faiss's IVF-PQ add encodes the residuals with ``ProductQuantizer::compute_codes``, which for
    16-d sub-vectors fills an n x m x 256 float table (1.3 GB for 16,384 rows, m = 80) by many
    small BLAS calls and then scans it: measured 1.5-2.7 s per 16,384 rows at 1280-d, 90-165 s
    of a 1M build, against 0.23 s for the coarse assignment. Here each step is what faiss's add
    does, but each sub-quantizer is one nearest-centroid search (``IndexFlatL2`` of its 256
    centroids, BLAS, no table: faiss's own ``compute_codes_with_assign_index``): the cell is
    ``quantizer.search(x, 1)`` (what ``quantizer.assign`` does), the residual ``x - centroid``
    (faiss's ``compute_residual``: ``x + -1 * c``, the same float32), each code byte its
    sub-vector's nearest centroid, and the entries go to their lists in row order. Other
    indexes (not IVF-PQ by residual with 8-bit codes, a direct map, lists not in memory) are
    added by faiss itself. Returns whether the rows were encoded here (False: by faiss)."""
    faiss = _faiss()
    x = np.ascontiguousarray(x, dtype=np.float32)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    simple = (isinstance(ivf, faiss.IndexIVFPQ) and bool(ivf.by_residual) and int(ivf.pq.nbits) == 8
              and int(ivf.code_size) == int(ivf.pq.M) and isinstance(lists, faiss.ArrayInvertedLists)
              and int(ivf.direct_map.type) == int(faiss.DirectMap.NoMap) and len(x) > 0
              and isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexFlatL2))
    pre = faiss.downcast_index(index)
    wrapped = isinstance(pre, faiss.IndexPreTransform)
    if simple and wrapped:  # the zero-padding wrapper: its transform first
        simple = int(pre.chain.size()) == 1
        if simple:
            x = np.ascontiguousarray(faiss.downcast_VectorTransform(pre.chain.at(0)).apply(x), dtype=np.float32)
    if not simple:
        if ids is None:
            index.add(x)
        else:
            index.add_with_ids(x, np.ascontiguousarray(ids, dtype=np.int64))
        return False
    n, start = len(x), int(index.ntotal)
    ids = np.arange(start, start + n, dtype=np.int64) if ids is None else np.ascontiguousarray(ids, dtype=np.int64)
    quantizer = faiss.downcast_index(ivf.quantizer)
    _, keys = quantizer.search(x, 1)
    keys = keys[:, 0]
    if keys.min() < 0:  # pragma: no cover - only NaN rows, which the index refuses
        raise MuseumSearchError("a reference could not be assigned to a cell of the approximate index (not finite?)")
    centroids = faiss.rev_swig_ptr(quantizer.get_xb(), int(quantizer.ntotal) * int(quantizer.d))
    centroids = np.asarray(centroids).reshape(int(quantizer.ntotal), int(quantizer.d))
    residual = x - centroids[keys]
    pq = ivf.pq
    m, ksub, dsub = int(pq.M), int(pq.ksub), int(pq.dsub)
    books = faiss.vector_to_array(pq.centroids).reshape(m, ksub, dsub)
    codes = np.empty((n, m), dtype=np.uint8)
    flat = faiss.IndexFlatL2(dsub)
    for j in range(m):
        flat.reset()
        flat.add(np.ascontiguousarray(books[j]))
        _, nearest = flat.search(np.ascontiguousarray(residual[:, j * dsub:(j + 1) * dsub]), 1)
        codes[:, j] = nearest[:, 0]
    by_list = np.argsort(keys, kind="stable")  # each list's entries in row order, as faiss adds them
    bounds = np.flatnonzero(np.diff(keys[by_list])) + 1
    for part in np.split(by_list, bounds):
        c_ids = np.ascontiguousarray(ids[part])
        c_codes = np.ascontiguousarray(codes[part])
        lists.add_entries(int(keys[part[0]]), len(part), faiss.swig_ptr(c_ids), faiss.swig_ptr(c_codes))
    ivf.ntotal = int(ivf.ntotal) + n
    if wrapped:
        pre.ntotal = int(pre.ntotal) + n
    return True


def _latency_ms(search: Callable[[np.ndarray], Any], queries: np.ndarray, most: int | None = None,
                budget_s: float = 3.0) -> float:
    """p50 milliseconds of ``search`` on one query at a time (up to ``most`` queries, and after the
    third no longer than ``budget_s`` seconds in all)."""
    times: list[float] = []
    begin = time.perf_counter()
    for i in range(len(queries) if most is None else min(most, len(queries))):
        t = time.perf_counter()
        search(queries[i:i + 1])
        times.append(1000 * (time.perf_counter() - t))
        if len(times) >= 3 and time.perf_counter() - begin > budget_s:
            break
    return float(np.median(times))


class AnnIndex:
    """An approximate index of N references: faiss ``IndexIVFPQ`` (inverted lists of PQ codes).

    Why IVF-PQ: it holds ``m`` bytes per reference (80 MB for 1M 1280-d references with
    ``m = 80``, plus 8 bytes of row number) instead of the descriptors themselves (HNSW or IVF-Flat keep a float copy, 5 GB at
    1M x 1280, which breaks the 3 GB memory goal); its ranking is approximate, so :meth:`search`
    re-scores its shortlist exactly from the (memory-mapped) descriptors.
    Why L2: the descriptors are unit vectors, so ``|q - x|^2 = |q|^2 + 1 - 2 q.x`` ranks the
    references exactly as the dot product does, whatever the query's norm; k-means cells and PQ
    codes of the residuals are built for L2 (faiss's inner-product IVF-PQ is less accurate on
    residuals).
    """

    def __init__(self, index: Any, params: AnnParams, dim: int):
        faiss = _faiss()
        self._index = index
        self.params = params
        self.dim = int(dim)
        self._ivf = faiss.extract_index_ivf(index)
        self._ivf.nprobe = int(params.nprobe)

    # ---- facts ---------------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        """References in the index (must equal the rows of the descriptors it serves)."""
        return int(self._index.ntotal)

    def summary(self) -> str:
        p = self.params
        t = p.tuning
        tuned = "" if t is None else f", recall@10 {t.recall_at_10:.3f} measured " + (
            f"on {t.references:,} references" if t.references else "at build time")
        return (f"faiss IVF-PQ, {self.ntotal:,} references, {p.nlist} cells (nprobe {p.nprobe}), "
                f"{p.m} x {p.nbits}-bit codes, exact re-scoring of {p.shortlist} candidates{tuned}")

    def __repr__(self) -> str:
        return f"AnnIndex({self.summary()})"

    # ---- building ------------------------------------------------------------------------
    @classmethod
    def _empty(cls, dim: int, params: AnnParams) -> Any:
        faiss = _faiss()
        pdim = params.padded_dim(dim)
        quantizer = faiss.IndexFlatL2(pdim)
        ivfpq = faiss.IndexIVFPQ(quantizer, pdim, int(params.nlist), int(params.m), int(params.nbits))
        ivfpq.cp.niter = int(params.train_iterations)
        ivfpq.cp.seed = int(params.seed)
        ivfpq.pq.cp.seed = int(params.seed) + 1
        ivfpq.pq.cp.niter = int(params.train_iterations)
        # the sample is what params.train_size says: no subsampling, no warnings on stderr
        for cp in (ivfpq.cp, ivfpq.pq.cp):
            cp.min_points_per_centroid = 1
            cp.max_points_per_centroid = max(cp.max_points_per_centroid, int(params.train_size))
        if pdim == dim:
            return ivfpq
        # zero padding up to a multiple of m (the faiss wrappers keep the parts alive)
        return faiss.IndexPreTransform(faiss.RemapDimensionsTransform(int(dim), pdim, True), ivfpq)

    @classmethod
    def build(cls, descriptors: np.ndarray, params: AnnParams | None = None, *,
              tune: bool | None = None) -> Generator[Progress, None, AnnIndex]:
        """Build the index of ``descriptors`` (N, D) float32/float16, as a progress generator.

        Stages: "training the approximate index" (a seeded random sample of ``params.train_size``
        rows, converted to float32), then "adding to the approximate index" (``params.add_chunk``
        rows at a time, each chunk converted alone and added by :func:`_add_rows`: faiss's lists and
        codes, encoded faster), then (``tune``: by default when ``params`` is
        not given) "measuring the approximate index's recall" (:meth:`_tune`: ``nprobe`` and
        ``shortlist`` raised until the recall@10 is :data:`TARGET_RECALL`, the result in
        ``params.tuning``). Closing the generator cancels: a training or adding call under way
        ends on its own thread and is dropped.
        """
        tune = params is None if tune is None else bool(tune)
        if tune and params is not None:
            params = replace(params)  # tuning changes nprobe and shortlist: not the caller's object
        d = _check_descriptors(descriptors)
        n, dim = d.shape
        if n < 2:
            raise MuseumSearchError(f"an approximate index needs at least 2 references, this index has {n}: "
                                    "search it exactly (--search exact)")
        params = params or choose_params(n, dim)
        start = time.perf_counter()

        def beat(done: int = 0, total: int = 0, stage: str = TRAIN_STAGE):
            return lambda: Progress(done, total, stage=stage, elapsed=time.perf_counter() - start)

        yield beat()()
        index = cls._empty(dim, params)
        rng = np.random.default_rng(params.seed)
        t = int(min(n, max(1, params.train_size)))
        sample = np.sort(rng.choice(n, size=t, replace=False)) if t < n else np.arange(n)
        x = np.empty((t, dim), dtype=np.float32)
        step = _chunk_rows(dim)
        for a in range(0, t, step):
            x[a:a + step] = _gather(d, sample[a:a + step])
            yield beat()()
        yield from wait(partial(index.train, x), beat(), announce=True)
        del x
        start = time.perf_counter()
        step = max(1, int(params.add_chunk))
        yield beat(0, n, ADD_STAGE)()
        for a in range(0, n, step):
            b = min(n, a + step)
            chunk = np.ascontiguousarray(d[a:b], dtype=np.float32)
            yield from wait(partial(_add_rows, index, chunk), beat(a, n, ADD_STAGE))
            yield beat(b, n, ADD_STAGE)()
        built = cls(index, params, dim)
        if tune:
            yield from built._tune(d)
        return built

    def _tune(self, d: np.ndarray, *, again: bool = False) -> Generator[Progress, None, None]:
        """Tune ``nprobe`` and ``shortlist`` on the index's own data, and measure (a progress generator).

        Queries: :data:`_TUNE_QUERIES` references (a seeded sample), each turned by a random direction
        to cosine :data:`TUNE_COSINE` from itself (a new "view"), and **held out**: the recall is
        measured leave-one-out, the query's own reference left out of both the truth and the result,
        so that it cannot count as an easy hit. The truth: each query's exact top 10 of the other
        references (:func:`_exact_top`, float32 dot products, one pass over the descriptors for all
        queries); the result: the top 11 of :meth:`search`, the source reference dropped (else the
        11th). From the current parameters on, while the recall@10 is below :data:`TARGET_RECALL`,
        either ``nprobe`` (up to ``nlist``) or the shortlist (up to :data:`_MAX_SHORTLIST`) is doubled,
        whichever gains more recall. Then one query at a time, p50 milliseconds of both searches.
        The result goes in ``params.tuning`` (and the parameters in ``params``); both searches' cost
        grows with nprobe and shortlist, so the first settings reaching the target are kept.

        ``again`` (after an update, :meth:`updated`): the same measurement on the updated references
        from the stored settings (raised as above if the recall fell below the target), with fewer
        queries on a large index (queries x references at most :data:`_UPDATE_PAIRS`: 100 at 1M;
        ``tuning.queries`` says how many); the speeds measured at build time are kept, the
        approximate one timed again only if the settings were raised (the exact search's speed
        does not depend on them).
        """
        n, dim = d.shape
        p = self.params
        before = p.tuning
        start = time.perf_counter()
        rng = np.random.default_rng(int(p.seed) + 2)
        m = int(min(_TUNE_QUERIES, n))
        if again:
            m = int(min(m, max(_MIN_UPDATE_QUERIES, _UPDATE_PAIRS // n)))
        k = int(min(10, n - 1))  # of the other references
        sources = np.sort(rng.choice(n, size=m, replace=False))
        q = _noisy_views(_gather(d, sources), rng, TUNE_COSINE)
        blocks = -(-n // _chunk_rows(dim))
        work = blocks + 16

        def beat(done: int) -> Callable[[], Progress]:
            return lambda: Progress(min(done, work), work, stage=TUNE_STAGE, elapsed=time.perf_counter() - start)

        yield beat(0)()
        truth = yield from _exact_top(d, q, k, sources, lambda i: beat(i)())
        done = blocks

        def recall(nprobe: int, shortlist: int) -> float:
            self._set(nprobe, shortlist)
            rows, _ = self.search(d, q, k + 1)
            got = [r[r != s][:k] for r, s in zip(rows, sources)]  # the source reference left out
            return float(np.mean([len(np.intersect1d(g[g >= 0], t)) / k for g, t in zip(got, truth)]))

        first = (int(p.nprobe), int(p.shortlist))
        setting = first
        got = yield from wait(partial(recall, *setting), beat(done))
        steps = [(*setting, round(got, 4))]
        cap = int(min(n, max(_MAX_SHORTLIST, p.shortlist)))
        while got < TARGET_RECALL:
            options = [(min(int(p.nlist), 2 * setting[0]), setting[1]), (setting[0], min(cap, 2 * setting[1]))]
            options = [o for o in options if o != setting]
            if not options:
                break
            tried = []
            for o in options:
                done += 1
                r = yield from wait(partial(recall, *o), beat(done))
                steps.append((*o, round(r, 4)))
                tried.append((r, o))
            got, setting = max(tried, key=lambda t: t[0])  # equal recall: the first (more cells)
        self._set(*setting)
        if again and before is not None and setting == first:
            ann_ms, exact_ms = before.ann_ms, before.exact_ms
        else:
            ann_ms = yield from wait(partial(_latency_ms, lambda v: self.search(d, v, k), q), beat(work - 2))
            if again and before is not None:
                exact_ms = before.exact_ms
            else:
                exact_ms = yield from wait(partial(_latency_ms, lambda v: order(exact_scores(d, v), k), q,
                                                   _TIMED_EXACT_QUERIES), beat(work - 1))
        self.params.tuning = AnnTuning(recall_at_10=round(got, 4), target=TARGET_RECALL, queries=m,
                                       query_cosine=TUNE_COSINE, ann_ms=round(ann_ms, 3),
                                       exact_ms=round(exact_ms, 3), steps=steps, held_out=True, references=n)
        yield beat(work)()

    def _set(self, nprobe: int, shortlist: int) -> None:
        """Search with ``nprobe`` cells and a shortlist of ``shortlist`` candidates from now on."""
        self.params.nprobe, self.params.shortlist = int(nprobe), int(shortlist)
        self._ivf.nprobe = int(nprobe)

    def updated(self, descriptors: np.ndarray, old_to_new: np.ndarray) -> Generator[Progress, None, AnnIndex]:
        """A copy of this index for the references of an update, as a progress generator (stage
        "adding to the approximate index"); this index is left as it is.

        ``old_to_new``: for each reference of this index, its row in ``descriptors`` (N, D), or -1
        when it was removed; the kept rows keep their order. The removed references leave their
        inverted lists, the kept ones are renumbered there (their PQ codes are kept, not encoded
        again), and the rows of ``descriptors`` that no reference maps to (new or changed photos)
        are added (as ``add_with_ids`` would, by :func:`_add_rows`, ``params.add_chunk`` at a time). The coarse quantizer and the
        PQ are *not* trained again: the result is what adding every reference, in row order, to
        this index's trained (emptied) quantizer would give (the inverted lists hold the same
        rows in the same order, with the same codes), not what :meth:`build` would give from
        scratch (that trains on a sample of the new references). A tuned index's recall is then
        measured again on the updated references (stage "measuring the approximate index's
        recall", :meth:`_tune` with ``again``: ``nprobe``/``shortlist`` raised if it fell below the
        target), so ``params.tuning`` describes them; the copy has its own ``params``. Closing the
        generator cancels.
        """
        d = _check_descriptors(descriptors)
        n, dim = d.shape
        if dim != self.dim:
            raise ValueError(f"the descriptors are {dim}-d, the approximate index is {self.dim}-d")
        m = _check_map(old_to_new, self.ntotal, n)
        start = time.perf_counter()

        def beat(done: int) -> Callable[[], Progress]:
            return lambda: Progress(done, n, stage=ADD_STAGE, elapsed=time.perf_counter() - start)

        yield Progress(0, n, stage=ADD_STAGE)
        index, kept = None, 0
        for index, _, kept in self._copy(m):  # noqa: B007 - the last copy (complete) is used below
            yield Progress(0, n, stage=ADD_STAGE, elapsed=time.perf_counter() - start)
        assert index is not None  # _copy yields at least once
        added = np.setdiff1d(np.arange(n, dtype=np.int64), m[m >= 0])
        step = max(1, int(self.params.add_chunk))
        for a in range(0, len(added), step):
            rows = np.ascontiguousarray(added[a:a + step])
            chunk = np.ascontiguousarray(_gather(d, rows))
            yield from wait(partial(_add_rows, index, chunk, rows), beat(kept + a))
        if int(index.ntotal) != n:  # pragma: no cover - faiss's own bookkeeping
            raise MuseumSearchError(f"the updated approximate index holds {int(index.ntotal):,} references, "
                                    f"not {n:,}: rebuild the index")
        yield Progress(n, n, stage=ADD_STAGE, elapsed=time.perf_counter() - start)
        out = type(self)(index, replace(self.params), dim)
        if self.params.tuning is not None:  # what was measured is of the old references: measure again
            yield from out._tune(d, again=True)
        return out

    def _copy(self, old_to_new: np.ndarray | None = None):
        """An owned, writable copy of the faiss index with in-memory inverted lists, each list's
        entries renumbered by ``old_to_new`` (-1: dropped; None: as they are); a generator of
        ``(index, its IVF, entries so far)``, every 64 lists, the last one complete. (A memory-mapped
        index can be neither cloned nor serialized into something that reads back: its lists are
        faiss ``OnDiskInvertedLists``.)"""
        faiss = _faiss()
        src = self._ivf.invlists
        # the trained quantizers; the lists are replaced by new ones, filled one by one (faiss reads
        # serialized on-disk lists without their data only with IO_FLAG_SKIP_IVF_DATA, and in-memory
        # ones not at all with it)
        in_memory = isinstance(faiss.downcast_InvertedLists(src), faiss.ArrayInvertedLists)
        index = faiss.deserialize_index(faiss.serialize_index(self._index),
                                        0 if in_memory else faiss.IO_FLAG_SKIP_IVF_DATA)
        ivf = faiss.extract_index_ivf(index)
        nlist, cs = int(self._ivf.nlist), int(src.code_size)
        lists = faiss.ArrayInvertedLists(nlist, cs)
        ivf.replace_invlists(lists, True)
        lists.this.disown()  # the IVF owns it now
        total = 0
        for c in range(nlist):
            size = int(src.list_size(c))
            if size:
                ptr = src.get_ids(c)
                ids = faiss.rev_swig_ptr(ptr, size).astype(np.int64)
                src.release_ids(c, ptr)
                ptr = src.get_codes(c)
                codes = faiss.rev_swig_ptr(ptr, size * cs).reshape(size, cs).copy()
                src.release_codes(c, ptr)
                if old_to_new is not None:
                    ids = old_to_new[ids]
                    keep = ids >= 0
                    ids, codes = np.ascontiguousarray(ids[keep]), np.ascontiguousarray(codes[keep])
                if len(ids):
                    lists.add_entries(c, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(codes))
                total += len(ids)
            if c % 64 == 63 and c + 1 < nlist:
                yield index, ivf, total
        ivf.ntotal = total
        index.ntotal = total  # the same object, or the zero-padding wrapper around it
        yield index, ivf, total

    # ---- searching -----------------------------------------------------------------------
    def candidates(self, queries: np.ndarray, n: int | None = None) -> np.ndarray:
        """(Q, n) int64 candidate rows per query (``params.shortlist`` by default), by approximate
        distance, -1 where the visited cells hold fewer."""
        q = _queries(queries, self.dim)
        n = int(self.params.shortlist if n is None else n)
        if n <= 0 or q.shape[0] == 0:
            return np.full((q.shape[0], max(0, n)), -1, dtype=np.int64)
        _, labels = self._index.search(q, n)
        return labels.astype(np.int64, copy=False)

    def search(self, descriptors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` references per query: the shortlist (``params.shortlist`` candidates, at least
        ``k``), scored exactly (:func:`rows_scores`, dot products), ordered by the project's ranking
        rule (descending score, ties by lower row). Returns ``(rows (Q, k) int64, scores (Q, k)
        float32)``; rows -1 and scores -inf where fewer than ``k`` candidates were found."""
        d = _check_descriptors(descriptors)
        if d.shape[0] != self.ntotal:
            raise MuseumSearchError(
                f"the approximate index holds {self.ntotal:,} references, the descriptors {d.shape[0]:,}: "
                "rebuild the index")
        k = max(0, int(k))
        q = _queries(queries, self.dim)
        refine = self._refine(d) if k > 0 and q.shape[0] else None
        if refine is not None:
            found = self._search_refined(refine, q, k)
            if found is not None:
                return found
        rows = self.candidates(q, max(self.params.shortlist, k))
        # sort each query's candidates by row (-1 last), so that ties in position are ties by row
        rows = np.sort(np.where(rows < 0, np.iinfo(np.int64).max, rows), axis=1)
        rows[rows == np.iinfo(np.int64).max] = -1
        scores = rows_scores(d, q, rows)
        top = order(scores, min(k, rows.shape[1]))
        out_rows = np.take_along_axis(rows, top, axis=1)
        out_scores = np.take_along_axis(scores, top, axis=1)
        out_rows[~np.isfinite(out_scores)] = -1
        if top.shape[1] < k:  # pad (only with k larger than the shortlist could hold)
            pad = k - top.shape[1]
            out_rows = np.pad(out_rows, ((0, 0), (0, pad)), constant_values=-1)
            out_scores = np.pad(out_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        return out_rows, out_scores

    def _refine(self, d: np.ndarray) -> Any:
        """faiss ``IndexRefine`` of this index over :func:`_flat_view` of ``d`` (its float16 rows in
        place), scoring by inner product; None without such a view. faiss's refine then does in
        one call what :meth:`search` does otherwise (the shortlist, its exact scores, the best),
        with the same float16 arithmetic as :func:`exact_scores` on that view."""
        view = _flat_view(d)
        if view is None or int(view.ntotal) != self.ntotal:
            return None
        cached = getattr(self, "_refined", None)
        if cached is not None and cached[0] is view:
            return cached[1]
        faiss = _faiss()
        # built without a refine index (faiss would require the same metric: the IVF-PQ is L2,
        # which ranks unit vectors as the inner product does), which is then set, with the metric
        # its final ranking uses: the inner product of the exact scores
        refine = faiss.IndexRefine(self._index, None)
        refine.refine_index = view
        refine.metric_type = faiss.METRIC_INNER_PRODUCT
        refine.ntotal = view.ntotal
        refine.is_trained = True
        self._refined = (view, refine)  # the view outlives the refine that points at it
        return refine

    def _search_refined(self, refine: Any, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`search` by ``refine``: its ``k + 16`` best of the shortlist, ordered by the ranking
        rule; None when a tie at the ``k``-th score reaches past them, or when the visited cells
        hold fewer references than the shortlist (then :meth:`search` ranks the shortlist itself)."""
        faiss = _faiss()
        short = max(self.params.shortlist, k)
        k2 = min(short, k + _TIE_MARGIN)
        params = faiss.IndexRefineSearchParameters()
        params.k_factor = (short + 0.5) / k2  # faiss's shortlist: int(k2 * k_factor) = short
        dist, labels = refine.search(q, k2, params=params)
        labels = labels.astype(np.int64, copy=False)
        if labels.min(initial=0) < 0:
            # fewer candidates than the shortlist in the visited cells: faiss (1.15) ranks the
            # missing ones, at the IVF-PQ's "worst" L2 distance, first by inner product
            return None
        valid = labels >= 0
        scores = np.where(valid, dist, -np.inf).astype(np.float32)
        # the candidates by row (-1 last), so that ties in position are ties by row
        by_row = np.argsort(np.where(valid, labels, np.iinfo(np.int64).max), axis=1, kind="stable")
        rows = np.take_along_axis(labels, by_row, axis=1)
        scores = np.take_along_axis(scores, by_row, axis=1)
        kk = min(k, k2)
        top = order(scores, kk)
        out_rows = np.take_along_axis(rows, top, axis=1)
        out_scores = np.take_along_axis(scores, top, axis=1)
        if k2 < short and kk > 0:
            last = scores.min(axis=1)  # the k2-th score (every query has k2 candidates, or -inf)
            if np.any(np.isfinite(last) & (last >= out_scores[:, kk - 1])):
                return None
        out_rows[~np.isfinite(out_scores)] = -1
        if kk < k:
            out_rows = np.pad(out_rows, ((0, 0), (0, k - kk)), constant_values=-1)
            out_scores = np.pad(out_scores, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return out_rows, out_scores

    # ---- persistence ---------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The faiss index, serialized (write it as ``ann-<gen>.faiss``; :meth:`read` reads it). A
        memory-mapped one (:meth:`read`) is copied to memory first: faiss would write its lists as
        on-disk lists that do not read back."""
        faiss = _faiss()
        index = self._index
        if not isinstance(faiss.downcast_InvertedLists(self._ivf.invlists), faiss.ArrayInvertedLists):
            for index, _, _ in self._copy():  # noqa: B007 - keeps the last copy (complete)
                pass
        return faiss.serialize_index(index).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, params: AnnParams) -> AnnIndex:
        faiss = _faiss()
        index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        return cls(index, params, _input_dim(index))

    @classmethod
    def read(cls, path: str | Path, params: AnnParams) -> AnnIndex:
        """Read ``path`` written from :meth:`to_bytes`: memory-mapped and read-only (the PQ codes
        stay in the file; faiss 1.15 supports it for IVF-PQ), else read whole if that fails."""
        faiss = _faiss()
        try:
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            try:
                index = faiss.read_index(str(path))
            except RuntimeError as exc:
                raise IndexFormatError(f"the approximate index {path} cannot be read ({exc}): rebuild the index") from exc
        return cls(index, params, _input_dim(index))


def _input_dim(index: Any) -> int:
    return int(index.d)
