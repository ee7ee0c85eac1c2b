"""Every object in the photo, in the GUI (issue 36, item 4): the Search tab's "2 objects in this
photo" cards and the objects' outlines on the query photo, region queries drawn with the mouse (the
answer is core's for that part of the photo), and the kiosk's cards — on an index of the real
paintings, with qsd2_w3's photos of two paintings on a wall."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import test_gui_demo
import test_gui_search
from PySide6.QtCore import QMimeData, QPoint, Qt
from PySide6.QtWidgets import QLabel

from museum_search.core.answer import QueryPipeline, QuerySettings, load_query, query_from_array, query_from_bytes
from museum_search.core.images import load_image
from museum_search.gui.demo_window import CONTINUE, confidence_words
from museum_search.gui.search_tab import SearchTab
from museum_search.gui.widgets.objects import band_text, object_colour, objects_heading
from museum_search.gui.widgets.region_view import DRAW_HINT, FOR_THE_BOX
from museum_search.gui.widgets.result_grid import result_title

pytestmark = [pytest.mark.gui, pytest.mark.data]

# the Search tab's and the kiosk's fixtures (each closed, with its workers finished, at the end)
make_tab = test_gui_search.make_tab
make_demo = test_gui_demo.make_demo

TIMEOUT = 180_000  # ms: a query takes about a second, more on a loaded machine
CAMERA_SIDE = test_gui_demo.CAMERA_SIDE  # the side of the kiosk fixture's replayed camera frames


def _truth(folder: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with open(folder / "ground_truth.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["query"], []).append(row["instance"])
    return out


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory, paintings_index_path) -> SimpleNamespace:
    """The paintings' index (all 287 references; a copy of the session's: the app may write beside
    it), a qsd2_w3 photo of two paintings whose both core names, a photo of one painting core
    accepts, and a photo of a toy (COIL-100) it rejects."""
    from museum_search.core.index import Index

    paintings = shared_data / "paintings"
    index = Index.load(shutil.copytree(paintings_index_path, tmp_path_factory.mktemp("paintings") / "index"))
    folder = paintings / "queries" / "qsd2_w3"
    truth = _truth(folder)
    pipe = QueryPipeline(index)

    def objects(name: str) -> list[str]:
        return [o.instance for o in pipe.answer([load_query(folder / name)])[0].objects]

    two = next(q for q, inst in sorted(truth.items()) if len(inst) == 2 and sorted(objects(q)) == sorted(inst))
    one = next(q for q, inst in sorted(truth.items()) if len(inst) == 1 and objects(q) == inst)
    toy = sorted((shared_data / "coil100").glob("*.jpg"))[0]
    assert not pipe.answer([load_query(toy)])[0].in_collection, "a toy must not be taken for a painting"
    catalogue = {r["instance"]: r for r in csv.DictReader(open(paintings / "catalogue.csv", encoding="utf-8"))}
    return SimpleNamespace(index=index, two=folder / two, one=folder / one, toy=toy, catalogue=catalogue)


def _settle(qtbot, tab: SearchTab) -> None:
    qtbot.waitUntil(tab.is_up_to_date, timeout=TIMEOUT)


def _searched(qtbot, make_tab, data, path: Path | None) -> SearchTab:
    """A Search tab on the paintings, with the photo ``path`` asked about (None: none yet)."""
    tab = make_tab(data.index)
    tab.resize(1400, 900)
    if path is not None:
        assert tab.search_file(path)
        _settle(qtbot, tab)
    return tab


def _same(a, b) -> None:
    """The tab's answer is core's: the same verdict, results and objects (outlines to the pixel)."""
    assert (a.in_collection, a.reason) == (b.in_collection, b.reason)
    assert [(r.row, r.inliers) for r in a.results] == [(r.row, r.inliers) for r in b.results]
    assert [(o.instance, o.reason, o.region) for o in a.objects] == [(o.instance, o.reason, o.region) for o in b.objects]


def _expected_on_screen(tab: SearchTab, region) -> np.ndarray:
    """Where a polygon of the photo's pixels must be drawn: the photo is shown whole, scaled
    uniformly into the view's image rectangle."""
    rect = tab.query_view.image_rect()
    w, h = tab.query_view.photo_size()
    assert rect.width() / w == pytest.approx(rect.height() / h, rel=0.01)  # aspect kept
    return np.array(region) * np.array([rect.width() / w, rect.height() / h]) + np.array([rect.left(), rect.top()])


def _polygon(poly) -> np.ndarray:
    return np.array([(poly.at(i).x(), poly.at(i).y()) for i in range(poly.size())])


