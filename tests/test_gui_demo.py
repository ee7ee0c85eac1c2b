"""The kiosk demo, driven offscreen with a replayed camera (the same query photo over and over)."""

from __future__ import annotations

import csv
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QPoint, QRect, QSettings, Qt
from PySide6.QtWidgets import QLabel

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, query_from_array
from museum_search.core.capture import FileSequenceCamera, OpenCVCamera, list_cameras
from museum_search.core.images import load_image
from museum_search.gui import demo_window, workers
from museum_search.gui.demo_window import (
    ASK_STAFF,
    EXIT_KEYS_SETTING,
    HINT,
    LOOKUP_FAILED,
    NOT_IN_COLLECTION,
    TRYING_AGAIN,
    DemoWindow,
    confidence_words,
)
from museum_search.gui.state import Settings
from museum_search.gui.widgets.camera_view import ImageView

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"
TIMEOUT = 120_000  # ms; describing a frame takes about a second, more on a loaded machine
CAMERA_SIDE = 960  # the replayed camera's frames
#: Words for the technician, never for visitors.
TECHNICIAN_WORDS = ("Settings", "number", "camera 63", "Error", "error", "Traceback", "Exception", "exception")


def _text(w: DemoWindow, name: str) -> str:
    """The text of the kiosk's label named ``name``."""
    return w.findChild(QLabel, name).text()


def _message(w: DemoWindow) -> str:
    """Headline and detail of the full-screen message (error and retrying modes)."""
    return "\n".join(t for t in (_text(w, "demoHeadline"), _text(w, "demoDetail")) if t)


def _visible_text(w: DemoWindow) -> str:
    """Everything a visitor can read now (labels shown, texts painted in the pictures)."""
    texts = [lab.text() for lab in w.findChildren(QLabel) if lab.text() and lab.isVisibleTo(w)]
    texts += [view.message() for view in w.findChildren(ImageView) if view.isVisibleTo(w) and view.message()]
    return "\n".join(texts)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def data(sample_index) -> SimpleNamespace:
    """A known query (in the collection, right answer) and an unknown one (empty instance in
    ground_truth.csv), with the query pipeline's own answers about the camera's frames of them."""
    truth = [(SAMPLE / "queries" / r["query"], (r["instance"] or "").strip())
             for r in _rows(SAMPLE / "queries" / "ground_truth.csv")]
    catalogue = {r["instance"]: r for r in _rows(SAMPLE / "catalogue.csv")}
    pipe = QueryPipeline(sample_index, QuerySettings(k=8, per_instance=True))

    def answer(path: Path):
        (a,) = pipe.answer([query_from_array(load_image(path, max_side=CAMERA_SIDE), "camera")])
        return a

    known = next((p, i, a) for p, i in truth if i for a in [answer(p)] if a.in_collection and a.top.instance == i)
    unknown = next((p, a) for p, i in truth if not i for a in [answer(p)])
    assert not unknown[1].in_collection, f"{unknown[0].name}, not in the sample, must be rejected: {unknown[1].reason}"
    return SimpleNamespace(index=sample_index, known=known[0], instance=known[1], known_answer=known[2],
                           entry=catalogue[known[1]], unknown=unknown[0], unknown_answer=unknown[1])


@pytest.fixture
def make_demo(qtbot, tmp_path):
    """DemoWindows on throw-away settings; closed, with their workers finished, at the end."""
    windows: list[DemoWindow] = []

    def make(index, query: Path | None = None, camera_factory=None, exit_keys: str | None = None,
             camera: int = 3, **kwargs) -> DemoWindow:
        settings = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
        settings.camera = camera
        if exit_keys is not None:
            settings.set_value(EXIT_KEYS_SETTING, exit_keys)
        if camera_factory is None and query is not None:
            def camera_factory(number: int) -> FileSequenceCamera:
                assert number == camera  # the camera number from the settings
                return FileSequenceCamera([query], fps=12, loop=True, max_side=CAMERA_SIDE)
        w = DemoWindow(index, settings, camera_factory, **kwargs)
        qtbot.addWidget(w)
        w.resize(1280, 720)
        w.show()
        qtbot.waitExposed(w)
        windows.append(w)
        return w

    yield make
    for w in windows:
        w.shutdown()
        qtbot.waitUntil(lambda w=w: not w.is_busy(), timeout=TIMEOUT)
        assert not w.camera_view.is_running()
    assert workers.wait_all(TIMEOUT)


