"""Search at scale: exact scores of memory-mapped (float16) descriptors, an approximate (faiss
IVF-PQ) index with exact re-scoring of its shortlist, and each reference's nearest neighbours.

Four ways to score a query against N references:

* :func:`exact_scores`: every reference. float32 descriptors are multiplied in place (a memory
  map stays a memory map). A float16 .npy memory map is scanned by faiss's fp16 flat index over the
  file's own pages (:func:`_flat_view`: no conversion, no copy); other float16 descriptors are
  converted by bit arithmetic (exact, several times faster than numpy's cast) a block of rows at a
  time into a buffer each thread reuses (1 MB), never whole: at 1M x 1280 a float32 copy is 5 GB.
* :func:`exact_prefix`: the top of each query's exact ranking only (every reference above the
  largest of its regions' ``m``-th scores, with :func:`exact_scores`'s very scores), from faiss's
  scan of the same view for each region's top ``m``: a heap of ``m``, not of N (what
  ``search.top`` and ``search.ranking_scores`` use in exact mode).
* :func:`rows_scores` / :func:`candidate_scores`: the exact dot products of each query with its own
  candidate rows only.
* :class:`AnnIndex`: a faiss IVF-PQ index (compact codes, no second copy of the descriptors)
  proposes ``params.shortlist`` candidates per query; they are scored exactly (faiss's
  ``IndexRefine`` over the same view of the file, else :func:`rows_scores`) and ordered by the
  ranking rule (descending score, ties by row), only them. Only what the shortlist
  misses is approximate; the scores returned are exact dot products. At build time it tunes
  ``nprobe`` and the shortlist on its own data until its recall@10 against exact search is
  :data:`TARGET_RECALL`, and measures both searches' speed (:class:`AnnTuning`, in the manifest).

:func:`resolve_mode` turns ``--search exact|ann|auto`` into "exact" or "ann": ``auto`` uses the
approximate index when its build measured it faster than exact search and at the target recall;
for an index built before that measurement, from :data:`AUTO_MIN_REFERENCES` references (measured
by ``bench/bench_ann_threshold.py``).

:func:`neighbour_lists` gives each reference's ``k`` nearest *other* references with exactly the
arithmetic and tie rule of ICFRR's gallery ranks (``-D`` from float64 dot products
rounded to float32, self excluded, ties by lower row), without an N x N matrix: a float32 pass
pre-selects the candidates (with a proven error margin, so nothing is lost), and only those are
scored again in float64. With an :class:`AnnIndex` (for indexes too large for an O(N^2) pass)
the candidates come from a k-NN graph method (:mod:`.knn`: balanced cells, each reference
against the members of its nearest cells), then the same exact re-scoring.

After an update of the index, :func:`update_neighbour_lists` keeps the lists that cannot change and
computes only the others again (identical to computing them all again), and
:meth:`AnnIndex.updated` takes the removed references out of the approximate index and adds the new
ones, without training it again.

faiss is imported on first use (``pip install faiss-cpu``); the exact functions do not need it.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index._knn import KnnParams, knn_candidates
from museum_search.core.progress import Progress, wait
from museum_search.core.ranking import grouped_order, merge_top, neg_distance, order

__all__ = [
    "AUTO_MIN_REFERENCES",
    "NEIGHBOURS_STAGE",
    "SEARCH_MODES",
    "TARGET_RECALL",
    "AnnIndex",
    "AnnParams",
    "AnnTuning",
    "candidate_scores",
    "choose_params",
    "exact_scores",
    "faiss_available",
    "neighbour_lists",
    "update_neighbour_lists",
    "resolve_mode",
    "rows_scores",
]

SEARCH_MODES = ("exact", "ann", "auto")

#: ``--search auto`` uses the approximate index from this many references on (when the index has
#: one), and the index builds one from this size. Measured by ``bench/bench_ann_threshold.py``
#: (bench/results/ann_threshold.json: clustered 1280-d float16 descriptors, memory-mapped, one
#: query at a time, a shared 2-core machine, one run). p50 per query, exact / ann (recall@10):
#:     10,000:  49 ms /  4.8 ms (1.000)       100,000: 224 ms / 8.3 ms (1.000)
#:     30,000:  86 ms /  7.9 ms (1.000)       300,000: 714 ms / 8.0 ms (0.986)
#: The rule: the smallest measured size where exact search is at least 3 times slower than ann
#: *and* slow enough to notice (>= 100 ms), with recall@10 >= 0.95. Below it exact search answers
#: in under 0.1 s with no approximation and no index to build (ann is 10x faster from 10k on, but
#: there it saves tens of milliseconds); from 100k it is 27x faster (89x at 300k). With float32
#: descriptors exact search is faster (no conversion), so this errs on the exact side for them.
AUTO_MIN_REFERENCES = 100_000

#: Stage names of the progress records.
TRAIN_STAGE = "training the approximate index"
ADD_STAGE = "adding to the approximate index"
NEIGHBOURS_STAGE = "finding each reference's nearest neighbours"
TUNE_STAGE = "measuring the approximate index's recall"

# float32 bytes converted (or gathered) at once: bounds the temporary memory of every loop here.
_CHUNK_BYTES = 32 << 20
# rows x rows float32 score blocks of the exact neighbour pass (4096 x 4096 = 64 MB).
_BLOCK_ROWS = 4096
# up to this many queries (a photo's 5 regions, a few photos), exact_scores scores each on its own
# (faiss's scan, or einsum per block: no BLAS threads); above, a matrix product per block. Measured
# on the loaded 2-core machine, 5 queries at 100k x 1280: 1.4 s by faiss's scan, 3.3 s by products.
_FEW_QUERIES = 8
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
# float64 elements gathered at once when candidates are scored again exactly (64 MB).
_EXACT_ELEMENTS = 1 << 23


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_faiss_module = None


def _faiss():
    """faiss, imported once, with its OpenMP threads set to the cores this process may use."""
    global _faiss_module
    if _faiss_module is None:
        # OpenMP threads that wait passively: faiss's default spinning makes a 2-core machine with
        # any other load several times slower (PQ training measured 5.4 s passive vs 29 s spinning
        # with 2 threads on a busy 2-core machine, 4.8 s with 1). Read when faiss's OpenMP starts.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import faiss
        except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
            raise MuseumSearchError(
                "approximate search needs faiss: pip install faiss-cpu (or search with --search exact)") from exc
        faiss.omp_set_num_threads(_threads())
        _faiss_module = faiss
    return _faiss_module


def faiss_available() -> bool:
    """Whether faiss can be imported here (the kiosk build leaves it out: it searches exactly)."""
    try:
        _faiss()
    except MuseumSearchError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Search modes
# --------------------------------------------------------------------------------------------


def resolve_mode(mode: str, n: int, has_ann: bool | AnnIndex | None) -> str:
    """"exact" or "ann" for ``--search mode`` on an index of ``n`` references. ``has_ann``: its
    approximate index (:class:`AnnIndex`), or whether it has one (True/False/None).

    ``auto``: "ann" when the approximate index was tuned at build time (:class:`AnnTuning`) and
    measured there both faster than the exact search and at the target recall; with an index
    built before that measurement existed (or given only as True), the old rule: "ann" iff it has
    one and ``n >= AUTO_MIN_REFERENCES``."""
    if mode not in SEARCH_MODES:
        raise MuseumSearchError(f"unknown search mode {mode!r}: use one of {', '.join(SEARCH_MODES)}")
    if mode == "exact":
        return "exact"
    present = has_ann is not None and has_ann is not False
    if mode == "ann":
        if not present:
            raise MuseumSearchError(
                f"this index ({n:,} references) has no approximate (ANN) index: search it with --search exact "
                "(or auto), or build one: rebuild it with `museum-search index ... --ann yes`, or update it "
                "with `museum-search update INDEX --ann yes`")
        return "ann"
    if not present:
        return "exact"
    tuning = has_ann.params.tuning if isinstance(has_ann, AnnIndex) else None
    if tuning is not None:
        return "ann" if tuning.meets_target and tuning.faster else "exact"
    return "ann" if int(n) >= AUTO_MIN_REFERENCES else "exact"


# --------------------------------------------------------------------------------------------
# Exact scores
# --------------------------------------------------------------------------------------------


def _check_descriptors(descriptors: Any) -> np.ndarray:
    d = descriptors if isinstance(descriptors, np.ndarray) else np.asarray(descriptors)
    if d.ndim != 2:
        raise ValueError(f"descriptors must be a (N, D) matrix, got shape {d.shape}")
    if d.dtype.kind != "f":
        raise ValueError(f"descriptors must be floats, got {d.dtype}")
    return d


def _queries(queries: Any, dim: int) -> np.ndarray:
    q = np.ascontiguousarray(np.atleast_2d(np.asarray(queries, dtype=np.float32)))
    if q.ndim != 2:
        raise ValueError(f"queries must be (Q, D) or (D,), got shape {np.shape(queries)}")
    if q.shape[1] != dim:
        raise ValueError(f"query descriptors are {q.shape[1]}-d, the references are {dim}-d")
    return q


def _chunk_rows(dim: int, itemsize: int = 4, budget: int = _CHUNK_BYTES) -> int:
    return max(1, budget // (max(1, dim) * itemsize))


# float16 -> float32 by bit arithmetic (numpy's own float16 cast is a scalar loop: 217 ms of a
# 100k x 1280 query against 26 ms of arithmetic). A float16's bits, sign-extended to 32 bits and
# shifted left by 13, are the float32 whose exponent is 112 (= 127 - 15) smaller: bits 28-30 (the
# sign extension) are cleared, leaving sign | exponent | mantissa in float32 places. That float32 is
# exactly ``value * 2**-112`` for every finite float16, subnormals and zeros included (they become
# float32 subnormals, exactly). So a dot product with ``query * 2**112`` is the float32 dot product
# with the converted row (powers of two scale exactly), and ``* 2**112`` gives the value itself.
# float16 infinities and NaN are not supported (the index refuses non-finite descriptors).
_HALF_MASK = np.int32(-0x70000001)  # 0x8FFFFFFF: sign and the 28 low bits
_HALF_SCALE = np.float32(2.0 ** 112)
#: float32 bytes of one converted block of the exact float16 kernel: small enough to stay in the
#: core's cache between its conversion and its product (1 MB: 204 rows at 1280-d).
_KERNEL_BYTES = 1 << 20
#: query elements whose magnitude * 2**112 would overflow float32 (then: scaled after conversion).
_QUERY_LIMIT = 2.0 ** 15
#: up to this many rows, one query's product is einsum on the calling thread (:func:`_matvec`).
_EINSUM_ROWS = 8192
#: largest buffer a thread keeps between calls (:func:`_buffer`): a shortlist of 1,600 rows at 1280-d
_KEPT_BUFFER_BYTES = 8 << 20


def _half_bits(src: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``src`` (R, D) float16 (or its int16 view) into ``buf[:R]`` (int32), as float32 bits of
    ``value * 2**-112``; returns that part of ``buf`` viewed as float32."""
    b = buf[: src.shape[0]]
    np.copyto(b, src.view(np.int16), casting="unsafe")  # sign extension
    np.left_shift(b, 13, out=b)
    np.bitwise_and(b, _HALF_MASK, out=b)
    return b.view(np.float32)


