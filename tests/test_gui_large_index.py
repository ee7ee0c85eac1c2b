"""A large index in the GUI (issue 12, part 4): the Collection tab opens it without walking its items
(rows are read from the SQLite catalogue when painted), filtering is the catalogue's full-text query,
and the index summary and the search settings say what the index holds (neighbour lists, ANN)."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt

from museum_search.core.index._catalogue import Item, ItemStore
from museum_search.core.index._store import Index, LabellingSpec
from museum_search.core.inference._backbones import imported_meta
from museum_search.gui import workers
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.thumbnails import ROW_ROLE, ThumbnailCache

pytestmark = pytest.mark.gui

ARTISTS = ["Monet", "Degas", "Renoir", "Cézanne", "Morisot", "Pissarro", "Sisley", "Cassatt"]
DIM = 8  # small descriptors: the tests are about the items, not the search
#: rows read from the catalogue to open and paint the tab: the visible thumbnails and a few more,
#: whatever the size of the index
MAX_ROWS_READ = 2_000


def _items(n: int) -> list[Item]:
    """Reference ``i``: 5 views per object, artist ``ARTISTS[i % 8]``, title "Work {i % 997} of the
    series {i % 13}" (so what a filter must find is known from ``i`` alone)."""
    return [Item(f"photos/{i // 1000:04d}/ref{i:07d}.jpg", 0, 0.0, f"obj{i // 5:06d}",
                 {"title": f"Work {i % 997} of the series {i % 13}", "artist": ARTISTS[i % len(ARTISTS)]})
            for i in range(n)]


def _descriptors(n: int, seed: int = 0) -> np.ndarray:
    d = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def _make_index(folder: Path, n: int) -> tuple[Path, float]:
    root = folder / "photos-root"
    root.mkdir(parents=True)
    index = Index(root, imported_meta(DIM), _items(n), _descriptors(n), LabellingSpec("imported"))
    t0 = time.perf_counter()
    index.save(folder / "index")
    return folder / "index", time.perf_counter() - t0


@pytest.fixture(scope="module")
def large_indexes(tmp_path_factory):
    """Saved indexes by size, made once per module (saving 200,000 references takes a few seconds)."""
    made: dict[int, Path] = {}

    def get(n: int) -> Path:
        if n not in made:
            made[n], seconds = _make_index(tmp_path_factory.mktemp(f"large-{n}"), n)
            print(f"saved an index of {n:,} references in {seconds:.1f} s")
        return made[n]

    return get


@pytest.fixture
def state(tmp_path):
    return AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))


@pytest.fixture
def collection_tab(qtbot, state):
    from museum_search.gui.collection_tab import CollectionTab

    tab = CollectionTab(state)
    qtbot.addWidget(tab)
    tab.resize(1280, 800)
    tab.show()
    qtbot.waitExposed(tab)
    yield tab
    tab.shutdown()
    ThumbnailCache.instance().cancel_pending()
    assert ThumbnailCache.instance().wait(30_000)
    assert workers.wait_all(60_000)


class _Reads:
    """Counts the items read from any :class:`ItemStore` (one by one, in batches, or all)."""

    def __init__(self, monkeypatch):
        self.rows = 0
        get, rows, paths = ItemStore.__getitem__, ItemStore.rows, ItemStore.paths
        reads = self

        def counted_get(store, i):
            if not isinstance(i, slice):
                reads.rows += 1
            return get(store, i)

        def counted_rows(store, which):
            which = list(which)
            reads.rows += len(which)
            return rows(store, which)

        def counted_paths(store):
            reads.rows += len(store)
            return paths(store)

        monkeypatch.setattr(ItemStore, "__getitem__", counted_get)
        monkeypatch.setattr(ItemStore, "rows", counted_rows)
        monkeypatch.setattr(ItemStore, "paths", counted_paths)


def _view_rows(browser) -> np.ndarray:
    """The index rows the browser's view shows, through the view's model (what is painted)."""
    model = browser.view.model()
    return np.array([model.index(r, 0).data(ROW_ROLE) for r in range(model.rowCount())], dtype=np.int64)