def _wait_mode(qtbot, w: DemoWindow, *modes: str) -> None:
    qtbot.waitUntil(lambda: w.mode in modes, timeout=TIMEOUT)


def test_steady_frames_show_the_object_card_then_live_again(qtbot, make_demo, data):
    w = make_demo(data.index, data.known, steady_seconds=0.3, result_seconds=1.5)
    assert w.mode in ("starting", "live")
    _wait_mode(qtbot, w, "live", "recognizing", "result")
    # nobody touches anything: the still picture is recognized by itself
    _wait_mode(qtbot, w, "result")
    assert w.recognitions == 1
    answer = w.last_recognition.answer  # the pipeline's answer, as the Search tab and the CLI give it
    assert answer.in_collection and answer.reason == data.known_answer.reason
    assert w.last_results == answer.results and answer.top.instance == data.instance
    assert _text(w, "demoTitle") == data.entry["title"]
    assert _text(w, "demoArtist") == data.entry["artist"]
    assert _text(w, "demoYear") == data.entry["year"]
    assert _text(w, "demoDescription") == data.entry["description"]
    # how sure, in plain words (never the number: that is for the technician's log)
    assert _text(w, "demoConfidence") == confidence_words(answer.confidence) != ""
    assert _text(w, "demoTitle") != NOT_IN_COLLECTION
    assert w.findChild(ImageView, "demoPhoto").has_image()  # the reference photo of the match
    w.grab().save("/tmp/demo_card.png")

    # the card goes away by itself; the same still scene is not recognized again
    _wait_mode(qtbot, w, "live")
    assert _text(w, "demoHint") == HINT
    qtbot.wait(900)  # three steady periods
    assert w.mode == "live" and w.recognitions == 1

    # a touch (click) anywhere recognizes the current picture; a touch on the card closes it
    qtbot.mouseClick(w.camera_view.view, Qt.MouseButton.LeftButton)  # the camera picture forwards it
    assert w.mode == "recognizing"
    _wait_mode(qtbot, w, "result")
    assert w.recognitions == 2 and _text(w, "demoTitle") == data.entry["title"]
    qtbot.mouseClick(w.card_page.photo, Qt.MouseButton.LeftButton)
    assert w.mode == "live"
    qtbot.keyClick(w, Qt.Key.Key_Space)  # the keyboard does the same
    assert w.mode == "recognizing"
    _wait_mode(qtbot, w, "result")
    assert w.recognitions == 3


def test_object_outside_the_collection_gets_the_sorry_card(qtbot, make_demo, data):
    w = make_demo(data.index, data.unknown, steady_seconds=0.3, result_seconds=60)
    _wait_mode(qtbot, w, "unknown", "result")
    assert w.mode == "unknown"  # exactly when the pipeline says "not in this collection"
    assert w.last_results and w.last_recognition.answer.in_collection is False
    assert w.last_recognition.answer.reason == data.unknown_answer.reason
    assert _text(w, "demoTitle") == NOT_IN_COLLECTION
    assert _text(w, "demoArtist") == "" or not w.card_page.artist.isVisible()
    assert not w.card_page.confidence.isVisible()
    w.grab().save("/tmp/demo_unknown.png")
    qtbot.keyClick(w, Qt.Key.Key_Return)  # back to the camera
    assert w.mode == "live"


def test_the_log_has_the_confidence_and_a_weak_verdict(qtbot, make_demo, data, caplog):
    """Staff read the number and a weak calibration in the log; visitors read plain words."""
    from dataclasses import replace

    from museum_search.core.answer._verdict import Verdict
    from museum_search.core.index._store import Index

    caplog.set_level(logging.INFO, logger="museum_search.gui.demo_window")
    index = Index.load(data.index.path)  # its own object: the session's index stays as it is
    verdict = Verdict.of_index(index)
    weak = {**(verdict.operating_point or {}), "known_accepted": 0.32, "unknown_rejected": 0.96, "known": 50,
            "unknown": 50, "source": "synthetic views"}
    index.verdict = replace(verdict, operating_point=weak).to_dict()
    warning = Verdict.of_index(index).warning()
    assert warning is not None
    w = make_demo(index, data.known, steady_seconds=0.3, result_seconds=60)
    _wait_mode(qtbot, w, "result")
    assert any(r.levelno == logging.WARNING and warning in r.getMessage() for r in caplog.records)
    answer = w.last_recognition.answer
    assert answer.in_collection and answer.confidence is not None
    found = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kiosk: recognised")]
    assert found and f"confidence {answer.confidence:.3f}; {answer.reason}" in found[-1]
    assert _text(w, "demoConfidence") == confidence_words(answer.confidence)
    assert f"{answer.confidence:.3f}" not in _visible_text(w) and warning not in _visible_text(w)