def _half_to_float32(src: np.ndarray) -> np.ndarray:
    """(R, D) float16 -> float32, exactly (the values of ``src.astype(np.float32)``), fast."""
    x = _half_bits(src, np.empty(src.shape, dtype=np.int32))
    x *= _HALF_SCALE
    return x


def _gather(d: np.ndarray, rows: np.ndarray, dtype=np.float32) -> np.ndarray:
    """``d[rows]`` as ``dtype`` (``rows`` sorted: a memory map is read in file order)."""
    if d.dtype == np.float16 and np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64)):
        x = _half_to_float32(np.asarray(d[rows]))
        return x if np.dtype(dtype) == np.dtype(np.float32) else x.astype(dtype)
    return np.asarray(d[rows], dtype=dtype)


def exact_scores(descriptors: np.ndarray, queries: np.ndarray, *, chunk_rows: int | None = None) -> np.ndarray:
    """(Q, N) float32 dot products of every query with every reference.

    ``descriptors``: (N, D) float32 or float16, often an ``np.memmap`` (it stays one: only a
    block of rows is read at a time). float32 is multiplied as it is. A float16 .npy memory map,
    for up to :data:`_FEW_QUERIES` queries, is scanned by faiss (:func:`_flat_view`: its fp16 inner
    product over the file's own pages, every score of a query from one search of k = N; the first
    call per map checks a few rows). Other float16 is converted by bit
    arithmetic (:func:`_half_bits`, exact, about 10 times faster than numpy's cast) one block of
    ``chunk_rows`` rows at a time (default: 1 MB of float32 for a few queries, so that a block
    stays in cache between its conversion and its product; 32 MB for many) into a buffer reused
    for every block, on as many threads as there are cores for a few queries (each with its own
    buffer: the extra memory is that buffer per thread, 1 MB). The values are those of
    ``queries @ descriptors.astype(float32).T`` up to float32 rounding.
    """
    d = _check_descriptors(descriptors)
    n, dim = d.shape
    q = _queries(queries, dim)
    nq = q.shape[0]
    if d.dtype == np.float32:
        return np.matmul(q, d.T)
    out = np.empty((nq, n), dtype=np.float32)
    if n == 0 or nq == 0:
        return out
    if d.dtype != np.float16:
        for lo in range(0, n, _chunk_rows(dim)):
            out[:, lo:lo + _chunk_rows(dim)] = q @ np.asarray(d[lo:lo + _chunk_rows(dim)], dtype=np.float32).T
        return out
    few = nq <= _FEW_QUERIES
    flat = _flat_view(d) if few and not chunk_rows else None
    if flat is not None:  # faiss's float16 scan of the file's own pages: no conversion, no copy
        group = max(1, _CHUNK_BYTES // (12 * n))  # queries whose k = N results fit the budget
        for a in range(0, nq, group):
            dist, labels = flat.search(q[a:a + group], n)  # the queries on faiss's threads
            if labels.min() < 0:  # pragma: no cover - faiss leaves none out of a k = N search
                break
            np.put_along_axis(out[a:a + group], labels, dist, axis=1)
        else:
            return out
    rows = max(1, int(chunk_rows)) if chunk_rows else _chunk_rows(dim, budget=_KERNEL_BYTES if few else _CHUNK_BYTES)
    starts = list(range(0, n, rows))
    workers = min(_threads(), len(starts)) if few else 1
    # the block holds value * 2**-112: the queries carry the 2**112 (exact), unless that overflows
    scaled = bool(np.all(np.abs(q) < _QUERY_LIMIT))
    qs = q * _HALF_SCALE if scaled else q
    src = np.asarray(d).view(np.int16)  # a plain view of the memory map (cheaper to slice)

    def work(part: int) -> None:
        buf = _buffer(min(rows, n), dim)
        for lo in starts[part::workers]:
            hi = min(n, lo + rows)
            b = _half_bits(src[lo:hi], buf)
            if not scaled:
                b *= _HALF_SCALE
            if few:  # a few queries: einsum on this thread (BLAS would wake its threads per block)
                for i in range(nq):
                    np.einsum("cd,d->c", b, qs[i], out=out[i, lo:hi])
            else:
                np.matmul(qs, b.T, out=out[:, lo:hi])

    if workers == 1:
        work(0)
    else:
        for _ in _pool().map(work, range(workers)):
            pass
    return out


_views: dict[int, tuple[weakref.ref, Any]] = {}
_views_lock = threading.RLock()  # re-entrant: a map freed while it is held calls _forget_view


def _flat_view(d: np.ndarray) -> Any:
    """A faiss ``IndexScalarQuantizer`` (fp16, inner product) whose codes are the float16 rows of the
    memory-mapped .npy ``d``, in place: faiss scores them with its own float16 arithmetic (about
    twice as fast as :func:`_half_bits` and a product), reading the file's pages; None when that
    cannot be (not a whole read-only float16 .npy memory map, no faiss, a faiss whose format
    differs), and then :func:`exact_scores` converts blocks itself.

    How: a second, copy-on-write map of the file, where faiss's header for such an index (81 bytes
    from faiss 1.15's own serialization of an empty one, with the row count patched in) is written
    over the end of the .npy header, just before the rows; faiss reads it with its zero-copy reader,
    so the codes stay the file's pages. Memory: the header's page (4 KB, copied on write); the rows'
    pages are the page cache's, shared with ``d``'s map (counted once more in the process's
    resident size, not in the machine's memory). Made once per memory map, dropped with it."""
    if not isinstance(d, np.memmap) or d.dtype != np.float16 or not d.flags.c_contiguous:
        return None
    path, offset = getattr(d, "filename", None), getattr(d, "offset", None)
    if not path or not isinstance(offset, int) or d.base is None:
        return None
    key = id(d)
    with _views_lock:
        hit = _views.get(key)
        if hit is not None and hit[0]() is d:
            return None if hit[1] is None else hit[1][0]
    made = _make_flat_view(str(path), int(offset), *d.shape)
    if made is not None and not _flat_view_agrees(made[0], d):
        made = None
    with _views_lock:  # kept (the map with it) while ``d`` lives
        _views[key] = (weakref.ref(d, partial(_forget_view, key)), made)
    return None if made is None else made[0]


def _forget_view(key: int, _ref: Any = None) -> None:
    with _views_lock:
        _views.pop(key, None)


def _make_flat_view(path: str, offset: int, n: int, dim: int) -> tuple[Any, mmap.mmap, np.ndarray] | None:
    try:
        faiss = _faiss()
        header = bytearray(faiss.serialize_index(faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)).tobytes())
        # faiss's layout: "IxSQ", d (int32), ntotal (int64), ..., the codes' byte count (uint64) last
        if (len(header) > offset or header[:4] != b"IxSQ" or header[8:16] != bytes(8)
                or header[-8:] != bytes(8)):
            return None
        header[8:16] = int(n).to_bytes(8, "little", signed=True)
        header[-8:] = int(n * dim * 2).to_bytes(8, "little")
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        if len(mapped) != offset + n * dim * 2:  # not the whole file's rows (e.g. a slice of the map)
            return None
        mapped[offset - len(header):offset] = bytes(header)
        raw = np.frombuffer(mapped, dtype=np.uint8, count=len(header) + n * dim * 2, offset=offset - len(header))
        index = faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(raw), raw.size))
        if (int(index.ntotal) != n or int(index.d) != dim or int(index.code_size) != 2 * dim
                or bool(index.codes.is_owned)):
            return None
        return index, mapped, raw  # the map must live as long as the index
    except (MuseumSearchError, OSError, RuntimeError, AttributeError, ValueError, TypeError):
        return None