def _drag(qtbot, tab: SearchTab, box) -> None:
    """Draw ``box`` (x0, y0, x1, y1 in the photo's pixels) on the query photo with the mouse."""
    view = tab.query_view
    a, b = view.to_widget(box[:2]).toPoint(), view.to_widget(box[2:]).toPoint()
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=a)
    qtbot.mouseMove(view, QPoint((a.x() + b.x()) // 2, (a.y() + b.y()) // 2))
    qtbot.mouseMove(view, b)
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=b)


def _box_around(region, size, margin: float = 12.0) -> tuple[float, float, float, float]:
    pts = np.array(region)
    lo = np.maximum(pts.min(axis=0) - margin, 0)
    hi = np.minimum(pts.max(axis=0) + margin, np.array(size, float))
    return (*lo, *hi)


def test_two_paintings_two_cards_and_two_outlines_where_they_are(qtbot, make_tab, data):
    tab = _searched(qtbot, make_tab, data, data.two)
    core = QueryPipeline(data.index, tab.query_settings()).answer([load_query(data.two)])[0]
    answer = tab.answer()
    _same(answer, core)
    assert len(answer.objects) == 2

    # "2 objects in this photo", one card per object, in core's order, each in its outline's colour
    cards = tab.object_cards
    assert cards.isVisible() and cards.heading.text() == objects_heading(2) == "2 objects in this photo"
    assert [c.found.instance for c in cards.cards()] == [o.instance for o in core.objects]
    for i, (card, o) in enumerate(zip(cards.cards(), core.objects)):
        assert (result_title(o.result) or o.instance) in card.title.text()
        assert card.band.text() == band_text(o.confidence) != ""
        assert card.reason.text() == o.reason
        assert object_colour(i).name() in card.styleSheet()
    assert tab.query_view.outline_colours() == [object_colour(0), object_colour(1)]
    assert object_colour(0) != object_colour(1)
    qtbot.waitUntil(lambda: all(c.has_thumbnail() for c in cards.cards()), timeout=TIMEOUT)

    # the two outlines, drawn where core says the paintings are, on the whole photo
    polygons = tab.query_view.outline_polygons()
    assert len(polygons) == 2
    for poly, o in zip(polygons, core.objects):
        assert np.allclose(_polygon(poly), _expected_on_screen(tab, o.region), atol=1.0)
    centres = [_polygon(p).mean(axis=0) for p in polygons]
    assert np.linalg.norm(centres[0] - centres[1]) > 50  # side by side, apart
    rect = tab.query_view.image_rect()
    for c in centres:
        assert rect.contains(c[0], c[1])
    assert tab.region_bar.label.text() == DRAW_HINT and not tab.region_bar.button.isEnabled()
    assert not tab.banner.text().startswith(FOR_THE_BOX)

    # a double-click on a card opens its evidence
    qtbot.mouseDClick(cards.cards()[1], Qt.MouseButton.LeftButton)
    assert tab._dialog is not None and tab._dialog.result == core.objects[1].result
    tab._dialog.close()


def test_a_box_drawn_on_the_photo_asks_about_that_part_only(qtbot, make_tab, data):
    tab = _searched(qtbot, make_tab, data, data.two)
    whole = tab.answer()
    size = tab.query_view.photo_size()
    shown = tab.query_view.image()
    for o in whole.objects:  # a box around each painting: that painting alone
        _drag(qtbot, tab, _box_around(o.region, size))
        region = tab.query_view.region()
        assert region is not None and tab.query().whole is not None
        _settle(qtbot, tab)
        core = QueryPipeline(data.index, tab.query_settings()).answer([load_query(data.two, region)])[0]
        _same(tab.answer(), core)  # the answer is core's for that part of the photo
        assert [f.instance for f in tab.answer().objects] == [o.instance]
        assert not tab.object_cards.isVisible()  # one object: its answer is the banner's
        # the photo is still shown whole, with the box and the painting's outline in it
        assert tab.query_view.image() is not None and tab.query_view.image().size() == shown.size()
        box = tab.query_view.region_rect()
        assert np.allclose([box.left(), box.top(), box.right(), box.bottom()],
                           _expected_on_screen(tab, [region[:2], (region[0] + region[2], region[1] + region[3])]
                                               ).reshape(-1), atol=1.5)
        (poly,) = tab.query_view.outline_polygons()
        assert box.adjusted(-30, -30, 30, 30).contains(*_polygon(poly).mean(axis=0))
        # the result says it was for the box
        assert tab.banner.text().startswith(FOR_THE_BOX) and "In the collection" in tab.banner.text()
        assert "box only" in tab.region_bar.label.text() and tab.region_bar.button.isEnabled()
        # Escape (the first time) or "Whole photo" asks about the whole photo again
        if o is whole.objects[0]:
            qtbot.keyClick(tab.query_view, Qt.Key.Key_Escape)
        else:
            qtbot.mouseClick(tab.region_bar.button, Qt.MouseButton.LeftButton)
        _settle(qtbot, tab)
        assert tab.query_view.region() is None and tab.query().whole is None
        _same(tab.answer(), whole)
        assert len(tab.query_view.outline_polygons()) == 2 and tab.object_cards.isVisible()
        assert not tab.banner.text().startswith(FOR_THE_BOX) and tab.region_bar.label.text() == DRAW_HINT


def test_a_click_is_not_a_box_and_a_pasted_photo_is_cut_by_core(qtbot, make_tab, data):
    tab = _searched(qtbot, make_tab, data, None)
    raw = data.two.read_bytes()
    mime = QMimeData()
    mime.setData("image/jpeg", raw)
    assert tab.search_mime(mime, "pasted image")
    _settle(qtbot, tab)
    first = tab.query()
    view = tab.query_view
    qtbot.mouseClick(view, Qt.MouseButton.LeftButton, pos=view.image_rect().center().toPoint())
    assert view.region() is None and tab.query() is first  # a click asks nothing
    o = tab.answer().objects[-1]
    _drag(qtbot, tab, _box_around(o.region, view.photo_size()))
    _settle(qtbot, tab)
    region = view.region()
    core = QueryPipeline(data.index, tab.query_settings()).answer(
        [query_from_bytes(raw, "pasted image").cropped(region)])[0]
    _same(tab.answer(), core)
    assert tab.answer().top.instance == o.instance


def test_one_painting_one_outline_no_cards_and_a_toy_none(qtbot, make_tab, data):
    tab = _searched(qtbot, make_tab, data, data.one)
    answer = tab.answer()
    assert answer.in_collection and len(answer.objects) == 1
    assert not tab.object_cards.isVisible() and tab.object_cards.cards() == []
    (poly,) = tab.query_view.outline_polygons()
    assert np.allclose(_polygon(poly), _expected_on_screen(tab, answer.objects[0].region), atol=1.0)
    assert tab.search_file(data.toy)
    _settle(qtbot, tab)
    assert not tab.answer().in_collection and tab.answer().objects == []
    assert tab.query_view.outline_polygons() == [] and not tab.object_cards.isVisible()


def test_the_kiosk_shows_a_card_for_each_painting(qtbot, make_demo, data):
    w = make_demo(data.index, data.two, steady_seconds=0.3, result_seconds=120)
    qtbot.waitUntil(lambda: w.mode in ("result", "unknown"), timeout=TIMEOUT)
    answer = w.last_recognition.answer
    # core's answer about the same camera frame
    pipe = QueryPipeline(data.index, QuerySettings(k=max(1, int(w.settings.top_k)), per_instance=True))
    (core,) = pipe.answer([query_from_array(load_image(data.two, max_side=CAMERA_SIDE), "camera")])
    assert [o.instance for o in answer.objects] == [o.instance for o in core.objects]
    assert len(core.objects) == 2 and w.mode == "result"
    page = w.card_page
    assert page.several.isVisible() and not page.single.isVisible()
    assert page.several.heading.text() == "2 objects in this photo"
    assert page.several.footer.text() == CONTINUE
    cards = page.several.cards()
    assert len(cards) == 2
    for card, o in zip(cards, core.objects):
        entry = data.catalogue[o.instance]
        assert card.title.text() == entry["title"] and card.artist.text() == entry["artist"]
        assert card.confidence.text() == confidence_words(o.confidence) != ""
        assert card.photo.has_image() and card.isVisible()
    shown = [lab.text() for lab in w.findChildren(QLabel) if lab.isVisibleTo(w) and lab.text()]
    assert "2 objects in this photo" in shown and f"{core.objects[0].confidence:.2f}" not in "\n".join(shown)

    # the next visitor shows one painting: the one-object card, as before
    w.back_to_live()
    w.camera_view.stop()
    w2 = make_demo(data.index, data.one, steady_seconds=0.3, result_seconds=120)
    qtbot.waitUntil(lambda: w2.mode in ("result", "unknown"), timeout=TIMEOUT)
    assert w2.mode == "result" and len(w2.last_recognition.answer.objects) == 1
    assert w2.card_page.single.isVisible() and not w2.card_page.several.isVisible()
