"""Live camera preview: frames are captured on a worker thread, the GUI shows only the newest.

:class:`CameraWorker` (a ``QThread``) opens a :class:`~museum_search.core.capture.CameraSource`,
reads it at most ``max_fps`` times a second and keeps the newest frame in a one-frame slot. It
signals ``frame_ready`` only when the GUI has taken the previous frame, so a busy GUI never
builds up a queue of stale frames: frames it had no time for are simply dropped.

:class:`CameraView` shows the frames (an :class:`ImageView`, which paints an image scaled to fit,
aspect preserved) and a clear message when the camera cannot be used. A view that speaks to
someone else (the kiosk's visitors) passes ``messages=False``: the view then never paints the
camera's own status or error text (camera number, exception); it only signals ``failed`` and the
owner says what it wants to.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from PySide6.QtCore import QRectF, QSize, Qt, QThread, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

from museum_search.core.capture import CameraSource
from museum_search.gui.widgets.thumbnails import numpy_to_qimage
from museum_search.gui.workers import error_message

log = logging.getLogger(__name__)


class ImageView(QWidget):
    """Paints one image scaled to fit (aspect preserved, centred), or a message when it has none."""

    def __init__(self, placeholder: str = "", parent: QWidget | None = None,
                 alignment: Qt.AlignmentFlag = Qt.AlignmentFlag.AlignCenter, dark: bool = True):
        """``alignment`` places a letterboxed image; ``dark``: a dark backdrop around the image
        (video), else the window colour (a photo on the page). Messages always sit on the dark
        backdrop so that an empty view reads as a screen."""
        super().__init__(parent)
        self._alignment = alignment
        self._dark = dark
        self._image: QImage | None = None
        self._message = placeholder
        self._error = False
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumSize(160, 120)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent, True)

    def sizeHint(self) -> QSize:
        return QSize(480, 360)

    def set_image(self, image: np.ndarray | QImage | None) -> None:
        if isinstance(image, np.ndarray):
            image = numpy_to_qimage(image)
        self._image = image if image is not None and not image.isNull() else None
        self.update()

    def image(self) -> QImage | None:
        return self._image

    def has_image(self) -> bool:
        return self._image is not None

    def set_message(self, text: str, error: bool = False) -> None:
        """Show ``text`` instead of the image (the image is dropped)."""
        self._image = None
        self._message = text
        self._error = error
        self.setToolTip(text if error else "")
        self.update()

    def message(self) -> str:
        return "" if self._image is not None else self._message

    def image_rect(self) -> QRectF:
        """Where the image is drawn (empty without an image)."""
        if self._image is None:
            return QRectF()
        w, h = self._image.width(), self._image.height()
        scale = min(self.width() / w, self.height() / h)
        dw, dh = w * scale, h * scale
        a = self._alignment
        x = 0.0 if a & Qt.AlignmentFlag.AlignLeft else (self.width() - dw if a & Qt.AlignmentFlag.AlignRight
                                                        else (self.width() - dw) / 2)
        y = 0.0 if a & Qt.AlignmentFlag.AlignTop else (self.height() - dh if a & Qt.AlignmentFlag.AlignBottom
                                                       else (self.height() - dh) / 2)
        return QRectF(x, y, dw, dh)

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        backdrop = QPalette.ColorRole.Dark if self._dark or self._image is None else QPalette.ColorRole.Window
        p.fillRect(self.rect(), self.palette().color(backdrop))
        if self._image is not None:
            p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
            p.drawImage(self.image_rect(), self._image)
        elif self._message:
            colour = QColor("#ffb4a8") if self._error else self.palette().color(QPalette.ColorRole.BrightText)
            p.setPen(colour)
            font = p.font()
            font.setPointSizeF(font.pointSizeF() * 1.1)
            p.setFont(font)
            p.drawText(self.rect().adjusted(16, 16, -16, -16),
                       int(Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap), self._message)
        p.end()


class CameraWorker(QThread):
    """Reads a camera source on its own thread; the newest frame waits in a one-frame slot."""

    frame_ready = Signal()  # a new frame is waiting: take it with take_frame()
    opened = Signal(str)  # the source's name
    failed = Signal(str)  # a message for the user; the worker then ends

    def __init__(self, source: CameraSource, max_fps: float = 30.0, parent=None):
        super().__init__(parent)
        self.source = source
        self.max_fps = max(1.0, min(float(max_fps), 30.0))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._frame: np.ndarray | None = None
        self._pending = False
        self.frames_read = 0  # frames received from the source
        self.frames_taken = 0  # frames the GUI took (the rest were dropped)

    def stop(self) -> None:
        """Ask the loop to end (returns at once; ``wait()`` to join)."""
        self._stop.set()

    def take_frame(self) -> np.ndarray | None:
        with self._lock:
            frame, self._pending = self._frame, False
            if frame is not None:
                self.frames_taken += 1
            return frame

    def run(self) -> None:
        src = self.source
        try:
            try:
                src.open()
            except Exception as exc:
                log.debug("camera %r failed to open", src, exc_info=True)
                self.failed.emit(error_message(exc))
                return
            self.opened.emit(str(getattr(src, "name", "Camera")))
            period = 1.0 / self.max_fps
            next_due = 0.0
            while not self._stop.is_set():
                wait = next_due - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    break
                try:
                    frame = src.read()
                except Exception as exc:
                    log.debug("camera %r failed while reading", src, exc_info=True)
                    self.failed.emit(error_message(exc))
                    return
                if frame is None:
                    self._stop.wait(0.005)
                    continue
                next_due = time.monotonic() + period
                with self._lock:
                    self._frame = frame
                    self.frames_read += 1
                    notify = not self._pending
                    self._pending = True
                if notify:
                    self.frame_ready.emit()
        finally:
            try:
                src.close()
            except Exception:
                log.debug("closing camera %r failed", src, exc_info=True)


class CameraView(QWidget):
    """A live camera preview with ``start(source)``, ``stop()`` and ``latest_frame()``."""

    started = Signal(str)  # the camera opened (its name)
    stopped = Signal()  # the camera was stopped or failed
    failed = Signal(str)  # message shown in the view
    frame_shown = Signal()

    def __init__(self, parent: QWidget | None = None, max_fps: float = 30.0, messages: bool = True):
        """``messages=False``: the view paints frames only, never status or error text."""
        super().__init__(parent)
        self.max_fps = max_fps
        self.messages = messages
        self.view = ImageView("Camera off" if messages else "")
        self.view.setObjectName("cameraImage")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.view)
        self._worker: CameraWorker | None = None
        self._latest: np.ndarray | None = None
        self._source_name = ""
        self.frames_shown = 0

    # ---- control -------------------------------------------------------------------------
    def start(self, source: CameraSource) -> None:
        """Start showing ``source`` (stops the current camera first). Failures are shown in the view."""
        self.stop(message=None)
        self._latest = None
        self._source_name = str(getattr(source, "name", "camera"))
        self._say(f"Starting {self._source_name}…")
        w = CameraWorker(source, self.max_fps)
        w.frame_ready.connect(self._on_frame)
        w.opened.connect(self._on_opened)
        w.failed.connect(self._on_failed)
        w.finished.connect(lambda w=w: self._on_finished(w))
        self._worker = w
        w.start()

    def stop(self, message: str | None = "Camera off") -> None:
        """Stop the camera and wait for its thread (a frame period or so)."""
        w, self._worker = self._worker, None
        if w is None:
            return
        for sig in (w.frame_ready, w.opened, w.failed):
            try:
                sig.disconnect()
            except (RuntimeError, TypeError):
                pass
        w.stop()
        if not w.wait(5000):
            log.warning("the camera thread did not stop within 5 s")
        if message is not None:
            self._say(message)
        self.stopped.emit()

    def is_running(self) -> bool:
        return self._worker is not None

    def latest_frame(self) -> np.ndarray | None:
        """A copy of the newest frame received (None before the first one)."""
        return None if self._latest is None else self._latest.copy()

    def message(self) -> str:
        return self.view.message()

    # ---- worker callbacks (GUI thread) ---------------------------------------------------
    def _say(self, text: str, error: bool = False) -> None:
        """Show a status or error text in place of the picture (only with ``messages``)."""
        self.view.set_message(text if self.messages else "", error=error and self.messages)

    def _on_opened(self, name: str) -> None:
        self._say(f"{name}: waiting for the first image…")
        self.started.emit(name)

    def _on_frame(self) -> None:
        w = self.sender()
        if w is not self._worker or w is None:
            return
        frame = w.take_frame()
        if frame is None:
            return
        self._latest = frame
        self.view.set_image(frame)
        self.frames_shown += 1
        self.frame_shown.emit()

    def _on_failed(self, text: str) -> None:
        self._latest = None
        self._say(text, error=True)
        self.failed.emit(text)

    def _on_finished(self, w: CameraWorker) -> None:
        if w is self._worker:  # ended by itself (a failure), not by stop()
            self._worker = None
            self.stopped.emit()
        w.deleteLater()

    def closeEvent(self, event) -> None:
        self.stop(message=None)
        super().closeEvent(event)