def _paint(qtbot, browser) -> None:
    browser.view.viewport().repaint()
    qtbot.wait(20)


@pytest.mark.parametrize("n", [20_000, pytest.param(200_000, marks=pytest.mark.slow)])
def test_large_index_opens_and_filters_without_walking_its_items(qtbot, collection_tab, large_indexes, n,
                                                                 monkeypatch):
    folder = large_indexes(n)
    index = Index.load(folder)
    store = index.items
    assert isinstance(store, ItemStore) and index.catalogue() is store
    cache = ThumbnailCache.instance()
    asked: set[str] = set()
    real_get = cache.get

    def spy(path, size):
        asked.add(str(path))
        return real_get(path, size)

    monkeypatch.setattr(cache, "get", spy)
    reads = _Reads(monkeypatch)
    browser = collection_tab.browser

    t0 = time.perf_counter()
    collection_tab.state.set_index(index)
    _paint(qtbot, browser)
    opened = time.perf_counter() - t0
    qtbot.waitUntil(lambda: len(asked) > 0, timeout=10_000)
    # every reference is in the view, but only what is on screen was read and asked for
    assert browser.visible_count() == n
    assert browser.count_label.text() == f"{n:,} of {n:,} references"
    assert 0 < reads.rows <= MAX_ROWS_READ, reads.rows
    assert 0 < len(asked) < 200
    first = browser.view.model().index(0, 0)
    assert first.data(ROW_ROLE) == 0 and first.data(Qt.ItemDataRole.DisplayRole).startswith("obj000000\nWork 0 ")
    assert f"{n:,} references" in collection_tab.detected_label.text()

    # filtering: the catalogue's full-text query, from the filter box (typed, applied after the pause)
    i = np.arange(n)
    title_numbers = np.array([str(v) for v in range(997)])
    series_numbers = np.array([str(v) for v in range(13)])
    expected = {
        "artist:monet": i % 8 == 0,
        "cezanne": i % 8 == 3,  # accents do not matter
        "work 12": np.char.startswith(title_numbers[i % 997], "12") | np.char.startswith(series_numbers[i % 13], "12"),
        "Series 1 artist:DEGAS": (i % 8 == 1) & (np.char.startswith(title_numbers[i % 997], "1")
                                               | np.char.startswith(series_numbers[i % 13], "1")),
        "obj000123": i // 5 == 123,
        "onet": np.zeros(n, bool),  # the middle of a word finds nothing
    }
    reads.rows = 0
    times = {}
    for k, (text, mask) in enumerate(expected.items()):
        t0 = time.perf_counter()
        if k == 0:
            qtbot.keyClicks(browser.filter_edit, text)
            qtbot.waitUntil(lambda text=text: browser.proxy.text == text, timeout=10_000)
        else:
            browser.set_filter(text)
        _paint(qtbot, browser)
        times[text] = time.perf_counter() - t0
        want = np.flatnonzero(mask)
        np.testing.assert_array_equal(browser.proxy.source_rows(), want)
        np.testing.assert_array_equal(store.match(text), want)
        assert browser.visible_count() == len(want)
        assert browser.count_label.text() == f"{len(want):,} of {n:,} references"
        if len(want) <= 50:  # the view shows those rows, in index order
            np.testing.assert_array_equal(_view_rows(browser), want)
        elif len(want):
            model = browser.view.model()
            assert [model.index(r, 0).data(ROW_ROLE) for r in (0, 1, len(want) - 1)] == \
                [want[0], want[1], want[-1]]
    assert reads.rows <= MAX_ROWS_READ * len(expected), reads.rows  # only what was painted
    browser.filter_edit.clear()
    qtbot.waitUntil(lambda: browser.proxy.text == "", timeout=10_000)
    assert browser.visible_count() == n and browser.proxy.source_rows() is None
    print(f"{n:,} references: opened and painted in {opened * 1000:.0f} ms; filters (ms): "
          + ", ".join(f"{t!r} {s * 1000:.0f}" for t, s in times.items()))


