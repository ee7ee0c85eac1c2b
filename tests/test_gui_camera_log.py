"""The camera's problem is logged once per process (issue 23, item 10): a kiosk without its camera,
touched to try again and again, says it once on stderr; the retries go to the debug log."""

from __future__ import annotations

import logging
import uuid

import pytest
from PySide6.QtCore import QPoint, QSettings, Qt

from museum_search.core.capture import OpenCVCamera, list_cameras, no_camera_message
from museum_search.gui import demo_window, workers
from museum_search.gui.demo_window import DemoWindow
from museum_search.gui.state import Settings

pytestmark = pytest.mark.gui

TIMEOUT = 120_000  # ms


def test_a_kiosk_retrying_a_missing_camera_logs_it_once(qtbot, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=demo_window.__name__)
    numbers = set(range(32, 64)) - set(list_cameras(0))
    missing = sorted(numbers)[uuid.uuid4().int % len(numbers)]  # a line no other test of this process logs
    settings = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    settings.camera = missing
    w = DemoWindow(None, settings, None)  # no index: only the camera is tried (and quickly)
    qtbot.addWidget(w)
    assert w.camera_factory is OpenCVCamera
    w.resize(1024, 700)
    w.show()
    qtbot.waitExposed(w)
    try:
        line = f"kiosk: camera {missing} cannot be used: {no_camera_message(missing)}"
        for touches in range(3):  # the first failure, then two touches on "try again"
            if touches:
                qtbot.waitUntil(lambda: w.mode == "error", timeout=TIMEOUT)  # "try again" is offered
                qtbot.mouseClick(w, Qt.MouseButton.LeftButton, pos=QPoint(200, 150))
                qtbot.waitUntil(lambda: w.mode == "retrying", timeout=TIMEOUT)
            qtbot.waitUntil(lambda n=touches + 1: sum(r.getMessage() == line for r in caplog.records) == n,
                            timeout=TIMEOUT)
        levels = [r.levelno for r in caplog.records if r.getMessage() == line]
        assert levels == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    finally:
        w.shutdown()
        qtbot.waitUntil(lambda: not w.is_busy(), timeout=TIMEOUT)
    assert workers.wait_all(TIMEOUT)