def test_escape_does_nothing_only_the_exit_combination_leaves(qtbot, make_demo, data):
    """Locked by default (tests/test_gui_kiosk_lock.py tests the rest): Esc does nothing, the
    default combination Ctrl+Shift+Q leaves; a combination set in Settings replaces it."""
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    default = make_demo(data.index, data.known, steady_seconds=60)
    qtbot.keyClick(default, Qt.Key.Key_Escape)
    qtbot.keyClick(default, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    assert default.isVisible() and default.camera_view.is_running()
    qtbot.keyClick(default, Qt.Key.Key_Q, ctrl_shift)
    assert not default.isVisible() and not default.camera_view.is_running()

    chosen = make_demo(data.index, data.known, exit_keys="Ctrl+Alt+K", steady_seconds=60)
    qtbot.keyClick(chosen, Qt.Key.Key_Escape)
    qtbot.keyClick(chosen, Qt.Key.Key_Q, ctrl_shift)
    assert chosen.isVisible()
    qtbot.keyClick(chosen, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier)
    assert not chosen.isVisible()


def _assert_for_visitors(text: str, *details: str) -> None:
    for word in TECHNICIAN_WORDS + details:
        assert word not in text, f"{word!r} shown to visitors: {text!r}"


def test_no_camera_asks_for_staff_and_logs_the_details(qtbot, make_demo, data, caplog):
    caplog.set_level(logging.INFO, logger=demo_window.__name__)
    missing = 0 if not list_cameras(1) else 63
    w = make_demo(data.index, camera=missing)  # the default factory: OpenCV webcams
    assert w.camera_factory is OpenCVCamera
    _wait_mode(qtbot, w, "error")
    assert w.problem() == "camera" and w.message_page.isVisible()
    shown = _visible_text(w)
    assert ASK_STAFF in shown and "camera" in shown  # who to ask, and what is wrong, in plain words
    # the technician's details (camera number, the camera's own message) are in the log only
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"camera {missing} cannot be used" in logged and f"No camera found at number {missing}" in logged
    _assert_for_visitors(shown, "No camera found", f" {missing}")

    # a touch on "try again" is answered at once: a ring, then "Trying again…" in place of the message
    before = w.grab().toImage()
    qtbot.mouseClick(w, Qt.MouseButton.LeftButton, pos=QPoint(200, 150))
    assert w.ripple.active() and w.ripple.touches == 1
    assert w.mode == "retrying" and _message(w).startswith(TRYING_AGAIN)
    assert w.message_page.isVisible() and TRYING_AGAIN in _visible_text(w)
    assert w.grab().toImage() != before  # what the visitor sees has changed
    # the camera is still missing: after "Trying again…" has been seen, the message says it was tried
    _wait_mode(qtbot, w, "error")
    assert w.problem() == "camera" and "tried again" in _message(w)
    assert ASK_STAFF in _visible_text(w)
    _assert_for_visitors(_visible_text(w), "No camera found")


def test_a_failed_look_up_says_try_again_and_a_touch_goes_back_to_the_camera(qtbot, make_demo, data, caplog,
                                                                             monkeypatch):
    secret = "RuntimeError: descriptor buffer 0x7f overflowed"

    def broken(pipeline, frame):
        raise RuntimeError(secret)

    monkeypatch.setattr(demo_window, "_recognize", broken)
    caplog.set_level(logging.INFO, logger=demo_window.__name__)
    w = make_demo(data.index, data.known, steady_seconds=60)
    _wait_mode(qtbot, w, "live")
    qtbot.waitUntil(lambda: w.camera_view.latest_frame() is not None, timeout=TIMEOUT)
    qtbot.mouseClick(w, Qt.MouseButton.LeftButton)
    _wait_mode(qtbot, w, "error")
    assert w.problem() == "lookup" and LOOKUP_FAILED in _visible_text(w)
    _assert_for_visitors(_visible_text(w), secret, "0x7f")
    assert any(secret in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    qtbot.mouseClick(w, Qt.MouseButton.LeftButton)  # the kiosk itself works: straight back to the camera
    assert w.mode == "live" and _text(w, "demoHint") == HINT


def test_every_touch_is_answered_even_while_busy(qtbot, make_demo, data):
    w = make_demo(data.index, data.known, steady_seconds=60)
    _wait_mode(qtbot, w, "starting", "live")
    for n in (1, 2):
        qtbot.mouseClick(w.camera_view.view, Qt.MouseButton.LeftButton, pos=QPoint(40, 40))
        assert w.ripple.active() and w.ripple.touches == n
        assert w.ripple.isVisible()
    qtbot.keyClick(w, Qt.Key.Key_Space)
    assert w.ripple.touches == 3
    qtbot.waitUntil(lambda: not w.ripple.active(), timeout=5000)
    assert not w.ripple.isVisible()


def test_full_screen_fills_the_screen(qtbot, make_demo, data):
    w = make_demo(data.index, data.known, steady_seconds=60)
    assert w.geometry() != w.screen().geometry()  # 1280×720 in a window first
    w.showFullScreen()
    qtbot.waitUntil(lambda: w.isFullScreen(), timeout=5000)
    assert w.geometry() == w.screen().geometry()


KIOSK_WITHOUT_WM = """
import sys
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

app = QApplication([])
from museum_search.gui import workers
from museum_search.gui.demo_window import DemoWindow
from museum_search.gui.state import Settings


def no_camera(number):
    raise OSError("no camera in this test")


w = DemoWindow(None, Settings(QSettings(sys.argv[1], QSettings.Format.IniFormat)), no_camera)
w.showFullScreen()


def report():
    print("window", *w.geometry().getRect(), "screen", *w.screen().geometry().getRect(), flush=True)
    w.shutdown()
    app.quit()


QTimer.singleShot(1500, report)
app.exec()
workers.wait_all(10000)
"""


@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs xvfb-run (an X server without a window manager)")
def test_full_screen_without_a_window_manager(tmp_path):
    """A bare X session (Xvfb, no window manager): nobody acts on the full-screen request, so the
    kiosk sizes itself to the screen (it used to open as a small window in a corner)."""
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb"}
    proc = subprocess.run(
        ["xvfb-run", "-a", "-s", "-screen 0 1024x700x24", sys.executable, "-c", KIOSK_WITHOUT_WM,
         str(tmp_path / "settings.ini")],
        capture_output=True, text=True, timeout=180, env=env, cwd=Path(__file__).resolve().parents[1],
        check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("window")), None)
    assert line is not None, proc.stdout + proc.stderr
    assert line == "window 0 0 1024 700 screen 0 0 1024 700"


def test_the_sorry_card_shows_the_phone_link(qtbot, make_demo, data):
    """Issue 35: the phone link wherever a visitor may need it, "not in this collection" included;
    a found object's card has none."""
    from museum_search.gui.demo_window import PHONE_TRY

    w = make_demo(data.index, data.unknown, steady_seconds=0.3, result_seconds=60)
    w.set_phone_link("http://192.168.1.20:8000/")
    _wait_mode(qtbot, w, "unknown", "result")
    assert w.mode == "unknown"
    panel = w.card_page.phone_qr
    assert panel.isVisible() and panel.caption.text() == PHONE_TRY
    rect = QRect(panel.mapTo(w, panel.rect().topLeft()), panel.size())
    assert w.rect().contains(rect)
    for lab in (w.card_page.title, w.card_page.description, w.card_page.footer):
        assert not QRect(lab.mapTo(w, lab.rect().topLeft()), lab.size()).intersects(rect), lab.text()
    w.grab().save("/tmp/demo_unknown_qr.png")


def test_a_found_objects_card_has_no_phone_link(qtbot, make_demo, data):
    w = make_demo(data.index, data.known, steady_seconds=0.3, result_seconds=60)
    w.set_phone_link("http://192.168.1.20:8000/")
    _wait_mode(qtbot, w, "result", "unknown")
    assert w.mode == "result" and not w.card_page.phone_qr.isVisible()
