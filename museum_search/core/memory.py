"""Bounds on what a long session keeps in memory (``bench/bench_session.py`` measures them).

* :func:`compact_reports`: an evaluation run keeps, for every query, its whole ranking of the
  collection with the score of each reference (8 bytes per reference and query: 40 MB for a run
  of 500 queries on 10,000 references). The views only show the top of a ranking, so the runs
  of a session but the last :data:`RUNS_KEPT_WHOLE` keep the first :data:`RANKS_KEPT` ranks and
  scores. Their metrics, verdict evidence, relevance flags (the rank of the first correct
  reference), precision–recall curves and exports (JSON: top 5; CSV: top 1) are unchanged.
* :func:`trim_heap`: the C heap (glibc ``malloc``) keeps the memory a finished job freed, spread
  over one arena per thread that allocated it, and the process's resident size stays at its peak
  (about 150 MB after an evaluation of the sample queries). ``malloc_trim`` gives the free pages
  back to the system; :func:`trim_heap_soon` does it on a helper thread (it takes up to ~100 ms).

Nothing here changes a result; each bound is a named constant.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Evaluation runs that keep every query's whole ranking (the newest ones).
RUNS_KEPT_WHOLE = 3
#: Ranks (and their scores) the older runs keep for each query (the views show at most 200).
RANKS_KEPT = 200


def compact_report(report: Any, keep_ranks: int | None = None) -> int:
    """Keep the first ``keep_ranks`` (default :data:`RANKS_KEPT`) entries of each record's
    ``ranking`` and ``scores`` (an :class:`~museum_search.core.evaluation._runner.EvalReport`);
    the bytes freed. Idempotent."""
    keep_ranks = RANKS_KEPT if keep_ranks is None else keep_ranks
    if keep_ranks < 1:
        raise ValueError("keep at least one rank")
    freed = 0
    for rec in report.records:
        for name in ("ranking", "scores"):
            a = getattr(rec, name)
            if len(a) > keep_ranks:
                setattr(rec, name, np.array(a[:keep_ranks], copy=True))
                freed += a.nbytes - getattr(rec, name).nbytes
    return freed


def compact_reports(reports: Sequence[Any], keep_whole: int | None = None, keep_ranks: int | None = None) -> int:
    """:func:`compact_report` on every report of ``reports`` (oldest first) but the last
    ``keep_whole`` (default :data:`RUNS_KEPT_WHOLE`); the bytes freed."""
    keep_whole = RUNS_KEPT_WHOLE if keep_whole is None else max(0, keep_whole)
    old = list(reports)[: max(0, len(reports) - keep_whole)]
    freed = sum(compact_report(r, keep_ranks) for r in old)
    if freed:
        log.debug("evaluation runs compacted: %.1f MB freed", freed / 2**20)
    return freed


# ---- the C heap ---------------------------------------------------------------------------------

_libc: Any = None
_trim_lock = threading.Lock()


def _malloc_trim():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = lib if hasattr(lib, "malloc_trim") else False  # glibc (not musl)
            except OSError:
                pass
    return _libc.malloc_trim if _libc else None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc); False where there is no
    ``malloc_trim`` (other C libraries and systems return memory their own way)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    with _trim_lock:
        trim(0)
    return True


def trim_heap_soon() -> None:
    """:func:`trim_heap` on a helper thread, unless one is under way (the caller never waits)."""
    if _malloc_trim() is None or _trim_lock.locked():
        return
    threading.Thread(target=trim_heap, name="museum-search-trim", daemon=True).start()


__all__ = ["RANKS_KEPT", "RUNS_KEPT_WHOLE", "compact_report", "compact_reports", "trim_heap", "trim_heap_soon"]
