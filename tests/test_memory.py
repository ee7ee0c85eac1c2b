"""What a long session keeps is bounded (issue 13, item 6; ``bench/bench_session.py`` measures it):
older evaluation runs keep only the top of their rankings, the C heap is trimmed, the thumbnail
cache stays within its byte budget, and signals emitted from Python do not wear out ``True``
(PySide6 6.12.0 on CPython < 3.12). The views' part is in ``test_gui_memory.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from museum_search.core import memory
from museum_search.core.evaluation._reports import report_dict, write_csv
from museum_search.core.evaluation._runner import EvalReport, QueryRecord
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
N_REFS = 300  # references of the synthetic index (rankings longer than the ranks kept)


@pytest.fixture(scope="module")
def index() -> Index:
    """N_REFS references of 100 objects (files not needed: the reports only name them)."""
    meta = BackboneMeta(name="dummy", weights_id="none", head="gem", input_policy="longest_side", size=64,
                        scales=(1.0,), gem_p=3.0, dim=4, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    items = [Item(f"o{i % 100:03d}-{i // 100}.jpg", 1, 0.0, f"o{i % 100:03d}") for i in range(N_REFS)]
    return Index("/nowhere", meta, items, np.eye(N_REFS, 4, dtype=np.float32))


def _report(index: Index, n_queries: int = 6, seed: int = 0) -> EvalReport:
    rng = np.random.default_rng(seed)
    records = []
    for q in range(n_queries):
        ranking = rng.permutation(len(index)).astype(np.int32)
        inst = index.items[int(ranking[3])].instance
        relevance = index.labels[ranking] == inst
        metrics = {"mp@1": 0.0, "p@5": 0.2, "map": 0.3, "amnro": 0.1, "anmrr": 0.2, "mrr": 0.25}
        scores = np.sort(rng.random(len(index)).astype(np.float32))[::-1].copy()
        records.append(QueryRecord(q, f"/q/{q}.jpg", [inst], metrics, ranking, scores, relevance,
                                   int(relevance.sum()), top_cosine=0.8, top_inliers=None))
    return EvalReport({"mp@1": 0.0}, records, [], "index", "queries", "", {})


def test_compact_reports_keeps_the_newest_runs_whole_and_every_figure(index, tmp_path):
    reports = [_report(index, seed=s) for s in range(5)]
    before = [report_dict(r, index, ci=False) for r in reports]
    csv_before = []
    for i, r in enumerate(reports):
        write_csv(r, index, tmp_path / f"{i}.csv")
        csv_before.append((tmp_path / f"{i}.csv").read_text())
    relevance = [[rec.relevance.copy() for rec in r.records] for r in reports]
    rankings = [[rec.ranking.copy() for rec in r.records] for r in reports]

    freed = memory.compact_reports(reports, keep_whole=2, keep_ranks=50)
    assert freed == 3 * 6 * (N_REFS - 50) * (4 + 4)  # int32 ranks and float32 scores of 3 runs
    for i, r in enumerate(reports):
        whole = i >= 3
        for rec, rel, ranking in zip(r.records, relevance[i], rankings[i]):
            assert len(rec.ranking) == len(rec.scores) == (N_REFS if whole else 50)
            assert np.array_equal(rec.ranking, ranking[: len(rec.ranking)])
            assert np.array_equal(rec.relevance, rel)  # whole: the rank of the first correct reference
        assert report_dict(r, index, ci=False) == before[i]  # JSON export (top 5) unchanged
        write_csv(r, index, tmp_path / f"{i}.csv")
        assert (tmp_path / f"{i}.csv").read_text() == csv_before[i]
    assert memory.compact_reports(reports, keep_whole=2, keep_ranks=50) == 0  # idempotent
    with pytest.raises(ValueError):
        memory.compact_report(reports[0], keep_ranks=0)


def test_trim_heap_runs_where_the_c_library_has_it():
    trimmed = memory.trim_heap()
    assert trimmed == (sys.platform.startswith("linux") and memory._malloc_trim() is not None)
    memory.trim_heap_soon()  # never raises, never waits


@pytest.mark.gui
def test_bool_references_survive_many_emits(qtbot):
    from PySide6.QtCore import QObject, Signal

    from museum_search.gui import compat

    class Emitter(QObject):
        ping = Signal(object)

    e = Emitter()
    got = []
    e.ping.connect(got.append)
    for i in range(20_000):  # without the guard this aborts the process on PySide6 6.12.0 / CPython 3.11
        e.ping.emit(i)
    assert len(got) == 20_000
    if sys.version_info < (3, 12) and compat.emit_loses_true_reference():
        assert compat.guard_bool_refcounts() and sys.getrefcount(True) > compat.RESERVE // 2


def test_none_references_survive_many_static_calls(qtbot):
    """PySide6 6.12.0 takes a reference from None on each static void call (processEvents, msleep,
    qWait): 20,000 of them, more than None has references, must not end the process."""
    from PySide6.QtCore import QCoreApplication, QThread

    from museum_search.gui import compat

    for _ in range(10_000):
        QCoreApplication.processEvents()
        QThread.msleep(0)
    assert sys.getrefcount(None) > 0
    if sys.version_info < (3, 12) and compat.static_call_loses_none_reference():
        assert compat.guard_bool_refcounts() and sys.getrefcount(None) > compat.RESERVE // 2


@pytest.mark.gui
def test_thumbnail_cache_stays_within_its_byte_budget(qtbot):
    from museum_search.gui.widgets.thumbnails import ThumbnailCache

    paths = [str(p) for p in sorted((SAMPLE / "collection").glob("*.jpg"))[:30]]
    cache = ThumbnailCache(max_bytes=1 << 40, threads=2)
    loaded: list[str] = []
    used: list[int] = []
    cache.ready.connect(lambda path, size: (loaded.append(path), used.append(cache.used_bytes)))

    def load(p: str) -> None:
        cache.get(p, 48)
        qtbot.waitUntil(lambda: p in loaded, timeout=60_000)

    load(paths[0])
    one = cache.used_bytes  # one thumbnail's bytes (48 px on the longest side)
    cache.set_max_bytes(8 * one)
    used.clear()
    for p in paths[1:]:  # a user scrolling through a collection far larger than the budget
        load(p)
    assert max(used) <= cache.max_bytes
    assert 4 <= len(cache) <= 16 and cache.used_bytes <= 8 * one
    assert cache.peek(paths[-1], 48) is not None and cache.peek(paths[0], 48) is None  # least recent out
    cache.set_max_bytes(3 * one)
    assert 1 <= len(cache) <= 6 and cache.used_bytes <= 3 * one
    assert cache.wait(10_000)