def _flat_view_agrees(view: Any, d: np.ndarray) -> bool:
    """Whether faiss reads the rows of ``d`` from the view as they are (a few rows, first and last
    included, decoded by faiss equal to numpy's conversion), and scores by their inner product."""
    n = d.shape[0]
    rows = np.unique(np.linspace(0, n - 1, num=min(n, 7)).astype(np.int64))
    x = np.asarray(d[rows], dtype=np.float32)
    got = np.stack([view.reconstruct(int(r)) for r in rows])
    if not np.array_equal(got, x):
        return False
    dist, labels = view.search(x[:1], 1)
    return bool(np.isclose(dist[0, 0], float(np.dot(x[0].astype(np.float64), x[0])), rtol=1e-4, atol=1e-6))


def exact_prefix(descriptors: np.ndarray, queries: np.ndarray, m: int
                 ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """An exact top set of each query's ranking, without scoring every reference into a result:
    for each query of (Q, R, D) ``queries`` ((Q, D): R = 1; a reference's score is its best over
    the R regions), (its rows, ascending int64; their scores, float32) = every reference whose score
    is above ``T``, the largest over the regions of the region's ``m``-th best score, and none other.
    None when ``descriptors`` have no faiss view (:func:`_flat_view`: not a float16 .npy memory map,
    or no faiss), or for more than :data:`_FEW_QUERIES` query regions (:func:`exact_scores` then
    multiplies blocks, whose float32 rounding differs from faiss's); then the caller scores every
    reference (:func:`exact_scores`).

    How: faiss's scan of the view for each region's top ``m`` (a heap of ``m``, not of N: at 1M
    references the k = N search :func:`exact_scores` does costs 2.8 times the k = 10 one), the union
    of the rows found with their best score found, those above ``T`` kept. Exact: a row outside a
    region's top ``m`` has that region's score at most the region's ``m``-th score, at most ``T``;
    so a row whose best score is above ``T`` was found by the region that gives it, with that score,
    and the rows kept are exactly those above ``T`` (ties at ``T`` are all left out, ties above all
    kept: the prefix is the first rows of :func:`.ranking.order` of the whole row). The scores are
    faiss's, the same float32 as :func:`exact_scores`'s scan of the view gives for these queries
    (bit for bit: the same arithmetic per pair, whatever ``k`` and the other queries). With ``m`` at
    least N, every row (``T`` = -inf)."""
    d = _check_descriptors(descriptors)
    q = np.asarray(queries, dtype=np.float32)
    q3 = q if q.ndim == 3 else np.atleast_2d(q)[:, None, :]
    nq, r, dim = q3.shape
    if dim != d.shape[1]:
        raise ValueError(f"query descriptors are {dim}-d, the references are {d.shape[1]}-d")
    n = d.shape[0]
    if nq * r > _FEW_QUERIES:  # exact_scores multiplies blocks then: its rounding is not faiss's
        return None
    view = _flat_view(d) if n > 0 else None
    if view is None:
        return None
    m = min(max(1, int(m)), n)
    flat = np.ascontiguousarray(q3.reshape(nq * r, dim))
    group = max(1, _CHUNK_BYTES // (12 * m * r)) * r  # whole queries whose results fit the budget
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for a in range(0, nq * r, group):
        dist, labels = view.search(flat[a:a + group], m)  # the queries on faiss's threads
        if labels.min() < 0:  # pragma: no cover - faiss finds m <= N results
            return None
        dist, labels = dist.reshape(-1, r * m), labels.reshape(-1, r * m)
        for i in range(dist.shape[0]):
            s, rows = dist[i], labels[i]
            t = -np.inf if m >= n else s.reshape(r, m).min(axis=1).max()
            keep = s > t
            s, rows = s[keep], rows[keep]
            by = np.lexsort((-s, rows))  # by row, best score first
            s, rows = s[by], rows[by]
            first = np.ones(len(rows), dtype=bool)
            first[1:] = rows[1:] != rows[:-1]
            out.append((rows[first].astype(np.int64), s[first].astype(np.float32, copy=False)))
    return out


_pool_lock = threading.Lock()
_pool_instance: ThreadPoolExecutor | None = None
_local = threading.local()


def _pool() -> ThreadPoolExecutor:
    """The threads of :func:`exact_scores`, started once (starting them per query costs ~1 ms)."""
    global _pool_instance
    with _pool_lock:
        if _pool_instance is None:
            _pool_instance = ThreadPoolExecutor(_threads(), thread_name_prefix="museum-search-scores")
        return _pool_instance


def _buffer(rows: int, dim: int) -> np.ndarray:
    """A (rows, dim) int32 buffer of the calling thread, reused from call to call up to
    :data:`_KEPT_BUFFER_BYTES` (a fresh one's pages cost page faults at every query)."""
    size = rows * dim
    if 4 * size > _KEPT_BUFFER_BYTES:
        return np.empty((rows, dim), dtype=np.int32)
    buf = getattr(_local, "buffer", None)
    if buf is None or buf.size < size:
        buf = _local.buffer = np.empty(size, dtype=np.int32)
    return buf[:size].reshape(rows, dim)


def _matvec(g: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``g @ q`` (float32) on the calling thread: einsum up to :data:`_EINSUM_ROWS` rows, BLAS above.

    OpenBLAS runs a single query's product on all its threads, and on a busy machine waking them
    costs milliseconds. Measured on the shared 2-core machine under load (1280-d, p50 of 30):
    800 rows 0.36 ms einsum against 18.7 ms BLAS, 3,000 rows 1.1 against 21.5 ms; 20,000 rows
    38.6 against 20.6 ms (there the threads pay off)."""
    if g.shape[0] <= _EINSUM_ROWS:
        return np.einsum("cd,d->c", g, q)
    return g @ q


def rows_scores(descriptors: np.ndarray, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(Q, C) float32: the exact dot product of each query with each of its own candidate rows.

    ``rows``: (Q, C) int64, one row of candidates per query; -1 = no candidate (score -inf). Only
    those rows are read, query by query (a query's scores do not depend on the other queries of the
    batch: the same as alone), with :func:`candidate_scores`.
    """
    d = _check_descriptors(descriptors)
    n, dim = d.shape
    q = _queries(queries, dim)
    r = np.asarray(rows)
    if r.ndim == 1 and q.shape[0] == 1:
        r = r[None, :]
    if r.ndim != 2 or r.shape[0] != q.shape[0]:
        raise ValueError(f"rows must be (Q, C) with Q = {q.shape[0]} queries, got shape {r.shape}")
    r = r.astype(np.int64, copy=False)
    out = np.full(r.shape, -np.inf, dtype=np.float32)
    if r.size == 0:
        return out
    if r.max() >= n or r.min() < -1:
        raise IndexError(f"candidate rows must lie in [0, {n}) or be -1")
    for i in range(q.shape[0]):
        valid = r[i] >= 0
        if valid.any():
            out[i, valid] = candidate_scores(d, q[i:i + 1], r[i][valid])[0]
    return out


def candidate_scores(descriptors: np.ndarray, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(Q, C) float32 exact dot products of each of a few ``queries`` (e.g. one photo's regions) with
    the same candidate rows ``rows`` (C,) (valid rows, any order; best sorted and distinct: then
    they are read in file order and not sorted again). The rows are read once, float16 converted by
    :func:`_half_bits` into this thread's buffer, and each query's product is :func:`_matvec`."""
    d = _check_descriptors(descriptors)
    q = _queries(queries, d.shape[1])
    rows = np.asarray(rows, dtype=np.int64)
    increasing = len(rows) < 2 or bool(np.all(rows[1:] > rows[:-1]))
    uniq, inv = (rows, None) if increasing else np.unique(rows, return_inverse=True)
    out = np.empty((q.shape[0], len(uniq)), dtype=np.float32)
    if d.dtype == np.float16 and bool(np.all(np.abs(q) < _QUERY_LIMIT)):
        # a block of rows at a time (it stays in cache from its conversion to its products), as
        # float32 bits of value * 2**-112 (exact); the queries carry the 2**112
        src, dim = np.asarray(d).view(np.int16), d.shape[1]
        step = _chunk_rows(dim, budget=_KERNEL_BYTES)
        buf = _buffer(min(step, len(uniq)), dim)
        qs = q * _HALF_SCALE
        for lo in range(0, len(uniq), step):
            g = _half_bits(src[uniq[lo:lo + step]], buf)
            for i in range(q.shape[0]):
                np.einsum("cd,d->c", g, qs[i], out=out[i, lo:lo + step])
    else:
        g = _gather(d, uniq)
        for i in range(q.shape[0]):
            out[i] = _matvec(g, q[i])
    return out if inv is None else out[:, inv]


# --------------------------------------------------------------------------------------------
# The approximate index
# --------------------------------------------------------------------------------------------


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


def _exact_top(d: np.ndarray, q: np.ndarray, k: int, exclude: np.ndarray,
               beat: Callable[[int], Progress]) -> Generator[Progress, None, np.ndarray]:
    """(Q, k) int64: each query's ``k`` best rows of ``d`` by exact float32 dot product, its row
    ``exclude[i]`` left out (a progress generator: ``beat(i)`` after the i-th block of rows).

    One pass over ``d`` for every query: a block of rows at a time (32 MB of float32), scored by
    :func:`exact_scores` (float16 converted exactly, all the queries at once by BLAS), its best
    merged into each query's kept top (:func:`merge_top`). At 1M x 1280 float16 and 200 queries:
    8.7 s, against 20-22 s for faiss's float16 scan of the file (no BLAS), measured in one run."""
    n, dim = d.shape
    nq = q.shape[0]
    vals = np.full((nq, k), -np.inf, dtype=np.float32)
    idx = np.full((nq, k), -1, dtype=np.int64)
    step = _chunk_rows(dim)
    exclude = np.asarray(exclude, dtype=np.int64)
    for i, lo in enumerate(range(0, n, step)):
        hi = min(n, lo + step)
        s = exact_scores(d[lo:hi], q, chunk_rows=step)  # one block (chunk_rows: never faiss's view)
        mine = np.flatnonzero((exclude >= lo) & (exclude < hi))
        s[mine, exclude[mine] - lo] = -np.inf
        merge_top(vals, idx, s, lo)
        yield beat(i)
    return idx


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


# --------------------------------------------------------------------------------------------
# Nearest neighbours of every reference (ICFRR's gallery ranks)
# --------------------------------------------------------------------------------------------


def _float32_margin(d: np.ndarray) -> float:
    """A bound on how far apart two candidates' float32 scores can be, relative to the final order.

    float32 dot products of D terms are within ``gamma_D |a||b|`` of the real value (any order of
    summation, ``gamma_D = D u / (1 - D u)``, ``u = 2^-24``); the float64 ones rounded to float32
    within half an ulp (``< 6e-8`` for |dot| <= 1) plus float64 rounding. Two candidates compared
    across the two computations: twice that; ``-D = -sqrt(2 - 2 dot)`` in float32 can also make
    dots up to a few ulps apart tie (``4e-6`` covers it). With the largest row norm ``r``:
    ``2 (gamma_D r^2 + 1e-7) + 4e-6`` (1.6e-4 for unit vectors at D = 1280).
    """
    n, dim = d.shape
    r2 = 0.0
    step = _chunk_rows(dim)
    for a in range(0, n, step):
        x = np.asarray(d[a:a + step], dtype=np.float32)
        r2 = max(r2, float(_norms2(x).max(initial=0.0)))
    return float(_margin(r2, dim))


def _norms2(x: np.ndarray) -> np.ndarray:
    """float64 squared norms of the float32 rows ``x``."""
    return np.einsum("ij,ij->i", x, x, dtype=np.float64)


def _margin(r2: float | np.ndarray, dim: int) -> float | np.ndarray:
    """:func:`_float32_margin` for rows of squared norm at most ``r2`` (a number or one per pair)."""
    u = 2.0 ** -24
    gamma = dim * u / (1 - dim * u)
    return 2.0 * (gamma * np.maximum(r2, 1.0) * 1.0001 + 1e-7) + 4e-6


def _exact_top_all(d: np.ndarray, kk: int, start: float) -> Generator[Progress, None, tuple[np.ndarray, np.ndarray]]:
    """Each row's ``kk`` best float32 scores among the other rows (self excluded), sorted by
    descending score: blocks of rows against blocks of rows, each product used for both blocks."""
    n = d.shape[0]
    vals = np.full((n, kk), -np.inf, dtype=np.float32)
    idx = np.full((n, kk), -1, dtype=np.int32)
    bs = _BLOCK_ROWS
    blocks = list(range(0, n, bs))
    nb = len(blocks)
    total_pairs = nb * (nb + 1) // 2
    done = 0
    for ai, a in enumerate(blocks):
        ae = min(n, a + bs)
        xa = np.asarray(d[a:ae], dtype=np.float32)
        for b in blocks[ai:]:
            be = min(n, b + bs)
            xb = xa if b == a else np.asarray(d[b:be], dtype=np.float32)
            s = xa @ xb.T
            if b == a:
                np.fill_diagonal(s, -np.inf)
            merge_top(vals[a:ae], idx[a:ae], s, b)
            if b != a:
                merge_top(vals[b:be], idx[b:be], s.T, a)
            done += 1
            yield Progress(int(n * done / total_pairs * 0.95), n, stage=NEIGHBOURS_STAGE,
                           elapsed=time.perf_counter() - start)
    return vals, idx


def _column_chunks(d: np.ndarray, cols: np.ndarray | None):
    """(first id or ids, float32 rows) of the columns ``cols`` (None: every row), a chunk at a time."""
    n, dim = d.shape
    step = min(_BLOCK_ROWS, _chunk_rows(dim))
    if cols is None:
        for a in range(0, n, step):
            yield a, np.asarray(d[a:a + step], dtype=np.float32)
    else:
        for a in range(0, len(cols), step):
            c = cols[a:a + step]
            yield c, _gather(d, c)


def _mask_self(s: np.ndarray, rows: np.ndarray, ids: int | np.ndarray) -> None:
    """-inf where a column of ``s`` is the row itself (``rows`` and ``ids`` sorted)."""
    if isinstance(ids, (int, np.integer)):
        hit = (rows >= ids) & (rows < ids + s.shape[1])
        s[np.nonzero(hit)[0], rows[hit] - ids] = -np.inf
    else:
        pos = np.searchsorted(ids, rows)
        hit = pos < len(ids)
        hit[hit] = ids[pos[hit]] == rows[hit]
        s[np.nonzero(hit)[0], pos[hit]] = -np.inf


def _top_over(d: np.ndarray, rows: np.ndarray, cols: np.ndarray | None, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``rows``'s (sorted) ``kk`` best float32 scores among ``cols`` (sorted; None: all),
    itself excluded."""
    vals = np.full((len(rows), kk), -np.inf, dtype=np.float32)
    idx = np.full((len(rows), kk), -1, dtype=np.int32)
    few_cols = cols is not None and len(cols) <= _BLOCK_ROWS
    chunks = list(_column_chunks(d, cols)) if few_cols else None
    for ra in range(0, len(rows), _BLOCK_ROWS):
        rr = rows[ra:ra + _BLOCK_ROWS]
        x = _gather(d, rr)
        for ids, c in (chunks if chunks is not None else _column_chunks(d, cols)):  # chunks: few_cols
            s = x @ c.T
            _mask_self(s, rr, ids)
            merge_top(vals[ra:ra + _BLOCK_ROWS], idx[ra:ra + _BLOCK_ROWS], s, ids)
    return vals, idx


def _scan_above(d: np.ndarray, rows: np.ndarray, lows: np.ndarray,
                cols: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, column != row) of ``cols`` (None: all) with a float32 score >= ``lows[row]``:
    (owners (positions in ``rows``), columns), sorted by owner then column. For the rare rows whose
    kept list is full up to the margin (many equal or nearly equal references)."""
    owners, found = [], []
    for ra in range(0, len(rows), _BLOCK_ROWS):
        rr = rows[ra:ra + _BLOCK_ROWS]
        x = _gather(d, rr)
        for ids, c in _column_chunks(d, cols):
            s = x @ c.T
            _mask_self(s, rr, ids)
            o, j = np.nonzero(s >= lows[ra:ra + _BLOCK_ROWS, None])
            owners.append(o + ra)
            found.append(j + ids if isinstance(ids, (int, np.integer)) else ids[j])
    if not owners:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    o = np.concatenate(owners).astype(np.int64)
    c = np.concatenate(found).astype(np.int64)
    srt = np.lexsort((c, o))
    return o[srt], c[srt]


def _rank_exactly(d: np.ndarray, rows: np.ndarray, owners: np.ndarray, cols: np.ndarray, k: int) -> np.ndarray:
    """(len(rows), k) int32: for each row, its candidates ``cols[owners == i]`` ordered exactly as
    ICFRR's gallery ranks order them (-D from float64 dot products rounded to float32, ties by
    lower column: :func:`.ranking.grouped_order`), the first ``k``. ``owners`` sorted; each row has >= ``k``."""
    m = len(rows)
    if m == 0 or k == 0:
        return np.empty((m, k), dtype=np.int32)
    counts = np.bincount(owners, minlength=m)
    if counts.min() < k:
        raise AssertionError("a row has fewer candidates than neighbours asked for")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    dots = np.empty(len(cols), dtype=np.float32)
    dim = d.shape[1]
    per = max(1, _EXACT_ELEMENTS // dim)
    a = 0
    while a < m:  # rows whose candidates fit the float64 budget
        b = int(np.searchsorted(bounds, bounds[a] + per, side="right")) - 1
        b = min(m, max(a + 1, b))
        lo, hi = bounds[a], bounds[b]
        uniq, inv = np.unique(cols[lo:hi], return_inverse=True)
        g = _gather(d, uniq, np.float64)
        x = np.asarray(d[rows[a:b]], dtype=np.float64)
        for i in range(a, b):
            s, e = bounds[i] - lo, bounds[i + 1] - lo
            dots[lo + s:lo + e] = g[inv[s:e]] @ x[i - a]
        a = b
    nd = neg_distance(dots)
    ranked = grouped_order(owners, nd, cols)
    pos = np.arange(len(ranked)) - bounds[owners[ranked]]
    return cols[ranked[pos < k]].astype(np.int32).reshape(m, k)


def _rank_owned(d: np.ndarray, rows: np.ndarray, owners: np.ndarray, cols: np.ndarray, k: int,
                out: np.ndarray) -> None:
    """``out[rows]``: each row's ``k`` nearest among its candidates ``cols[owners == i]`` (pairs sorted
    by owner, the index into ``rows``), ranked exactly (:func:`_rank_exactly`), 1,024 rows at a time."""
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=len(rows)))])
    for a in range(0, len(rows), 1024):
        b = min(len(rows), a + 1024)
        lo, hi = bounds[a], bounds[b]
        out[rows[a:b]] = _rank_exactly(d, rows[a:b], owners[lo:hi] - a, cols[lo:hi], k)


def _lists_from_top(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, cols: np.ndarray | None,
                    vals: np.ndarray, idx: np.ndarray, margin: float, exhaustive: bool | np.ndarray = True) -> None:
    """``out[rows]`` from each row's kept float32 top (``vals``/``idx``, over ``cols``): every
    column within ``margin`` of the row's k-th float32 score is scored in float64 and ranked.
    ``exhaustive`` (one for all rows, or one per row) False (candidates of the k-NN graph method):
    the kept ones only, a row whose kept list is full up to the margin is not scanned again."""
    kk = vals.shape[1]
    available = (d.shape[0] if cols is None else len(cols)) - 1
    lows = vals[:, k - 1] - np.float32(margin)
    within = vals >= lows[:, None]
    full = within[:, -1] & (kk < available) & exhaustive  # the kept list may end before the margin does
    within[full] = False
    owners = np.repeat(np.arange(len(rows)), within.sum(axis=1))
    found = idx[within].astype(np.int64)
    if full.any():
        fo, fc = _scan_above(d, rows[full], lows[full], cols)
        owners = np.concatenate([owners, np.flatnonzero(full)[fo]])
        found = np.concatenate([found, fc])
        srt = np.argsort(owners, kind="stable")
        owners, found = owners[srt], found[srt]
    _rank_owned(d, rows, owners, found, k, out)


def _kept(k: int, available: int) -> int:
    """How many float32 scores to keep per row for ``k`` neighbours (a few more than ``k``)."""
    return min(available, k + max(8, k // 4))


def neighbour_lists(descriptors: np.ndarray, k: int, ann: AnnIndex | None = None, *,
                    knn: KnnParams | None = None) -> Generator[Progress, None, np.ndarray]:
    """(N, min(k, N - 1)) int32: row ``i`` = the ``k`` nearest *other* references of ``i``, best first.

    The order is exactly that of ICFRR's gallery ranks: ``-D = neg_distance(float32(float64
    dot))``, self excluded, ties by lower row, so ``lists[:, :kg]`` are the references at
    ranks 1..kg of the dense gallery ranks (also with duplicate descriptors and float16 input).

    Without ``ann``: exact, O(N^2 D) time but no N x N matrix. A float32 pass keeps each row's
    ``k + extra`` best scores (blocks of rows against blocks of rows, each product serving both
    blocks); every reference within a proven rounding margin of the row's k-th float32 score is a
    candidate (a row whose kept list is full up to the margin is scanned again), and the
    candidates are scored again in float64 and ranked.

    With ``ann`` (an index too large for that; only its size is checked): the candidates come from
    a k-NN graph method, :func:`.knn.knn_candidates` (balanced cells, each row against the members
    of its ``knn.probes`` nearest cells and the rows probing its own, by dense float32 products), and
    are ranked with the same exact arithmetic and tie rule. Wherever a row's kept candidates hold
    its true nearest neighbours its list is the exact one; what the cells miss is the only
    approximation (measured by ``bench/bench_knn.py``). A row whose cells held fewer than ``k``
    others is done exactly against every row.
    Progress stage: "finding each reference's nearest neighbours".
    """
    d = _check_descriptors(descriptors)
    n = d.shape[0]
    k = max(0, min(int(k), n - 1))
    start = time.perf_counter()
    if k == 0:
        yield Progress(n, n, stage=NEIGHBOURS_STAGE)
        return np.empty((n, 0), dtype=np.int32)
    if ann is not None and ann.ntotal != n:
        raise MuseumSearchError(f"the approximate index holds {ann.ntotal:,} references, the descriptors "
                                f"{n:,}: rebuild the index")
    yield Progress(0, n, stage=NEIGHBOURS_STAGE)
    out = np.empty((n, k), dtype=np.int32)
    margin = _float32_margin(d)
    if ann is None:
        vals, idx = yield from _exact_top_all(d, _kept(k, n - 1), start)
        rows = np.arange(n)
        for a in range(0, n, 16_384):
            b = min(n, a + 16_384)
            _lists_from_top(d, k, out, rows[a:b], None, vals[a:b], idx[a:b], margin)
            yield Progress(int(n * 0.95 + 0.05 * b), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
        return out
    yield from _approximate_lists(d, k, out, np.arange(n), margin, knn, start)
    return out


def _approximate_lists(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, margin: float,
                       knn: KnnParams | None, start: float) -> Generator[Progress, None, None]:
    """``out[rows]`` (every row) from :func:`.knn.knn_candidates`, ranked exactly."""
    n = d.shape[0]
    kk = _kept(k, n - 1)
    vals, idx = yield from knn_candidates(d, kk, knn, stage=NEIGHBOURS_STAGE, share=0.9, gather=_gather)
    few = ~np.isfinite(vals[:, k - 1])  # cells holding fewer than k others: done exactly
    ok = np.flatnonzero(~few)
    # rows whose kept candidates are all within the margin of their k-th (many equal references):
    # scanned again against every row as the exact path does, when there are few of them
    full = np.zeros(n, dtype=bool)
    full[ok] = vals[ok, -1] >= vals[ok, k - 1] - np.float32(margin)
    if full.sum() > _BLOCK_ROWS:
        full[:] = False
    for a in range(0, len(ok), 16_384):
        rr = ok[a:a + 16_384]
        _lists_from_top(d, k, out, rr, None, vals[rr], idx[rr], margin, exhaustive=full[rr])
        yield Progress(int(n * (0.9 + 0.1 * (a + len(rr)) / n)), n, stage=NEIGHBOURS_STAGE,
                       elapsed=time.perf_counter() - start)
    whole = np.flatnonzero(few)
    for a in range(0, len(whole), _BLOCK_ROWS):
        rr = whole[a:a + _BLOCK_ROWS]
        v, i = _top_over(d, rr, None, kk)
        _lists_from_top(d, k, out, rr, None, v, i, margin)
        yield Progress(n, n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# Updating the neighbour lists after an update of the index
# --------------------------------------------------------------------------------------------

#: Past this share of rows to compute again, an update computes every list from scratch (the
#: symmetric pass of :func:`neighbour_lists` halves the work of scoring rows one way).
_RECOMPUTE_SHARE = 0.5
#: A kept row with more new candidates than this is computed again instead of merged.
_MERGE_CAP = 256
#: Candidate (row, new reference) pairs held at once while merging (beyond it, the rows holding
#: them are computed again): bounds the memory of an update that adds many similar references.
_PAIRS_MAX = 1 << 23


def _check_map(old_to_new: Any, n_old: int, n: int) -> np.ndarray:
    m = np.asarray(old_to_new)
    if m.ndim != 1 or len(m) != n_old or (m.size and m.dtype.kind not in "iu"):
        raise ValueError(f"old_to_new must hold one int per old reference ({n_old:,}), got shape {m.shape}")
    m = m.astype(np.int64, copy=False)
    kept = m[m >= 0]
    if m.size and (m.min() < -1 or (kept.size and kept.max() >= n)):
        raise ValueError(f"old_to_new must map to rows in [0, {n}) or -1")
    if np.any(np.diff(kept) <= 0):
        raise ValueError("old_to_new must keep the kept references in their order (strictly increasing)")
    return m


def _new_candidates(d: np.ndarray, x: np.ndarray, last: np.ndarray | None, short: bool, new_r2: float,
                    s: np.ndarray, owners: np.ndarray, new_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (owner, new reference) pairs that may enter kept rows' lists.

    ``x``: the kept rows (float32), ``owners`` their positions; ``last``: each one's k-th neighbour
    (its row); ``s``: (rows, new) their float32 scores with the new references ``new_ids`` (of
    squared norms at most ``new_r2``). A new reference is a candidate when its score is within the
    rounding margin of the row's k-th neighbour's (any one below cannot beat it exactly); with
    ``short`` lists (every other old reference, fewer than k) every new reference is one."""
    if short:
        o, j = np.nonzero(np.ones(s.shape, dtype=bool))
    else:
        assert last is not None  # given unless short
        uniq, inv = np.unique(last, return_inverse=True)
        g = _gather(d, uniq)
        thr = np.einsum("ij,ij->i", x, g[inv])
        r2 = np.maximum(np.maximum(_norms2(x), _norms2(g)[inv]), new_r2)
        low = thr - _margin(r2, d.shape[1])
        o, j = np.nonzero(s >= low[:, None])
    return owners[o], new_ids[j]


class _Pairs:
    """Candidate (kept position, new row) pairs, with the kept rows that got too many (``over``)."""

    def __init__(self, kept: int):
        self.counts = np.zeros(kept, dtype=np.int64)
        self.over = np.zeros(kept, dtype=bool)
        self.o: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.held = 0

    def add(self, o: np.ndarray, c: np.ndarray) -> None:
        if not len(o):
            return
        rows, counts = np.unique(o, return_counts=True)
        self.counts[rows] += counts
        self.over[rows] |= self.counts[rows] > _MERGE_CAP
        self.o.append(o)
        self.c.append(c)
        self.held += len(o)
        if self.held > _PAIRS_MAX:  # compute the rows holding the most pairs again instead
            o, c = self.arrays()
            busiest = self.counts > max(1, int(np.quantile(self.counts[self.counts > 0], 0.5)))
            self.over |= busiest if busiest.any() else self.counts > 0
            keep = ~self.over[o]
            self.o, self.c, self.held = [o[keep]], [c[keep]], int(keep.sum())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.o:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        o, c = np.concatenate(self.o), np.concatenate(self.c)
        keep = ~self.over[o]
        return o[keep], c[keep]


def _merge_lists(d: np.ndarray, k: int, out: np.ndarray, rows: np.ndarray, lists: np.ndarray,
                 po: np.ndarray, pc: np.ndarray) -> None:
    """``out[rows[i]]``: the exact top ``k`` of row ``rows[i]``'s list ``lists[i]`` (the top of the
    kept references, renumbered) and its new candidates ``pc[po == i]`` (:func:`_rank_exactly`)."""
    if not len(rows):
        return
    touched = np.unique(po)
    plain = np.ones(len(rows), dtype=bool)
    plain[touched] = False
    if plain.any():
        if lists.shape[1] != k:
            raise AssertionError("a short list without new candidates")
        out[rows[plain]] = lists[plain]
    if not len(touched):
        return
    w = lists.shape[1]
    owners = np.concatenate([np.repeat(np.arange(len(touched)), w), np.searchsorted(touched, po)])
    cols = np.concatenate([lists[touched].ravel(), pc]).astype(np.int64)
    srt = np.argsort(owners, kind="stable")
    owners, cols = owners[srt], cols[srt]
    _rank_owned(d, rows[touched], owners, cols, k, out)


def update_neighbour_lists(old_lists: np.ndarray, old_to_new: np.ndarray, descriptors: np.ndarray, k: int,
                           ann: AnnIndex | None = None, old_ann: AnnIndex | None = None, *,
                           knn: KnnParams | None = None) -> Generator[Progress, None, np.ndarray]:
    """The lists of :func:`neighbour_lists` after an update, recomputing only the rows that can
    change; a progress generator (stage "finding each reference's nearest neighbours"), closing it
    cancels (nothing is changed).

    ``old_lists``: (N_old, K_old) the lists before the update (old rows); ``old_to_new``: each old
    reference's row in ``descriptors``, -1 if removed (kept references keep their order; the other
    rows of ``descriptors`` are the new references, usually appended); ``descriptors``: (N, D) after
    the update; ``k``: neighbours per row (at most N - 1). ``old_lists`` must have been computed by
    :func:`neighbour_lists` (exactly, or with ``old_ann``) with ``K_old >= min(k, N - 1)``, or hold
    every other old reference (``K_old = N_old - 1``); else ValueError.

    * A kept row whose list (its first ``k``) holds no removed reference keeps it, renumbered: it is
      the top of the kept references. Any new reference may enter it: the kept rows are
      scored (float32) against the new ones, those within the proven rounding margin of the row's
      k-th neighbour are candidates, and the list with its candidates is ranked exactly (float64
      dot products, ties by lower row), as :func:`neighbour_lists` ranks its own candidates.
    * A kept row that lost a removed reference, and every new row, is computed again exactly
      against every row (float32 top, then the exact ranking); all of them in one pass over the
      descriptors, which also scores the kept rows against the new ones.
    * When more than half the rows would be computed again, every list is computed from scratch
      (with ``ann``: also when more than :data:`_APPROX_REDO_MAX` would, each costing a pass over
      every row).

    Without ``ann`` the result is identical, bit for bit and in its ties, to
    ``neighbour_lists(descriptors, k)``. It reads the descriptors once (plus one float32 dot per
    kept row for its k-th neighbour's score) instead of scoring N^2 / 2 pairs.

    With ``ann`` (the approximate index after the update, :meth:`AnnIndex.updated` of ``old_ann``;
    only the sizes are checked) the old lists are approximate (:func:`neighbour_lists` with an
    index: the k-NN graph method), and the update is the same pass: the rows computed again and the
    new ones get their exact lists, and a kept row gets every new reference that belongs in its
    list; a kept list keeps what its old one missed. So the result is at least as close to the exact
    lists as the old ones were (not equal to what a rebuild's k-NN graph would give: it misses other
    neighbours). 1,000 new references in a 1M index: one pass over the 1M rows (``bench_knn.py``).
    """
    d = _check_descriptors(descriptors)
    n, dim = d.shape
    old = np.asarray(old_lists)
    m = _check_map(old_to_new, len(old), n)
    if old.ndim != 2:
        raise ValueError(f"old_lists must be (N_old, K_old), got shape {old.shape}")
    if (ann is None) != (old_ann is None):
        raise ValueError("give both the updated approximate index and the old one, or neither")
    n_old, k_old = old.shape
    k = max(0, min(int(k), n - 1))
    start = time.perf_counter()
    if k == 0:
        yield Progress(n, n, stage=NEIGHBOURS_STAGE)
        return np.empty((n, 0), dtype=np.int32)
    short = k_old < k
    if short and k_old < n_old - 1:
        raise ValueError(f"the old lists hold {k_old} neighbours, fewer than the {k} asked for: compute them again")
    if old.size and (old.min() < 0 or old.max() >= n_old):
        raise ValueError("the old lists hold rows outside the old index")
    if ann is not None and ann.ntotal != n:
        raise MuseumSearchError(f"the approximate index holds {ann.ntotal:,} references, the descriptors "
                                f"{n:,}: rebuild the index")
    if old_ann is not None and old_ann.ntotal != n_old:
        raise ValueError(f"the old approximate index holds {old_ann.ntotal:,} references, the old lists {n_old:,}")
    yield Progress(0, n, stage=NEIGHBOURS_STAGE)
    kept_old = np.flatnonzero(m >= 0)
    kept = m[kept_old]
    is_new = np.ones(n, dtype=bool)
    is_new[kept] = False
    new_rows = np.flatnonzero(is_new)
    w = min(k_old, k)
    lists = m[np.asarray(old[kept_old, :w], dtype=np.int64)]  # the kept rows' lists, renumbered (-1: removed)
    redo = (lists < 0).any(axis=1)
    out = np.empty((n, k), dtype=np.int32)
    if len(new_rows) + int(redo.sum()) > _redo_max(n, ann):
        return (yield from neighbour_lists(d, k, ann=ann, knn=knn))
    return (yield from _update_exact(d, k, out, kept, lists, redo, new_rows, short, start, ann, knn))


#: With an approximate index, past this many rows to compute again (each against every row) an
#: update computes every list from scratch with the k-NN graph method instead.
_APPROX_REDO_MAX = 2 * _BLOCK_ROWS


def _redo_max(n: int, ann: AnnIndex | None) -> float:
    """How many rows an update may compute again before computing every list from scratch."""
    return _RECOMPUTE_SHARE * n if ann is None else min(_RECOMPUTE_SHARE * n, _APPROX_REDO_MAX)


def _update_exact(d, k, out, kept, lists, redo, new_rows, short, start, ann=None, knn=None):
    """:func:`update_neighbour_lists`: one fused pass (the new rows and the rows computed again
    against every row, the kept rows against the new ones)."""
    n, dim = d.shape
    keep_rows, keep_lists = kept[~redo], lists[~redo]
    keep_at = np.full(n, -1, dtype=np.int64)
    keep_at[keep_rows] = np.arange(len(keep_rows))
    redo_rows = np.union1d(kept[redo], new_rows)  # sorted
    kk = _kept(k, n - 1)
    vals = np.full((len(redo_rows), kk), -np.inf, dtype=np.float32)
    idx = np.full((len(redo_rows), kk), -1, dtype=np.int32)
    new_r2 = float(_norms2(_gather(d, new_rows)).max(initial=0.0)) if len(new_rows) else 0.0
    pairs = _Pairs(len(keep_rows))
    r2 = 0.0
    bs = _BLOCK_ROWS
    blocks = list(range(0, len(redo_rows), bs))
    steps = max(1, len(blocks) * -(-n // min(bs, _chunk_rows(dim))))
    step = 0
    for bi, a in enumerate(blocks):
        rr = redo_rows[a:a + bs]
        x = _gather(d, rr)
        new_pos = np.flatnonzero(np.isin(rr, new_rows))
        for c0, c in _column_chunks(d, None):
            s = x @ c.T  # (block rows, chunk rows)
            if bi == 0:
                r2 = max(r2, float(_norms2(c).max(initial=0.0)))
            if len(new_pos):  # the kept rows of this chunk against the new rows of this block
                kp = keep_at[c0:c0 + len(c)]
                sel = np.flatnonzero(kp >= 0)
                if len(sel):
                    last = None if short else keep_lists[kp[sel], k - 1]
                    o, j = _new_candidates(d, c[sel], last, short, new_r2, s[new_pos][:, sel].T, kp[sel],
                                           rr[new_pos])
                    pairs.add(o, j)
            _mask_self(s, rr, c0)
            merge_top(vals[a:a + bs], idx[a:a + bs], s, c0)
            step += 1
            yield Progress(int(0.9 * n * step / steps), n, stage=NEIGHBOURS_STAGE,
                           elapsed=time.perf_counter() - start)
    margin = float(_margin(r2, dim))
    for a in range(0, len(redo_rows), 16_384):
        b = min(len(redo_rows), a + 16_384)
        _lists_from_top(d, k, out, redo_rows[a:b], None, vals[a:b], idx[a:b], margin)
    yield Progress(int(0.92 * n), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    over = np.flatnonzero(pairs.over)
    if len(over) > _redo_max(n, ann):  # pragma: no cover - many new references like many kept ones
        return (yield from neighbour_lists(d, k, ann=ann, knn=knn))
    if len(over):  # kept rows with too many new candidates: computed again
        if not len(blocks):  # pragma: no cover - there are new rows, so there was a pass
            margin = _float32_margin(d)
        rows = keep_rows[over]
        for a in range(0, len(rows), bs):
            v, i = _top_over(d, rows[a:a + bs], None, kk)
            _lists_from_top(d, k, out, rows[a:a + bs], None, v, i, margin)
            yield Progress(int(0.92 * n), n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    po, pc = pairs.arrays()
    ok = ~pairs.over
    pos = np.flatnonzero(ok)
    remap = np.full(len(keep_rows), -1, dtype=np.int64)
    remap[pos] = np.arange(len(pos))
    _merge_lists(d, k, out, keep_rows[pos], keep_lists[pos], remap[po], pc)
    yield Progress(n, n, stage=NEIGHBOURS_STAGE, elapsed=time.perf_counter() - start)
    return out
