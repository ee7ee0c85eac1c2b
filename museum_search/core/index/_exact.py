"""Exact scores of (memory-mapped, float16) descriptors, and faiss, imported on first use.

Three ways to score a query against N references exactly (the approximate index,
:mod:`._approximate`, re-scores its shortlist with them):

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

Also here: :func:`_exact_top` (each query's exact top ``k``, one pass over the descriptors: the
truth the approximate index is tuned against), the argument checks and the row gathering shared by
the index's search modules, and :func:`_faiss` (faiss imported once, ``pip install faiss-cpu``;
the exact functions work without it).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from museum_search.core.errors import MuseumSearchError
from museum_search.core.progress import Progress
from museum_search.core.ranking import merge_top

__all__ = ["candidate_scores", "exact_prefix", "exact_scores", "faiss_available", "rows_scores"]

# float32 bytes converted (or gathered) at once: bounds the temporary memory of every loop here.
_CHUNK_BYTES = 32 << 20
# up to this many queries (a photo's 6 regions, a few photos), exact_scores scores each on its own
# (faiss's scan, or einsum per block: no BLAS threads); above, a matrix product per block. Measured
# on the loaded 2-core machine, 5 queries at 100k x 1280: 1.4 s by faiss's scan, 3.3 s by products.
_FEW_QUERIES = 8


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


def _check_map(old_to_new: Any, n_old: int, n: int) -> np.ndarray:
    """``old_to_new`` of an update (each old reference's new row, -1: removed; the kept ones in their
    order) as int64, checked against ``n_old`` old and ``n`` new references; else ValueError."""
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