def test_thumbnail_that_arrives_repaints_its_row_through_the_filter(qtbot, tmp_path):
    """The model remembers the rows whose thumbnails it asked for (no path → row table of the whole
    index), and the filter passes the repaint on to the view's row."""
    from museum_search.gui.widgets.thumbnails import (
        THUMB_ROLE,
        CollectionFilterModel,
        CollectionModel,
    )

    n = 500
    index = Index(tmp_path, imported_meta(DIM), _items(n), _descriptors(n), LabellingSpec("imported"))
    cache = ThumbnailCache(threads=1)
    model = CollectionModel(index, thumb_size=48, cache=cache)
    proxy = CollectionFilterModel()
    proxy.setSourceModel(model)
    proxy.set_text("artist:degas")
    want = np.flatnonzero(np.arange(n) % 8 == 1)
    np.testing.assert_array_equal(proxy.source_rows(), want)
    changed: list[int] = []
    proxy.dataChanged.connect(lambda a, b, _roles=(): changed.extend(range(a.row(), b.row() + 1)))
    assert proxy.index(3, 0).data(THUMB_ROLE) is None  # asked for: the file is missing, a failure comes
    qtbot.waitUntil(lambda: changed == [3], timeout=10_000)
    assert cache.failure(str(tmp_path / index.items[int(want[3])].path), 48) is not None
    assert proxy.index(3, 0).data(THUMB_ROLE).cacheKey() == cache.broken(48).cacheKey()
    # a row not shown by the filter is not passed on
    assert model.index(0, 0).data(THUMB_ROLE) is None
    qtbot.waitUntil(lambda: cache.failure(str(tmp_path / index.items[0].path), 48) is not None, timeout=10_000)
    qtbot.wait(20)
    assert changed == [3]
    assert cache.wait(10_000)


def _ann_index(tmp_path: Path, n: int = 3000) -> Index:
    """A saved index with neighbour lists and an approximate-search index (built by core)."""
    from museum_search.core.jobs import _indexing as index_mod
    from museum_search.core.progress import drive as run

    root = tmp_path / "photos-root"
    root.mkdir(exist_ok=True)
    index = Index(root, imported_meta(DIM), _items(n), _descriptors(n, seed=1), LabellingSpec("imported"))
    run(index_mod.derive(index, ann="yes", neighbours=8))
    index.save(tmp_path / "ann-index")
    return Index.load(tmp_path / "ann-index")


def test_collection_summary_says_what_the_index_stores(qtbot, collection_tab, tmp_path):
    from museum_search.core.index._modes import AUTO_MIN_REFERENCES

    plain = Index(tmp_path, imported_meta(DIM), _items(100), _descriptors(100), LabellingSpec("imported"))
    collection_tab.state.set_index(plain)
    text = collection_tab.detected_label.text()
    assert text.startswith("Index: 100 references of 20 instances")
    assert "no neighbour lists stored" in text and "no approximate-search index (exact search)" in text

    index = _ann_index(tmp_path)
    assert index.neighbours_stored == 8 and index.ann is not None
    collection_tab.state.set_index(index)
    text = collection_tab.detected_label.text()
    assert "3,000 references of 600 instances" in text
    assert "8 nearest neighbours stored per reference" in text
    assert len(index) < AUTO_MIN_REFERENCES and "an approximate-search index (Automatic search is exact" in text
    assert index.ann.summary() in collection_tab.detected_label.toolTip()


