"""The Search tab, driven offscreen: file queries, controls, re-ranking, a replayed camera, verdicts."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QSettings, Qt

from museum_search.core.capture import FileSequenceCamera, OpenCVCamera, list_cameras
from museum_search.gui import workers
from museum_search.gui.search_tab import (
    NO_INDEX,
    ResultDialog,
    SearchTab,
    qimage_to_rgb,
)
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.thumbnails import ThumbnailCache, numpy_to_qimage

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
TIMEOUT = 120_000  # ms; describing a query takes about a second, more on a loaded machine


def _read_truth(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [(r["query"], (r.get("instance") or "").strip()) for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def data(request, tmp_path_factory) -> SimpleNamespace:
    """An index, an easy in-collection query (path, instance) and an out-of-collection query.

    From the bundled sample collection.
    """
    index = request.getfixturevalue("sample_index")
    rows = _read_truth(SAMPLE / "queries" / "ground_truth.csv")
    inside = [(SAMPLE / "queries" / q, inst) for q, inst in rows if inst]
    outside = [SAMPLE / "queries" / q for q, inst in rows if not inst]
    return SimpleNamespace(index=index, easy=inside[0], inside=inside, outside=outside[0])


@pytest.fixture
def make_tab(qtbot, tmp_path):
    """Builds SearchTabs on a throw-away settings file; stops them and their workers at the end."""
    tabs: list[SearchTab] = []

    def make(index=None, camera_factory=None, **settings) -> SearchTab:
        state = AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))
        for k, v in settings.items():
            setattr(state.settings, k, v)
        tab = SearchTab(state, camera_factory=camera_factory)
        qtbot.addWidget(tab)
        tab.resize(1200, 800)
        tab.show()
        qtbot.waitExposed(tab)
        if index is not None:
            state.set_index(index)
        tabs.append(tab)
        return tab

    yield make
    for tab in tabs:
        tab.shutdown()
        qtbot.waitUntil(lambda tab=tab: not tab.is_busy(), timeout=TIMEOUT)
        assert not tab.camera_view.is_running()
    ThumbnailCache.instance().wait()
    assert workers.wait_all(TIMEOUT)


def _search(qtbot, tab: SearchTab, path) -> None:
    tab.search_file(path)
    qtbot.waitUntil(lambda: bool(tab.results()) and not tab.is_busy(), timeout=TIMEOUT)


def test_search_from_file_controls_and_rerankers(qtbot, make_tab, data):
    tab = make_tab(data.index, top_k=5)
    assert tab.k_spin.value() == 5
    path, instance = data.easy
    _search(qtbot, tab, path)
    results = tab.results()
    assert [r.rank for r in results] == [1, 2, 3, 4, 5]
    assert results[0].instance == instance
    assert tab.grid.count() == 5 and tab.grid.results() == results
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    assert tab.verdict() is not None and tab.message.isHidden()
    qtbot.waitUntil(lambda: tab.grid.cards()[0].has_thumbnail(), timeout=TIMEOUT)
    descriptor = tab._desc

    # k and per-instance: the cached scores are re-ranked on the spot, nothing is re-described
    tab.k_spin.setValue(3)
    assert [r.rank for r in tab.results()] == [1, 2, 3] and tab.grid.count() == 3
    tab.k_spin.setValue(len(data.index))
    assert len(tab.results()) == len(data.index)
    tab.per_instance.setChecked(True)
    shown = [r.instance for r in tab.results()]
    assert len(shown) == len(set(shown)) == len(data.index.instances)
    assert shown[0] == instance
    tab.per_instance.setChecked(False)
    tab.k_spin.setValue(5)

    # a re-ranker re-runs from the kept descriptor
    for name in ("aqe", "icfrr"):
        tab.set_reranker(name)
        qtbot.waitUntil(lambda name=name: tab._final_for is not None and tab._final_for[2][:1] == (name,)
                        and not tab.is_busy(), timeout=TIMEOUT)
        assert tab._desc is descriptor  # not described again
        assert [r.rank for r in tab.results()] == [1, 2, 3, 4, 5] and tab.grid.count() == 5
        assert tab._final.shape == tab._cos.shape and not np.array_equal(tab._final, tab._cos)
        assert [r.score for r in tab.results()] == sorted((r.score for r in tab.results()), reverse=True)
        assert "re-ranked with" in tab.status.text()
    assert tab.icfrr_kq.value() >= 1  # suggested from the collection
    tab.icfrr_beta.setValue(0.25)  # a parameter change re-ranks again (after a short pause)
    qtbot.waitUntil(lambda: tab._final_for[2] == ("icfrr", tab.icfrr_kq.value(), tab.icfrr_kg.value(), 0.25,
                                                  tab.icfrr_iter.value()) and not tab.is_busy(), timeout=TIMEOUT)
    assert tab._desc is descriptor
    tab.set_reranker("")
    qtbot.waitUntil(lambda: tab._final_for[2] == (), timeout=TIMEOUT)
    assert tab.results()[0].instance == instance

    # double-click → the query and the reference side by side
    with qtbot.waitSignal(tab.grid.activated, timeout=5000):
        qtbot.mouseDClick(tab.grid.cards()[0], Qt.MouseButton.LeftButton)
    dialog = tab._dialog
    assert isinstance(dialog, ResultDialog) and dialog.isVisible()
    assert dialog.result.instance == instance
    assert dialog.query_view.has_image() and dialog.reference_view.has_image()
    dialog.close()


def test_camera_preview_and_capture(qtbot, make_tab, data):
    path, instance = data.easy
    cams: list[tuple[int, FileSequenceCamera]] = []

    def factory(index: int) -> FileSequenceCamera:
        cams.append((index, FileSequenceCamera([path], fps=15, loop=True)))
        return cams[-1][1]

    tab = make_tab(data.index, camera_factory=factory, camera=0)
    assert tab.capture_button.isEnabled() is False
    tab.camera_button.click()  # Start camera
    assert [i for i, _ in cams] == [0] and tab.camera_view.is_running()
    qtbot.waitUntil(lambda: tab.camera_view.frames_shown >= 3, timeout=10_000)
    assert tab.camera_view.view.has_image() and tab.capture_button.isEnabled()
    frame = tab.camera_view.latest_frame()
    assert frame is not None and frame.dtype == np.uint8 and frame.ndim == 3

    tab.activateWindow()
    qtbot.waitUntil(tab.isActiveWindow, timeout=5000)
    qtbot.keyClick(tab, Qt.Key.Key_Space)  # Capture
    assert tab.query() is not None and tab.query().name.startswith("camera capture")
    assert tab.query().image.shape == frame.shape
    qtbot.waitUntil(lambda: bool(tab.results()) and not tab.is_busy(), timeout=TIMEOUT)
    assert tab.results()[0].instance == instance
    assert tab.query_view.has_image()
    assert tab.camera_view.is_running()  # the preview goes on after a capture

    tab.camera_button.click()  # Stop camera
    assert not tab.camera_view.is_running() and not tab.capture_button.isEnabled()
    assert tab.camera_button.text() == "Start camera"


def test_no_camera_shows_message(qtbot, make_tab):
    missing = 0 if not list_cameras(1) else 63
    tab = make_tab(camera=missing)  # the default factory: OpenCV webcams
    assert tab.camera_factory is OpenCVCamera
    tab.start_camera(missing)
    expected = f"No camera found at number {missing}"
    qtbot.waitUntil(lambda: expected in tab.message.text(), timeout=10_000)
    assert expected in tab.camera_view.message() and "Settings" in tab.message.text()
    qtbot.waitUntil(lambda: not tab.camera_view.is_running(), timeout=10_000)
    assert not tab.capture_button.isEnabled() and tab.camera_button.text() == "Start camera"
    assert not tab.capture()  # nothing to capture: a message, no query
    assert tab.query() is None and "Start the camera" in tab.message.text()


def test_messages_without_index_and_for_bad_images(qtbot, make_tab, data, tmp_path):
    tab = make_tab()  # no index yet
    path, _ = data.easy
    tab.search_file(path)
    assert tab.message.text() == NO_INDEX and not tab.message.isHidden()
    assert tab.query_view.has_image() and not tab.is_busy() and tab.results() == []

    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    assert not tab.search_file(bad)
    assert "broken.jpg" in tab.message.text() and "cannot be used" in tab.message.text()

    # paste / drop: encoded image bytes, a QImage, and a file URL
    rgb = np.zeros((40, 60, 3), np.uint8)
    rgb[:, :30] = (255, 0, 0)
    mime = QMimeData()
    mime.setImageData(numpy_to_qimage(rgb))
    assert tab.search_mime(mime, "pasted image")
    assert tab.query().name == "pasted image"
    assert np.array_equal(tab.query().image, rgb)
    assert np.array_equal(qimage_to_rgb(numpy_to_qimage(rgb)), rgb)
    mime = QMimeData()
    from PySide6.QtCore import QUrl

    mime.setUrls([QUrl.fromLocalFile(str(path))])
    assert tab.search_mime(mime) and tab.query().path == str(path)
    empty = QMimeData()
    empty.setText("hello")
    assert not tab.search_mime(empty) and "No image found" in tab.message.text()


def test_not_in_collection_banner(qtbot, make_tab, data):
    tab = make_tab(data.index)
    path, instance = data.easy
    _search(qtbot, tab, path)
    best_in = float(np.max(tab._cos))
    _search(qtbot, tab, data.outside)
    best_out = float(np.max(tab._cos))
    assert best_out < best_in
    threshold = (best_in + best_out) / 2
    tab.state.settings.threshold = threshold
    tab.k_spin.setValue(tab.k_spin.value() + 1)  # results are shown again with the new threshold
    assert tab.verdict() is False
    assert not tab.banner.isHidden() and "Not in the collection" in tab.banner.text()
    assert f"{threshold:.2f}" in tab.banner.text()
    assert tab.grid.count() == tab.k_spin.value()  # the closest references are still listed

    tab.set_reranker("aqe")  # the verdict uses the cosine scores, whatever the re-ranking
    qtbot.waitUntil(lambda: tab._final_for[2][:1] == ("aqe",) and not tab.is_busy(), timeout=TIMEOUT)
    assert tab.verdict() is False
    tab.set_reranker("")

    _search(qtbot, tab, path)
    assert tab.verdict() is True and tab.results()[0].instance == instance
    assert "Not in the collection" not in tab.banner.text()


def test_result_grid_marks_correct_results(qtbot, data):
    from museum_search.core.search import results_for
    from museum_search.gui.widgets.result_grid import ResultGrid

    index = data.index
    rows = np.arange(min(4, len(index)))
    results = results_for(index, rows, np.linspace(0.9, 0.5, len(index)).astype(np.float32))
    grid = ResultGrid(thumb_size=96)
    qtbot.addWidget(grid)
    grid.resize(500, 400)
    grid.show()
    correct = [True, False] + [True] * (len(results) - 2)
    grid.set_results(results, correct)
    assert [c.mark for c in grid.cards()] == ["correct" if c else "incorrect" for c in correct]
    assert grid.correct() == correct and grid.results() == results
    qtbot.waitUntil(lambda: all(c.has_thumbnail() for c in grid.cards()), timeout=30_000)
    with pytest.raises(ValueError):
        grid.set_results(results, correct[:1])
    with qtbot.waitSignal(grid.activated, timeout=5000) as sig:
        qtbot.mouseDClick(grid.cards()[1], Qt.MouseButton.LeftButton)
    assert sig.args[0] is results[1]
    grid.set_results(results)  # the Search tab's use: no marks
    assert all(c.mark == "" for c in grid.cards())
    grid.clear("Nothing here")
    assert grid.count() == 0 and not grid.placeholder.isHidden()
    ThumbnailCache.instance().wait()
