"""The Search tab, driven offscreen: a view over the core query pipeline (the same answer as the CLI),
controls, re-ranking, verification, the evidence dialog, a replayed camera, verdicts."""

from __future__ import annotations

import csv
import html
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QSettings, Qt
from PySide6.QtWidgets import QComboBox

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query, query_from_array
from museum_search.core.capture import FileSequenceCamera, OpenCVCamera, list_cameras
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
    tab.k_spin.setValue(tab.rerank.verify_top())  # every verified reference, some with no match at all
    _settle(qtbot, tab)
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


# --------------------------------------------------------------------------------------------
# The evidence view on framed references (issue 23, item 6)


def _query(name: str) -> Path:
    return SAMPLE / "queries" / name


def _plain(rich: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", rich))


def _outline_pixels_outside(view, colour: str) -> int:
    """Pixels of ``colour`` (the outline's) that the view painted outside its two images."""
    from PySide6.QtGui import QColor, QImage

    img = view.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    w, h, bpl = img.width(), img.height(), img.bytesPerLine()
    rgb = np.frombuffer(img.constBits(), np.uint8, bpl * h).reshape(h, bpl)[:, : 3 * w].reshape(h, w, 3)
    target = QColor(colour)
    near = np.all(np.abs(rgb.astype(int) - (target.red(), target.green(), target.blue())) <= 6, axis=2)
    ratio = img.width() / view.width()  # device pixels per widget pixel
    inside = np.zeros_like(near)
    for r in view.image_rects():
        x0, y0 = int(np.floor(r.left() * ratio)) - 1, int(np.floor(r.top() * ratio)) - 1
        x1, y1 = int(np.ceil(r.right() * ratio)) + 1, int(np.ceil(r.bottom() * ratio)) + 1
        inside[max(0, y0):y1, max(0, x0):x1] = True
    assert near.sum() > 50  # the outlines are drawn
    return int((near & ~inside).sum())


def test_evidence_outline_is_what_matched_and_stays_in_the_photo(qtbot, data):
    """On the sample's framed references the reference's whole outline (wall included) falls
    outside the query; the outline drawn is the inliers' area instead: inside the photo, on the
    inlier hull, and nothing yellow is painted off the images."""
    import cv2

    from museum_search.core.verification._shortlist import matched_area
    from museum_search.gui.widgets.evidence_view import OUTLINE_COLOUR

    pipeline = QueryPipeline(data.index, QuerySettings())
    tol = pipeline.verification.params.ransac_threshold + 1.0  # px: the inliers' reprojection error
    whole_outline_leaves = 0
    for name in ("q02.jpg", "q15.jpg", "q20.jpg"):
        query = load_query(_query(name))
        (answer,) = pipeline.answer([query])
        m = pipeline.matches(query, answer.top.row, answer)
        assert m.outline is not None and m.inliers >= 8
        w, h = m.query_size
        whole_outline_leaves += not np.all((m.outline >= 0) & (m.outline <= (w, h)))
        area = matched_area(m)
        assert area is not None and len(area.query) >= 3
        assert np.all(area.query >= -1e-3) and np.all(area.query <= np.array([w, h]) + 1e-3), name
        hull = cv2.convexHull(m.query_points.astype(np.float32))
        for x, y in area.query:  # on or inside the hull of the inliers in the photo
            assert cv2.pointPolygonTest(hull, (float(x), float(y)), True) >= -tol, (name, x, y)
        ref_hull = area.reference.reshape(-1, 1, 2).astype(np.float32)
        assert all(cv2.pointPolygonTest(ref_hull, (float(x), float(y)), True) >= -1e-3
                   for x, y in m.reference_points)  # the reference's outline holds every inlier
        assert 0 <= area.middle <= m.inliers and 0 <= area.near_border <= m.inliers

        dialog = ResultDialog(query, answer.top, pipeline, None, answer)
        qtbot.addWidget(dialog)
        dialog.resize(1024, 700)
        dialog.show()
        qtbot.waitExposed(dialog)
        qtbot.waitUntil(lambda d=dialog: not d.is_busy(), timeout=TIMEOUT)
        view = dialog.evidence_view
        assert view.matched_area() is not None
        qrect, rrect = view.image_rects()
        drawn_q, drawn_r = view.outline_polygons()
        for poly, rect in ((drawn_q, qrect), (drawn_r, rrect)):
            assert poly.size() >= 3
            assert all(rect.adjusted(-0.5, -0.5, 0.5, 0.5).contains(poly.at(i)) for i in range(poly.size())), name
        assert _outline_pixels_outside(view, OUTLINE_COLOUR.name()) == 0, name
        dialog.grab().save(f"/tmp/evidence_{Path(name).stem}.png")
        dialog.close()
    assert whole_outline_leaves >= 1  # the sample shows the problem this outline avoids


def test_rejected_answer_dialog_says_the_verdict_first(qtbot, make_tab, data):
    """A rejected answer's dialog opens with the verdict, says where the points lie (a frame's
    edges here), and keeps the catalogue entry quiet; its evidence reuses the answer's features."""
    from PySide6.QtGui import QPalette

    from museum_search.gui.widgets.evidence_view import EDGES_ONLY

    tab = make_tab(data.index, top_k=4)
    tab.resize(1024, 700)
    _search(qtbot, tab, _query("q20.jpg"))  # framed like the references: the frame matches, not the picture
    answer = tab.answer()
    assert not answer.in_collection and answer.features is not None
    dialog = tab.show_result_dialog(answer.top)
    assert dialog.answer is answer
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=TIMEOUT)
    verdict = _plain(dialog.verdict_label.text())
    assert verdict.startswith("Not in this collection: ") and answer.reason in verdict
    assert dialog.verdict_label.property("verdict") == "out" and dialog.verdict_label.isVisible()
    # first the verdict, then the photos, then where the points lie, then the catalogue entry
    tops = [w.mapTo(dialog, w.rect().topLeft()).y() for w in
            (dialog.verdict_label, dialog.evidence_view, dialog.where_label, dialog.catalogue)]
    assert tops == sorted(tops) and dialog.where_label.isVisible()
    evidence = dialog.evidence_view.evidence()
    area = dialog.evidence_view.matched_area()
    assert evidence.inliers > 0 and area is not None and area.middle < EDGES_ONLY * evidence.inliers
    where = dialog.where_label.text()
    assert where.startswith(f"The {evidence.inliers} matching points lie at the edges of the outlined area")
    assert "frame" in where and (area.near_border == 0 or f"{area.near_border} of them near the edge" in where)
    assert not dialog.evidence_view.emphasised()  # "25 matching points" is not in bold
    quiet = dialog.catalogue.palette().color(QPalette.ColorRole.WindowText)
    assert quiet == dialog.palette().color(QPalette.ColorRole.PlaceholderText)
    assert dialog.catalogue.font().pointSizeF() < dialog.font().pointSizeF()
    # the evidence is core's matches, with the answer's local features
    same = tab._shown_pipeline.matches(tab.query().item, answer.top.row, answer)
    assert evidence.inliers == same.inliers and np.array_equal(evidence.query_points, same.query_points)
    dialog.grab().save("/tmp/evidence_rejected.png")
    dialog.close()

    _search(qtbot, tab, data.easy[0])  # an accepted answer: its verdict, and the catalogue as usual
    dialog = tab.show_result_dialog(tab.answer().top)
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=TIMEOUT)
    assert _plain(dialog.verdict_label.text()).startswith("In the collection: ")
    assert dialog.evidence_view.emphasised()
    assert dialog.catalogue.palette().color(QPalette.ColorRole.WindowText) != quiet
    assert "spread across the outlined area" in dialog.where_label.text()
    dialog.close()