def test_search_mode_choice_follows_the_index(qtbot, state, tmp_path):
    """Approximate is offered only for an index with an approximate-search index; the choice is the
    pipeline's ``QuerySettings.search`` in the Search and the Evaluation tabs."""
    from museum_search.core.answer._pipeline import QueryPipeline
    from museum_search.core.index._modes import resolve_mode
    from museum_search.gui.evaluation_tab import EvaluationTab
    from museum_search.gui.search_tab import SearchTab
    from museum_search.gui.widgets.search_mode import SearchModeCombo

    search = SearchTab(state)
    evaluation = EvaluationTab(state)
    for w in (search, evaluation):
        qtbot.addWidget(w)
    try:
        plain = Index(tmp_path, imported_meta(DIM), _items(100), _descriptors(100), LabellingSpec("imported"))
        with_ann = _ann_index(tmp_path)
        for tab in (search, evaluation):
            combo = tab.findChild(SearchModeCombo, "searchMode")
            assert [combo.itemText(i) for i in range(combo.count())] == \
                ["Automatic", "Exact", "Approximate (large collections)"]
            state.set_index(plain)
            assert tab.query_settings().search == "auto"
            assert not combo.is_available("ann") and combo.is_available("exact")
            ann_row = combo.findData("ann")
            assert "has no approximate-search index" in combo.itemData(ann_row, Qt.ItemDataRole.ToolTipRole)
            assert not combo.model().item(ann_row).isEnabled()
            combo.setCurrentIndex(combo.findData("exact"))
            assert tab.query_settings().search == "exact"

            state.set_index(with_ann)
            assert combo.is_available("ann")
            assert with_ann.ann.summary() in combo.itemData(ann_row, Qt.ItemDataRole.ToolTipRole)
            # Automatic says what the build measured, and what it chose from it (core's resolve_mode)
            auto_tip = combo.itemData(combo.findData("auto"), Qt.ItemDataRole.ToolTipRole)
            assert with_ann.ann.params.tuning is not None and with_ann.ann.params.tuning.summary() in auto_tip
            chosen = {"ann": "approximate", "exact": "exact"}[resolve_mode("auto", len(with_ann), with_ann.ann)]
            assert f"For this index: {chosen}." in auto_tip
            combo.setCurrentIndex(ann_row)
            settings = tab.query_settings()
            assert settings.search == "ann"
            assert QueryPipeline(with_ann, settings).search_mode == "ann"
            # an index without one: back to Automatic (the choice comes back with an index that has one)
            state.set_index(plain)
            assert combo.mode() == "auto" and tab.query_settings().search == "auto"
            state.set_index(with_ann)
            assert combo.mode() == "ann"
        assert state.settings.value("search/mode") == "ann"  # the Search tab remembers it
    finally:
        search.shutdown()
        assert workers.wait_all(60_000)


def test_search_tab_answers_the_same_with_approximate_search(qtbot, state, sample_index):
    """On the sample (a shortlist longer than the collection), approximate search gives the exact
    answer; the status line says how it was searched."""
    from museum_search.core.index._approximate import AnnIndex
    from museum_search.core.progress import drive
    from museum_search.gui.search_tab import SearchTab
    from museum_search.gui.widgets.search_mode import SearchModeCombo

    index = copy.copy(sample_index)  # the session's index is shared: its ANN index is this test's own
    index.ann = drive(AnnIndex.build(index.descriptors))
    tab = SearchTab(state)
    qtbot.addWidget(tab)
    tab.resize(1200, 800)
    try:
        state.set_index(index)
        query = Path(__file__).resolve().parents[1] / "resources" / "sample" / "queries" / "q01.jpg"
        answers = {}
        for mode in ("exact", "ann"):
            tab.findChild(SearchModeCombo, "searchMode").set_mode(mode)
            if mode == "exact":
                assert tab.search_file(query)
            qtbot.waitUntil(tab.is_up_to_date, timeout=120_000)
            answers[mode] = [(r.row, r.score) for r in tab.results()]
            assert ("approximate search" in tab.status.text()) == (mode == "ann")
        # the same photos in the same order; the scores the same to float32 rounding (faiss sums the
        # dot products in another order than numpy: 0.798905 was 0.79891 one way, 0.7989 the other)
        assert answers["exact"] and [r for r, _ in answers["ann"]] == [r for r, _ in answers["exact"]]
        assert [s for _, s in answers["ann"]] == pytest.approx([s for _, s in answers["exact"]], abs=1e-5)
    finally:
        tab.shutdown()
        qtbot.waitUntil(lambda: not tab.is_busy(), timeout=120_000)
        assert workers.wait_all(60_000)
