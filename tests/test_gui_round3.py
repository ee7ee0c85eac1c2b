"""The app, round three (issue 35): Settings shows its messages whole, the window comes back on
the screen, paste says when there is nothing to paste, and the app remembers what it was showing."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRect, QSettings
from PySide6.QtWidgets import QDialog

from museum_search.gui import workers
from museum_search.gui.main_window import MainWindow, SettingsDialog
from museum_search.gui.state import AppState, Settings

pytestmark = pytest.mark.gui


def _state(tmp_path) -> AppState:
    return AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(_state(tmp_path))
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    assert workers.wait_all(60_000)


def _inside(widget, top) -> bool:
    """The whole of ``widget`` (at the height its wrapped text needs) is inside ``top``."""
    rect = QRect(widget.mapTo(top, widget.rect().topLeft()), widget.size())
    need = widget.heightForWidth(widget.width()) if widget.hasHeightForWidth() else widget.sizeHint().height()
    return top.rect().contains(rect) and widget.height() >= need


def test_settings_grow_to_show_why_ok_refused_and_never_cut_the_kiosk_help(qtbot, window):
    d = SettingsDialog(window.state, window)
    qtbot.addWidget(d)
    d.show()
    qtbot.waitExposed(d)
    assert "Ctrl+Shift+Q" in d.kiosk_help.text() and _inside(d.kiosk_help, d)
    height = d.height()
    d.qr_url.setText("http://127.0.0.1:8000/")  # this computer only: refused with a long message
    d.accept()
    assert d.result() != QDialog.DialogCode.Accepted and d.isVisible()
    assert d.qr_error.isVisible() and "this computer only" in d.qr_error.text()
    assert d.height() > height  # it grew ...
    for label in (d.qr_error, d.kiosk_help):  # ... so the message and the help show whole
        assert _inside(label, d), label.text()
    d.pin.setText("12")  # a PIN too short: the second message shows whole too
    d.accept()
    assert d.pin_error.isVisible() and _inside(d.pin_error, d) and _inside(d.qr_error, d)
    d.reject()


def test_paste_with_an_empty_clipboard_says_so(qtbot, window, sample_index):
    from PySide6.QtCore import QMimeData
    from PySide6.QtGui import QGuiApplication

    window.open_index(sample_index.path)
    window.tabs.setCurrentIndex(1)
    tab = window.search_tab
    QGuiApplication.clipboard().setMimeData(QMimeData())  # what an empty clipboard gives on X11: no data
    assert tab.paste() is False
    qtbot.waitUntil(lambda: tab.message.isVisible(), timeout=5000)
    assert "clipboard is empty" in tab.message.text()
    assert _inside(tab.message, window)
    # the clipboard holds text that names no image: that is said too
    QGuiApplication.clipboard().setText("hello")
    assert tab.paste() is False and "No image found" in tab.message.text() and tab.message.isVisible()