def test_evidence_dialog_uses_the_answers_features(qtbot, data):
    """The dialog draws the matches of the answer's own local features (not extracted again):
    given an answer whose features are every other keypoint, it draws those matches."""
    pipeline = QueryPipeline(data.index, QuerySettings())
    query = load_query(data.easy[0])
    (answer,) = pipeline.answer([query])
    points, descriptors = answer.features
    halved = replace(answer, features=(points[::2], descriptors[::2]))
    dialog = ResultDialog(query, answer.top, pipeline, None, halved)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=TIMEOUT)
    drawn = dialog.evidence_view.evidence()
    expected = pipeline.matches(query, answer.top.row, halved)
    fresh = pipeline.matches(query, answer.top.row)
    assert drawn.inliers == expected.inliers and np.array_equal(drawn.query_points, expected.query_points)
    assert drawn.inliers != fresh.inliers  # half the keypoints: another set of matches
    dialog.close()


# --------------------------------------------------------------------------------------------
# Cards, tooltips, the camera list (issue 23, items 8 and 10)


def test_card_ids_keep_their_ends_and_the_grid_uses_the_width(qtbot, data):
    """Ids that differ in their last digits stay apart on narrow cards (cut at the start, whole in
    the tooltip), and the cards stretch so that no empty band is left beside the columns."""
    from museum_search.gui.widgets.query_page import ranked_results
    from museum_search.gui.widgets.result_grid import ResultGrid

    index = data.index
    results = ranked_results(index, np.arange(10), np.linspace(0.9, 0.5, len(index)).astype(np.float32))
    ids = [f"bbdd_collection_{83 + i:05d}" for i in range(len(results))]
    results = [replace(r, instance=i) for r, i in zip(results, ids)]
    grid = ResultGrid(thumb_size=96)
    qtbot.addWidget(grid)
    grid.resize(330, 500)
    grid.show()
    qtbot.waitExposed(grid)
    grid.set_results(results)
    heads = [_plain(c.head.text()) for c in grid.cards()]
    assert all("…" in t for t in heads)  # too long for a 96 px card
    assert all(t.endswith(i[-5:]) for t, i in zip(heads, ids)) and len(set(heads)) == len(heads)
    assert all(i in c.toolTip() for c, i in zip(grid.cards(), ids))

    spacing = grid.grid.spacing()
    for width in (330, 560, 724, 1000):
        grid.resize(width, 500)
        qtbot.waitUntil(lambda g=grid: g.cards()[0].width() == g.card_width(), timeout=5000)
        avail = grid.scroll.viewport().width() - 8
        cols = grid._columns
        assert cols == max(1, (avail + spacing) // (96 + 20 + spacing))
        row = grid.cards()[:cols]
        right = max(c.geometry().right() for c in row) + 1 - row[0].geometry().left()
        assert avail - cols < right <= avail, (width, avail, right)  # the row fills the width
    ThumbnailCache.instance().wait()


def test_search_tab_at_1024_fills_the_result_area(qtbot, make_tab, data):
    tab = make_tab(data.index, top_k=6)
    tab.resize(1024, 700)
    _search(qtbot, tab, data.easy[0])
    grid = tab.grid
    qtbot.waitUntil(lambda: grid.cards()[0].width() == grid.card_width(), timeout=5000)
    row = [c for c in grid.cards() if c.geometry().top() == grid.cards()[0].geometry().top()]
    band = grid.scroll.viewport().width() - 4 - (max(c.geometry().right() for c in row) + 1)
    assert len(row) >= 3 and 0 <= band <= 4 + len(row)  # no empty band beside the columns
    tab.grab().save("/tmp/search_tab_1024.png")


def test_approximate_tooltip_wraps_and_says_what_to_do(qtbot, data):
    from PySide6.QtGui import Qt as QtGui_Qt
    from PySide6.QtWidgets import QLabel

    from museum_search.gui.widgets.rerank_controls import RerankControls
    from museum_search.gui.widgets.search_mode import TIP_WIDTH, SearchModeCombo

    combo = SearchModeCombo()
    qtbot.addWidget(combo)
    combo.set_index(data.index)  # the sample: no approximate-search index
    assert not combo.is_available("ann")
    tip = combo.itemData(combo.findData("ann"), Qt.ItemDataRole.ToolTipRole)
    words = _plain(tip)
    assert "Nothing needs doing" in words and f"this one has {len(data.index)}" in words
    controls = RerankControls(single=True)
    qtbot.addWidget(controls)
    for text in (tip, combo.toolTip(), controls.verify_check.toolTip(), controls.rerank_combo.toolTip()):
        label = QLabel()  # sized as QToolTip sizes its label
        label.setWordWrap(QtGui_Qt.mightBeRichText(text))
        label.setText(text)
        assert QtGui_Qt.mightBeRichText(text) and label.sizeHint().width() <= TIP_WIDTH + 20
        plain = QLabel(_plain(text))  # the same words on one line: the width a plain tooltip has
        assert plain.sizeHint().width() > TIP_WIDTH + 20


def test_no_camera_found_disables_start(qtbot, make_tab):
    from museum_search.gui.search_tab import NO_CAMERA

    if list_cameras(4):
        pytest.skip("this machine has a camera")
    tab = make_tab()  # the default factory: the computer's webcams, probed when the tab shows
    qtbot.waitUntil(lambda: tab.cameras_found() is not None, timeout=10_000)
    assert tab.cameras_found() is False
    assert tab.camera_combo.currentText() == NO_CAMERA and tab.camera_combo.count() == 1
    assert not tab.camera_button.isEnabled() and not tab.camera_combo.isEnabled()
    assert "No camera was found" in tab.camera_combo.toolTip()

    replay = make_tab(camera_factory=lambda n: FileSequenceCamera([_query("q01.jpg")]), camera=2)
    assert replay.camera_combo.currentText() == "Camera 2" and replay.camera_button.isEnabled()
    assert replay.cameras_found() is None  # a replayed camera is not probed
