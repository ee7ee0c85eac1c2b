"""The Search tab, driven offscreen: a view over the core query pipeline (the same answer as the CLI),
controls, re-ranking, verification, the evidence dialog, a replayed camera, verdicts."""

from __future__ import annotations

import csv
import html
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QSettings, Qt
from PySide6.QtWidgets import QComboBox

from museum_search.core.capture import FileSequenceCamera, OpenCVCamera, list_cameras
from museum_search.core.query import QueryPipeline, QuerySettings, load_query, query_from_array
from museum_search.gui import workers
from museum_search.gui.search_tab import NO_INDEX, ResultDialog, SearchTab
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.evidence_view import NO_MATCH
from museum_search.gui.widgets.thumbnails import ThumbnailCache, numpy_to_qimage

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
TIMEOUT = 120_000  # ms; describing a query takes about a second, more on a loaded machine


def _read_truth(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [(r["query"], (r.get("instance") or "").strip()) for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def data(request) -> SimpleNamespace:
    """The sample index (verified, calibrated), an in-collection query (path, instance) and an
    out-of-collection one (empty instance in ground_truth.csv)."""
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
    assert tab.search_file(path)
    _settle(qtbot, tab)


def _settle(qtbot, tab: SearchTab) -> None:
    """Wait until the answer shown is the one for the current query and controls."""
    qtbot.waitUntil(tab.is_up_to_date, timeout=TIMEOUT)


def _same_answer(a, b) -> None:
    assert a.in_collection == b.in_collection and a.reason == b.reason
    assert [(r.row, r.instance, r.inliers) for r in a.results] == [(r.row, r.instance, r.inliers) for r in b.results]
    assert np.allclose([r.cosine for r in a.results], [r.cosine for r in b.results], rtol=0, atol=1e-6)


def test_search_tab_gives_the_cli_answer_and_describes_once(qtbot, make_tab, data):
    tab = make_tab(data.index, top_k=5)
    assert tab.rerank.verify_check.isChecked() and "slower" in tab.rerank.verify_check.toolTip().lower()
    assert tab.findChild(QComboBox, "rerankCombo").findData("spatial") < 0  # verification is its own toggle
    path, instance = data.easy
    _search(qtbot, tab, path)

    # the same answer as `museum-search query INDEX FILE` (default settings, k = 5)
    (cli,) = QueryPipeline(data.index, QuerySettings()).answer([load_query(path)])
    answer = tab.answer()
    _same_answer(answer, cli)
    assert answer.results[0].instance == instance and answer.in_collection and tab.verdict() is True
    assert [r.rank for r in tab.results()] == [1, 2, 3, 4, 5] and tab.grid.results() == tab.results()
    assert "In the collection" in tab.banner.text() and html.escape(cli.reason) in tab.banner.text()
    assert answer.confidence == pytest.approx(cli.confidence)  # the calibrated verdict's, shown with it
    assert f"confidence {cli.confidence:.2f}; {html.escape(cli.reason)}" in tab.banner.text()
    top = answer.results[0]
    assert top.inliers is not None and answer.top_inliers >= tab._shown_pipeline.verdict.min_inliers
    card = tab.grid.cards()[0].evidence_label.text()
    assert f"cosine {top.cosine:.2f} · {top.inliers} inliers" in card and "score" not in card
    assert tab.message.isHidden()
    qtbot.waitUntil(lambda: tab.grid.cards()[0].has_thumbnail(), timeout=TIMEOUT)
    descriptors = tab._descriptors[1]

    # k, one-per-instance, re-rankers and verification answer again from the kept description
    tab.k_spin.setValue(3)
    _settle(qtbot, tab)
    assert [r.rank for r in tab.results()] == [1, 2, 3] and tab.grid.count() == 3
    tab.k_spin.setValue(len(data.index))
    tab.per_instance.setChecked(True)
    _settle(qtbot, tab)
    shown = [r.instance for r in tab.results()]
    assert len(shown) == len(set(shown)) == len(data.index.instances) and shown[0] == instance
    tab.per_instance.setChecked(False)
    tab.k_spin.setValue(5)
    for name in ("aqe", "icfrr"):
        tab.rerank.set_names([name])
        _settle(qtbot, tab)
        assert tab._shown_pipeline.settings.rerank == (name,) and tab.grid.count() == 5
        assert f"{name}, verified" in tab.status.text()
    assert tab.rerank.kq_spin.value() >= 1  # suggested from the collection
    tab.rerank.beta_spin.setValue(0.25)  # a parameter change answers again (after a short pause)
    qtbot.waitUntil(lambda: tab.is_up_to_date() and tab._shown_pipeline.settings.options.beta == 0.25,
                    timeout=TIMEOUT)
    tab.rerank.set_names([""])
    _settle(qtbot, tab)
    _same_answer(tab.answer(), cli)  # back to the default settings: the CLI's answer again

    tab.rerank.verify_check.setChecked(False)  # not verified: cosine only, no inliers on the cards
    _settle(qtbot, tab)
    assert all(r.inliers is None for r in tab.results())
    assert all("not verified" in c.evidence_label.text() for c in tab.grid.cards())
    assert "not verified" in tab.answer().reason
    (unverified,) = QueryPipeline(data.index, QuerySettings(verify=False)).answer([load_query(path)])
    _same_answer(tab.answer(), unverified)
    tab.rerank.verify_check.setChecked(True)
    _settle(qtbot, tab)
    assert tab._descriptors[1] is descriptors  # never described again
    assert "described" not in tab.status.text()
    tab.grab().save("/tmp/search_tab.png")

    # double-click → the query and the reference side by side, with the evidence drawn
    with qtbot.waitSignal(tab.grid.activated, timeout=5000):
        qtbot.mouseDClick(tab.grid.cards()[0], Qt.MouseButton.LeftButton)
    dialog = tab._dialog
    assert isinstance(dialog, ResultDialog) and dialog.isVisible() and dialog.result.instance == instance
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=TIMEOUT)
    evidence = dialog.evidence_view.evidence()
    assert evidence is not None and evidence.outline is not None and evidence.outline.shape == (4, 2)
    assert evidence.inliers > 12 and len(evidence.query_points) == evidence.inliers
    assert dialog.evidence_view.caption() == f"{evidence.inliers} matching points"
    dialog.grab().save("/tmp/evidence_dialog.png")
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
    assert tab.query().image.shape == query_from_array(frame).image.shape  # through core, ≤ 640 px
    _settle(qtbot, tab)
    assert tab.results()[0].instance == instance and tab.verdict() is True
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
    # the camera is chosen right here, in the Camera list, not in Settings
    assert expected in tab.camera_view.message() and "Camera list" in tab.message.text()
    assert "Settings" not in tab.message.text()
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
    assert np.array_equal(tab.query().image, load_query(path).image)  # what the CLI decodes

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
    mime = QMimeData()
    from PySide6.QtCore import QUrl

    mime.setUrls([QUrl.fromLocalFile(str(path))])
    assert tab.search_mime(mime) and tab.query().path == str(path)
    empty = QMimeData()
    empty.setText("hello")
    assert not tab.search_mime(empty) and "No image found" in tab.message.text()


def test_not_in_collection_banner_and_no_geometric_match(qtbot, make_tab, data):
    tab = make_tab(data.index, top_k=4)
    _search(qtbot, tab, data.outside)
    (cli,) = QueryPipeline(data.index, QuerySettings(k=4)).answer([load_query(data.outside)])
    _same_answer(tab.answer(), cli)
    assert tab.verdict() is False and not tab.answer().in_collection
    text = tab.banner.text()
    assert not tab.banner.isHidden() and "Not in this collection" in text and html.escape(cli.reason) in text
    assert "matching points" in text and tab.banner.property("verdict") == "out"
    assert f"confidence {cli.confidence:.2f}; " in text and "Confidence:" in tab.banner.toolTip()
    assert tab.grid.count() == 4  # the closest references are still listed

    tab.rerank.set_names(["aqe"])  # the verdict stays the pipeline's, whatever the re-ranking
    _settle(qtbot, tab)
    assert tab.verdict() is False
    tab.rerank.set_names([""])
    _settle(qtbot, tab)

    # no homography with a (wrong) reference: the two photos, "no geometric match"
    dialog = tab.show_result_dialog(next(r for r in tab.results() if r.inliers == 0))
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=TIMEOUT)
    assert dialog.evidence_view.caption() == NO_MATCH
    assert dialog.evidence_view.evidence().outline is None
    assert all(dialog.evidence_view._images)  # both photos shown
    dialog.grab().save("/tmp/evidence_no_match.png")
    dialog.close()

    path, instance = data.easy
    _search(qtbot, tab, path)
    assert tab.verdict() is True and tab.results()[0].instance == instance
    assert "Not in this collection" not in tab.banner.text()


def test_result_grid_marks_correct_results(qtbot, data):
    from museum_search.gui.widgets.query_page import ranked_results
    from museum_search.gui.widgets.result_grid import ResultGrid

    index = data.index
    rows = np.arange(min(4, len(index)))
    results = ranked_results(index, rows, np.linspace(0.9, 0.5, len(index)).astype(np.float32))
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
    assert grid.cards()[0].evidence_label.text().endswith("score 0.900")  # a bare ranking: its score
    grid.set_results(results)  # the Search tab's use: no marks
    assert all(c.mark == "" for c in grid.cards())
    grid.clear("Nothing here")
    assert grid.count() == 0 and not grid.placeholder.isHidden()
    ThumbnailCache.instance().wait()
