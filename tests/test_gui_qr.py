"""The kiosk's phone link: a QR code (segno) in the live view's corner, set in the Settings dialog.

What the camera of a phone sees is checked with OpenCV's QR decoder on the pixels Qt drew.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PySide6.QtCore import QRect, QSettings
from PySide6.QtGui import QImage

from museum_search.core.capture import FileSequenceCamera
from museum_search.gui import workers
from museum_search.gui.demo_window import HINT, PHONE_CAPTION, DemoWindow
from museum_search.gui.main_window import SettingsDialog
from museum_search.gui.state import QR_URL_SETTING, AppState, Settings, phone_link_problem
from museum_search.gui.widgets.qr_code import QUIET_ZONE, QrCode

pytestmark = pytest.mark.gui

URL = "http://192.168.1.20:8000/"
QUERY = Path(__file__).resolve().parents[1] / "resources" / "sample" / "queries"
TIMEOUT = 120_000  # ms


def _grey(image: QImage) -> np.ndarray:
    img = image.convertToFormat(QImage.Format.Format_Grayscale8)
    a = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine())
    return a[:, : img.width()].copy()


def _decode(image: QImage) -> str:
    text, _points, _ = cv2.QRCodeDetector().detectAndDecode(_grey(image))
    return text


def _settings(tmp_path: Path, url: str | None = None) -> Settings:
    s = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    if url is not None:
        s.set_value(QR_URL_SETTING, url)
    return s


@pytest.fixture
def make_kiosk(qtbot, tmp_path):
    """Kiosks (1600×900) on throw-away settings, with a replayed camera; shut down at the end."""
    made: list[DemoWindow] = []

    def make(index, url: str | None = None, **kwargs) -> DemoWindow:
        photo = sorted(QUERY.glob("*.jpg"))[0]
        w = DemoWindow(index, _settings(tmp_path, url),
                       lambda n: FileSequenceCamera([photo], fps=12, loop=True, max_side=960), **kwargs)
        qtbot.addWidget(w)
        w.resize(1600, 900)
        w.show()
        qtbot.waitExposed(w)
        made.append(w)
        return w

    yield make
    for w in made:
        w.shutdown()
        qtbot.waitUntil(lambda w=w: not w.is_busy(), timeout=TIMEOUT)
    assert workers.wait_all(TIMEOUT)


@pytest.mark.parametrize("side", [66, 100, 133, 240, 500])
def test_the_code_decodes_back_to_the_url_at_any_size(qtbot, side):
    code = QrCode(URL, side=side)
    qtbot.addWidget(code)
    image = code.image()
    n = code.modules()
    assert n and image.width() == image.height() and image.width() % n == 0  # whole pixels a module
    assert abs(image.width() - side) <= n // 2 + 1  # the nearest whole number of pixels a module
    grey = _grey(image)
    assert set(np.unique(grey)) == {0, 255}  # crisp: black and white only, never blurred
    quiet = grey.shape[0] * QUIET_ZONE // n
    assert (grey[:quiet] == 255).all() and (grey[-quiet:] == 255).all()  # the white quiet zone
    assert (grey[:, :quiet] == 255).all() and (grey[:, -quiet:] == 255).all()
    assert _decode(image) == URL
    code.set_data("https://museum.example/visit?lang=fr")
    assert _decode(code.image()) == "https://museum.example/visit?lang=fr"
    code.set_data("")
    assert code.modules() == 0 and code.image().isNull()


@pytest.mark.parametrize("url", [URL, "https://kiosk.local:8443/", "http://[fe80::1]:8000/", "  http://10.0.0.5/  "])
def test_phone_links_that_phones_can_open(url):
    assert phone_link_problem(url) == ""


@pytest.mark.parametrize("url, words", [
    ("192.168.1.20:8000", "http://"), ("ftp://192.168.1.20/", "http://"), ("http://", "http://"),
    ("http://192.168.1.20:99999/", "http://"), ("http://a b/", "http://"),
    ("http://127.0.0.1:8000/", "this computer only"), ("http://localhost:8000/", "this computer only"),
    ("http://0.0.0.0:8000/", "not an address a phone can open"),
])
def test_phone_links_that_cannot_be_used_say_why(url, words):
    problem = phone_link_problem(url)
    assert words in problem and "museum-search serve --host 0.0.0.0" in problem


def test_the_kiosk_shows_the_code_in_the_bottom_right_corner(qtbot, make_kiosk, sample_index):
    w = make_kiosk(sample_index, URL)
    panel = w.live_page.phone_qr
    qtbot.waitUntil(lambda: panel.isVisible())
    assert w.phone_link == URL and panel.caption.text() == PHONE_CAPTION == "Use your phone: scan me"
    rect = QRect(panel.mapTo(w, panel.rect().topLeft()), panel.size())
    code = QRect(panel.code.mapTo(w, panel.code.rect().topLeft()), panel.code.size())
    assert rect.right() > w.width() * 0.9 and rect.bottom() > w.height() * 0.9  # bottom-right
    assert rect.right() < w.width() and rect.bottom() < w.height()  # on the screen
    assert abs(code.height() - DemoWindow.QR_HEIGHT * w.height()) <= w.height() * 0.02  # about 12 %
    assert _decode(w.grab(code).toImage()) == URL  # what a phone sees on the screen
    hint = w.live_page.hint
    qtbot.waitUntil(lambda: w.mode == "live", timeout=TIMEOUT)
    assert hint.isVisible() and hint.text() == HINT
    assert not QRect(hint.mapTo(w, hint.rect().topLeft()), hint.size()).intersects(rect)
    w.set_phone_link("")
    assert not panel.isVisible() and w.phone_link == ""
    assert _decode(w.grab().toImage()) == ""


def test_no_setting_no_code(qtbot, make_kiosk, sample_index, tmp_path):
    w = make_kiosk(sample_index)
    assert not w.live_page.phone_qr.isVisible() and w.phone_link == ""
    assert _decode(w.grab().toImage()) == ""
    # a stored address phones cannot open shows no code either (and is logged)
    assert _settings(tmp_path, "http://localhost:8000/").demo_qr_url == ""


def test_a_portrait_screen_puts_the_code_above_the_hint(qtbot, make_kiosk, sample_index):
    w = make_kiosk(sample_index, URL)
    w.resize(900, 1600)
    panel, hint = w.live_page.phone_qr, w.live_page.hint
    qtbot.waitUntil(lambda: w.height() == 1600)
    where = panel.geometry()
    assert where.bottom() < hint.geometry().top()  # already while getting ready (the hint hidden)
    qtbot.waitUntil(lambda: w.mode == "live", timeout=TIMEOUT)
    assert hint.isVisible() and panel.geometry() == where and where.bottom() < hint.geometry().top()
    assert where.right() > w.width() * 0.9 and hint.width() >= 560
    assert _decode(w.grab().toImage()) == URL


def test_the_code_is_never_over_the_answer_card(qtbot, make_kiosk, sample_index):
    w = make_kiosk(sample_index, URL, steady_seconds=0.3, result_seconds=60)
    qtbot.waitUntil(lambda: w.mode in ("result", "unknown"), timeout=TIMEOUT)
    assert not w.live_page.phone_qr.isVisible()
    assert _decode(w.grab().toImage()) == ""
    w.back_to_live()
    assert w.live_page.phone_qr.isVisible()


def test_the_setting_round_trips_through_the_dialog(qtbot, tmp_path):
    state = AppState(_settings(tmp_path))
    d = SettingsDialog(state)
    qtbot.addWidget(d)
    assert d.qr_url.text() == "" and "192.168.1.20:8000" in d.qr_url.placeholderText()
    d.qr_url.setText("192.168.1.20:8000")  # no scheme: refused, with a hint, nothing saved
    d.camera.setValue(5)
    d.accept()
    assert d.result() != d.DialogCode.Accepted and d.qr_error.isVisibleTo(d)
    assert "http://" in d.qr_error.text() and state.settings.value(QR_URL_SETTING) is None
    assert state.settings.camera == 0
    d.qr_url.setText(f" {URL} ")
    assert not d.qr_error.isVisibleTo(d)  # typing clears the hint
    d.accept()
    assert d.result() == d.DialogCode.Accepted
    assert state.settings.value(QR_URL_SETTING) == URL and state.settings.demo_qr_url == URL
    again = SettingsDialog(state)
    qtbot.addWidget(again)
    assert again.qr_url.text() == URL  # shown again as saved
    again.qr_url.clear()
    again.accept()
    assert state.settings.value(QR_URL_SETTING) is None and state.settings.demo_qr_url == ""


def _no_camera(_number):
    raise OSError("no camera in this test")


@pytest.mark.parametrize("size", [(1024, 700), (1600, 1000)])
def test_without_a_camera_the_kiosk_shows_the_phone_link_under_its_message(qtbot, tmp_path, sample_index, size):
    """The camera fails: the message for visitors, and under it the phone link's QR code (readable,
    on the screen, clear of the words) — the moment visitors need their phones. A touch hides it
    while "Trying again…"; without a phone link there is none."""
    from museum_search.gui.demo_window import ASK_STAFF, PHONE_INSTEAD

    w = DemoWindow(sample_index, _settings(tmp_path, URL), _no_camera)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    try:
        page = w.message_page
        qtbot.waitUntil(lambda: w.mode == "error" and page.phone_qr.isVisible(), timeout=TIMEOUT)
        assert page.headline.text() == ASK_STAFF and page.phone_qr.caption.text() == PHONE_INSTEAD
        panel, code = page.phone_qr, page.phone_qr.code
        qtbot.waitUntil(lambda: _decode(w.grab(QRect(code.mapTo(w, code.rect().topLeft()), code.size())).toImage())
                        == URL, timeout=5000)  # once laid out: what a phone sees on the screen
        rect = QRect(panel.mapTo(w, panel.rect().topLeft()), panel.size())
        assert w.rect().contains(rect) and code.width() >= 96
        for lab in (page.headline, page.detail, page.action):
            assert not QRect(lab.mapTo(w, lab.rect().topLeft()), lab.size()).intersects(rect), lab.text()
        w.set_phone_link("")
        assert not panel.isVisible()
        w.set_phone_link(URL)
        assert panel.isVisible()
    finally:
        w.shutdown()
        qtbot.waitUntil(lambda: not w.is_busy(), timeout=TIMEOUT)


def test_without_a_camera_and_without_a_phone_link_no_code(qtbot, tmp_path, sample_index):
    w = DemoWindow(sample_index, _settings(tmp_path), _no_camera)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.mode == "error", timeout=TIMEOUT)
        assert not w.message_page.phone_qr.isVisible() and _decode(w.grab().toImage()) == ""
    finally:
        w.shutdown()
        qtbot.waitUntil(lambda: not w.is_busy(), timeout=TIMEOUT)
