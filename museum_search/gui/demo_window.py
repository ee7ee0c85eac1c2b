"""The museum demo (kiosk): a full-screen live camera that tells visitors what they show it.

A visitor holds an object (a postcard, a catalogue page, the painting itself) in front of the
camera. Recognition starts when the picture has been steady for ``steady_seconds``, or at once
when the visitor touches (clicks) the screen or presses Space/Enter. The answer is a large card
with the reference photo of the matched object and its catalogue entry (title, artist, year,
description, the evidence), or a friendly "not in this collection" card exactly when the query
pipeline's answer says so (:attr:`museum_search.core.query.Answer.in_collection`: verified and
calibrated per index, the same answer as the Search tab and ``museum-search query``). The card
goes away after ``result_seconds`` or on a touch.

Everything slow runs off the GUI thread through :func:`museum_search.gui.workers.start`: the
query pipeline (and its descriptor model) is built once at start-up ("Getting ready…"), then each
recognition answers one frame (:func:`query_from_array`, :meth:`QueryPipeline.answer`) and loads
the matched reference photo.

Auto-triggering rules (so the kiosk does not chatter):

* a still scene triggers once; it triggers again only after the picture changed (the visitor
  moved the object or took it away);
* a still scene that looks like one that was already found "not in the collection" (typically
  the empty background once the visitor has gone) does not trigger by itself again.

Leaving: Esc, unless the setting ``demo/exit_keys`` holds a key combination (e.g.
``Ctrl+Shift+Q``); then Esc does nothing, only that combination closes the window, and close
requests from the window system (Alt+F4, the title bar) are refused.

Full screen: :meth:`DemoWindow.showFullScreen` also sizes the window to its screen, so the kiosk
fills the screen in a bare X session without a window manager (where nobody acts on the
full-screen request), and follows the screen when its resolution changes.

Who reads what: the visitor sees plain words only (:data:`ASK_STAFF` when the camera is missing or
the kiosk cannot start, :data:`LOOKUP_FAILED` when one look-up failed); the technician's details
(camera number, the exception) go to the ``museum_search.gui.demo_window`` logger. Every touch gets
a visible answer: a ring where the screen was touched, and a change of state where there is one
(a touch on a problem screen shows :data:`TRYING_AGAIN` for at least
:attr:`DemoWindow.RETRY_MIN_MS` before it says whether that helped).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import cv2
import numpy as np
from PySide6.QtCore import (
    QElapsedTimer,
    QEvent,
    QKeyCombination,
    QPointF,
    QRect,
    QRectF,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QKeySequence,
    QPainter,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QStackedLayout,
    QVBoxLayout,
    QWidget,
)

from ..core.capture import STEADY_THRESHOLD, CameraSource, OpenCVCamera, is_steady
from ..core.errors import ImageError
from ..core.images import load_image
from ..core.query import Answer, QueryPipeline, QuerySettings, Result, query_from_array
from . import workers
from .state import Settings
from .widgets.camera_view import CameraView, ImageView

log = logging.getLogger(__name__)

__all__ = ["ASK_STAFF", "EXIT_KEYS_SETTING", "GETTING_READY", "HINT", "LOOKUP_FAILED", "NOT_IN_COLLECTION",
           "TRYING_AGAIN", "DemoWindow"]

#: Settings key of the key combination that closes the kiosk (empty: Esc closes it).
EXIT_KEYS_SETTING = "demo/exit_keys"
HINT = "Hold the object steady in front of the camera, or touch the screen"
GETTING_READY = "Getting ready…"
LOOKING = "Looking it up…"
NOT_IN_COLLECTION = "Sorry — this object is not in this collection"
NOT_IN_COLLECTION_BODY = ("We could not find it among the objects of this exhibition. Try another "
                          "object, or hold this one a little closer and steadier.")
CONTINUE = "Touch the screen to continue"
TRY_AGAIN = "Touch the screen to try again"
# what visitors read when something is wrong (the details go to the log, for the technician)
ASK_STAFF = "Please ask a member of staff"
CAMERA_DOWN = "The camera of this screen is not working right now."
CAMERA_STILL_DOWN = "We tried again, but the camera is still not working."
NOT_READY = "This screen is not ready right now."
STILL_NOT_READY = "We tried again, but this screen is still not ready."
LOOKUP_FAILED = "Sorry, that did not work"
LOOKUP_FAILED_BODY = "Please try again, holding the object still in front of the camera."
TRYING_AGAIN = "Trying again…"
TRYING_AGAIN_BODY = "One moment, please."
PHOTO_MISSING = "Photo not available"
#: problem → (headline, detail, detail after a touch did not help)
_PROBLEMS = {
    "camera": (ASK_STAFF, CAMERA_DOWN, CAMERA_STILL_DOWN),
    "setup": (ASK_STAFF, NOT_READY, STILL_NOT_READY),
    "lookup": (LOOKUP_FAILED, LOOKUP_FAILED_BODY, LOOKUP_FAILED_BODY),
}
#: Longest side of the reference photo shown on the result card.
PHOTO_SIDE = 1600

_BG = "#101114"
_CARD = "#1c1d22"
_TEXT = "#f3f1ec"
_MUTED = "#b9b6ae"
_ACCENT = "#e8b45a"
_SORRY = "#ff9e80"
_GOOD = "#7fd39b"


@dataclass
class _Recognition:
    answer: Answer  # the query pipeline's answer about the frame
    photo: np.ndarray | None  # the matched reference (None when not found or unreadable)
    frame: np.ndarray  # what the camera saw
    seconds: float
    photo_error: str | None = None

    @property
    def found(self) -> bool:
        return self.answer.in_collection

    @property
    def results(self) -> list[Result]:
        return self.answer.results


def _recognize(pipeline: QueryPipeline, frame: np.ndarray) -> _Recognition:
    """Answer ``frame`` and load the matched photo; on a worker thread (one call per step)."""
    t0 = time.perf_counter()
    (answer,) = pipeline.answer([query_from_array(frame, "camera")])
    photo, photo_error = None, None
    if answer.in_collection:
        try:
            photo = load_image(answer.top.abspath, max_side=PHOTO_SIDE)
        except ImageError as exc:
            photo_error = exc.reason
        except OSError as exc:
            photo_error = str(exc)
    return _Recognition(answer, photo, frame, time.perf_counter() - t0, photo_error)


def _meta(result: Result, key: str) -> str:
    for k, v in (result.metadata or {}).items():
        if k.strip().lower() == key and v:
            return str(v).strip()
    return ""


def _small(frame: np.ndarray) -> np.ndarray:
    """A 128×96 copy of a camera frame for :func:`is_steady` (which compares at 64×48)."""
    return cv2.resize(frame, (128, 96), interpolation=cv2.INTER_AREA)


def _pretty_instance(instance: str) -> str:
    text = instance.replace("_", " ").replace("-", " ").strip()
    return text[:1].upper() + text[1:]


def _set_flag(label: QLabel, name: str, on: bool) -> None:
    """Set a property the style sheet selects on (``QLabel#x[name="true"]``) and restyle."""
    label.setProperty(name, on)
    label.style().unpolish(label)
    label.style().polish(label)


class _Countdown(QWidget):
    """A thin bar that empties while a card is shown (how long until the live view returns)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._total_ms = 0
        self._clock = QElapsedTimer()
        self._tick = QTimer(self, interval=50)
        self._tick.timeout.connect(self.update)
        self.setFixedHeight(8)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def start(self, total_ms: int) -> None:
        self._total_ms = max(1, int(total_ms))
        self._clock.start()
        self._tick.start()
        self.update()

    def stop(self) -> None:
        self._tick.stop()
        self._total_ms = 0

    def fraction(self) -> float:
        if not self._total_ms or not self._clock.isValid():
            return 0.0
        return max(0.0, 1.0 - self._clock.elapsed() / self._total_ms)

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        r = QRectF(self.rect())
        p.setBrush(QColor(255, 255, 255, 30))
        p.drawRoundedRect(r, r.height() / 2, r.height() / 2)
        f = self.fraction()
        if f > 0:
            p.setBrush(QColor(_ACCENT))
            p.drawRoundedRect(QRectF(r.x(), r.y(), r.width() * f, r.height()), r.height() / 2, r.height() / 2)
        p.end()


class _Ripple(QWidget):
    """A ring that grows and fades where the screen was touched: every touch is answered at once,
    even when it changes nothing else (the kiosk is busy, or getting ready)."""

    DURATION_MS = 450

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.setAttribute(Qt.WidgetAttribute.WA_NoSystemBackground, True)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.radius = 80
        self.touches = 0  # how many touches were answered
        self._pos = QPointF()
        self._clock = QElapsedTimer()
        self._tick = QTimer(self, interval=16)
        self._tick.timeout.connect(self._step)
        self.hide()

    def pulse(self, pos: QPointF) -> None:
        self.touches += 1
        self._pos = QPointF(pos)
        self._clock.start()
        self.setGeometry(self.parentWidget().rect())
        self.show()
        self.raise_()
        self._tick.start()
        self._repaint_ring()

    def active(self) -> bool:
        return self._tick.isActive()

    def _step(self) -> None:
        if self._clock.elapsed() >= self.DURATION_MS:
            self._tick.stop()
            self.hide()
        self._repaint_ring()

    def _repaint_ring(self) -> None:
        r = int(self.radius) + 8
        self.update(QRect(int(self._pos.x()) - r, int(self._pos.y()) - r, 2 * r, 2 * r))

    def paintEvent(self, event) -> None:
        if not self._clock.isValid():
            return
        t = min(1.0, self._clock.elapsed() / self.DURATION_MS)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        ring, fill = QColor(_ACCENT), QColor(_ACCENT)
        ring.setAlphaF(0.9 * (1.0 - t))
        fill.setAlphaF(0.25 * (1.0 - t))
        p.setPen(QPen(ring, max(3.0, self.radius / 12)))
        p.setBrush(fill)
        r = self.radius * (0.35 + 0.65 * t)
        p.drawEllipse(self._pos, r, r)
        p.end()


class _LivePage(QWidget):
    """The camera filling the page, a hint at the bottom and a status in the middle (overlays)."""

    def __init__(self, camera_view: CameraView, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(camera_view)
        self.hint = QLabel(HINT, self)
        self.hint.setObjectName("demoHint")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setWordWrap(True)
        self.status = QLabel("", self)
        self.status.setObjectName("demoStatus")
        self.status.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.status.hide()
        for w in (self.hint, self.status):
            w.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))
        self._place()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._place()

    def _place(self) -> None:
        w, h = self.width(), self.height()
        margin = max(16, h // 24)
        hw = min(w - 2 * margin, max(w * 3 // 4, 320))
        self.hint.setFixedWidth(hw)
        self.hint.adjustSize()
        self.hint.move((w - hw) // 2, h - margin - self.hint.height())
        self.hint.raise_()
        if not self.status.isHidden():
            self.status.setFixedWidth(max(1, min(w - 2 * margin, self.status.sizeHint().width())))
            self.status.adjustSize()
            self.status.move((w - self.status.width()) // 2, (h - self.status.height()) // 2)
            self.status.raise_()


class _CardPage(QWidget):
    """The answer: a photo on the left, the catalogue entry on the right, a countdown below."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("demoCard")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.photo = ImageView("", dark=True, alignment=Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.photo.setObjectName("demoPhoto")
        pal = self.photo.palette()
        pal.setColor(QPalette.ColorRole.Dark, QColor(_CARD))
        pal.setColor(QPalette.ColorRole.BrightText, QColor(_MUTED))
        self.photo.setPalette(pal)
        self.photo.setMinimumSize(QSize(200, 200))
        # a label on the picture itself (the visitor's own photo on the "not found" card)
        self.caption = QLabel("What the camera saw", self.photo)
        self.caption.setObjectName("demoCaption")
        self.caption.hide()
        self.photo.installEventFilter(self)
        self.verdict = QLabel("")
        self.verdict.setObjectName("demoVerdict")
        self.title = QLabel("")
        self.title.setObjectName("demoTitle")
        self.artist = QLabel("")
        self.artist.setObjectName("demoArtist")
        self.year = QLabel("")
        self.year.setObjectName("demoYear")
        self.description = QLabel("")
        self.description.setObjectName("demoDescription")
        self.confidence = QLabel("")
        self.confidence.setObjectName("demoConfidence")
        self.footer = QLabel(CONTINUE)
        self.footer.setObjectName("demoFooter")
        for lab in (self.verdict, self.title, self.artist, self.year, self.description, self.confidence,
                    self.footer, self.caption):
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.TextFormat.PlainText)
            lab.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.caption.setWordWrap(False)
        self.countdown = _Countdown()

        text = QVBoxLayout()
        text.setSpacing(12)
        text.addStretch(1)
        for lab in (self.verdict, self.title, self.artist, self.year):
            text.addWidget(lab)
        text.addSpacing(24)
        text.addWidget(self.description)
        text.addSpacing(24)
        text.addWidget(self.confidence)
        text.addStretch(2)
        text.addWidget(self.footer)

        row = QHBoxLayout()
        row.setSpacing(48)
        row.addWidget(self.photo, 11)
        row.addLayout(text, 9)
        self._outer = QVBoxLayout(self)
        self._outer.addLayout(row, 1)
        self._outer.addSpacing(16)
        self._outer.addWidget(self.countdown)

    def set_margins(self, m: int) -> None:
        self._outer.setContentsMargins(m, m, m, max(12, m // 2))

    def show_caption(self, visible: bool) -> None:
        self.caption.setVisible(visible)
        self.place_caption()

    def place_caption(self) -> None:
        """Put the caption in the bottom-left corner of the picture."""
        if self.caption.isHidden():
            return
        r = self.photo.image_rect()
        if r.isEmpty():
            self.caption.hide()
            return
        self.caption.adjustSize()
        m = max(8, int(r.height()) // 40)
        self.caption.move(int(r.left()) + m, int(r.bottom()) - m - self.caption.height())
        self.caption.raise_()

    def eventFilter(self, obj, event) -> bool:
        if obj is self.photo and event.type() == QEvent.Type.Resize:
            self.place_caption()
        return super().eventFilter(obj, event)


class _MessagePage(QWidget):
    """A full-screen message: a headline, a detail and what to do (errors, no camera)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.headline = QLabel("")
        self.headline.setObjectName("demoHeadline")
        self.detail = QLabel("")
        self.detail.setObjectName("demoDetail")
        self.action = QLabel(TRY_AGAIN)
        self.action.setObjectName("demoFooter")
        lay = QVBoxLayout(self)
        lay.addStretch(1)
        for lab in (self.headline, self.detail, self.action):
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.TextFormat.PlainText)
            lab.setAlignment(Qt.AlignmentFlag.AlignCenter)
            lab.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
            lay.addWidget(lab)
            lay.addSpacing(24)
        lay.addStretch(1)


class DemoWindow(QWidget):
    """The kiosk: see the module docstring. Show it with ``showFullScreen()``.

    ``camera_factory(number) -> CameraSource`` (default :class:`OpenCVCamera`) is called with
    ``settings.camera``. ``steady_seconds``: how long the picture must be still before it is
    recognized by itself; ``result_seconds``: how long a card stays; ``steady_threshold``: see
    :func:`museum_search.core.capture.is_steady`.
    """

    mode_changed = Signal(str)
    recognized = Signal(object)  # the list of Results (best first)

    MODES = ("starting", "live", "recognizing", "result", "unknown", "error", "retrying")
    #: A touch on a problem screen shows "Trying again…" at least this long (ms).
    RETRY_MIN_MS = 1200

    def __init__(self, index, settings: Settings, camera_factory=None, parent: QWidget | None = None, *,
                 steady_seconds: float = 1.0, result_seconds: float = 8.0,
                 steady_threshold: float = STEADY_THRESHOLD, max_fps: float = 24.0):
        super().__init__(parent)
        self.index = index
        self.settings = settings
        self.camera_factory = camera_factory or OpenCVCamera
        self.steady_seconds = float(steady_seconds)
        self.result_seconds = float(result_seconds)
        self.steady_threshold = float(steady_threshold)
        self.setObjectName("demoWindow")
        self.setWindowTitle("museum-search — demo")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        if parent is not None:
            self.setWindowFlag(Qt.WindowType.Window, True)  # always a window of its own
        self._apply_palette()

        self._mode = "starting"
        self._pipeline: QueryPipeline | None = None
        self._camera_error: str | None = None  # the technician's text of the last camera failure
        self._camera_ok = False  # the camera opened (and has not failed since)
        self._problem: str | None = None  # the problem shown: a key of _PROBLEMS
        self._pending_problem: str | None = None  # to show once "Trying again…" has been seen
        self._retry_clock = QElapsedTimer()
        self._fitted_screen = None  # the screen whose size the window follows (full screen)
        self._load_job: workers.Job | None = None
        self._job: workers.Job | None = None
        self._closing = False
        self._started_camera = False
        self.last_results: list[Result] = []
        self.last_recognition: _Recognition | None = None
        self.recognitions = 0
        # steadiness
        self._prev: np.ndarray | None = None
        self._prev_time = 0.0
        self._steady_since: float | None = None
        self._armed = True  # False after a trigger, until the scene changed
        self._trigger_ref: np.ndarray | None = None  # the frame of the last trigger
        self._quiet_ref: np.ndarray | None = None  # a still scene found "not in the collection"

        self.camera_view = CameraView(max_fps=max_fps, messages=False)  # the kiosk says what visitors read
        self.camera_view.setObjectName("demoCamera")
        view = self.camera_view.view
        pal = view.palette()  # black letterbox around the video, light messages
        pal.setColor(QPalette.ColorRole.Dark, QColor("#000000"))
        pal.setColor(QPalette.ColorRole.BrightText, QColor(_TEXT))
        view.setPalette(pal)
        self.camera_view.frame_shown.connect(self._on_frame)
        self.camera_view.failed.connect(self._camera_failed)
        self.camera_view.started.connect(self._camera_started)
        self.live_page = _LivePage(self.camera_view)
        self.card_page = _CardPage()
        self.message_page = _MessagePage()
        self._stack = QStackedLayout(self)
        self._stack.setContentsMargins(0, 0, 0, 0)
        for page in (self.live_page, self.card_page, self.message_page):
            self._stack.addWidget(page)
        for w in (self.camera_view, self.camera_view.view, self.live_page, self.card_page,
                  self.message_page, self.card_page.photo):
            w.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # keys always reach the window

        self.ripple = _Ripple(self)
        self._result_timer = QTimer(self, singleShot=True)
        self._result_timer.timeout.connect(self.back_to_live)
        self._problem_timer = QTimer(self, singleShot=True)  # shows _pending_problem
        self._problem_timer.timeout.connect(self._show_pending_problem)
        self._restyle()
        self._set_mode("starting")
        self._load_pipeline()

    # ---- public API ----------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """One of :attr:`MODES`: starting, live, recognizing, result, unknown, error, retrying."""
        return self._mode

    @property
    def exit_keys(self) -> QKeySequence | None:
        """The combination that closes the kiosk, or None (Esc closes it)."""
        value = self.settings.value(EXIT_KEYS_SETTING, "")
        if isinstance(value, (list, tuple)):  # QSettings splits "a, b" into a list
            value = ", ".join(str(v) for v in value)
        text = str(value or "").strip()
        if not text:
            return None
        seq = QKeySequence(text)
        if seq.isEmpty() or seq[0].key() == Qt.Key.Key_unknown:
            log.warning("ignoring the invalid demo exit keys %r (Esc leaves the demo)", text)
            return None
        return seq

    @property
    def last_answer(self) -> Answer | None:
        """The query pipeline's answer about the last recognized frame."""
        return self.last_recognition.answer if self.last_recognition is not None else None

    def recognize(self) -> bool:
        """Recognize the newest camera frame now (as a touch does). False when not possible."""
        return self._trigger(auto=False)

    def back_to_live(self) -> None:
        """Leave the card and show the camera again."""
        self._result_timer.stop()
        self.card_page.countdown.stop()
        if self._mode in ("result", "unknown"):
            self._steady_since = None  # a fresh still period is needed
            self._set_mode("live")

    def showFullScreen(self) -> None:
        """Full screen, with or without a window manager.

        A window manager acts on the full-screen request; without one (a bare X kiosk session)
        nobody does and the window would keep its own size, in a corner. So the window is also
        given its screen's geometry, and follows it when the screen's resolution changes."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is not None:
            if self._fitted_screen is not screen:
                if self._fitted_screen is not None:
                    self._fitted_screen.geometryChanged.disconnect(self._fit_screen)
                screen.geometryChanged.connect(self._fit_screen)
                self._fitted_screen = screen
            self.setGeometry(screen.geometry())
        super().showFullScreen()
        self.raise_()
        self.activateWindow()  # keyboard focus without a window manager (Esc, the exit keys)

    def _fit_screen(self, *_args) -> None:
        if self.isFullScreen() and self._fitted_screen is not None:
            self.setGeometry(self._fitted_screen.geometry())

    def shutdown(self) -> None:
        """Stop the camera, timers and background work (the window closes)."""
        self._closing = True
        self._result_timer.stop()
        self._problem_timer.stop()
        self.card_page.countdown.stop()
        self.camera_view.stop(message=None)
        for job in (self._job, self._load_job):
            if job is not None and job.running:
                job.cancel()

    def is_busy(self) -> bool:
        """True while a background job (model loading, recognition) runs."""
        return any(j is not None and j.running for j in (self._job, self._load_job))

    # texts shown (for tests and accessibility)
    def card_title_text(self) -> str:
        return self.card_page.title.text()

    def card_artist_text(self) -> str:
        return self.card_page.artist.text()

    def card_year_text(self) -> str:
        return self.card_page.year.text()

    def card_description_text(self) -> str:
        return self.card_page.description.text()

    def card_confidence_text(self) -> str:
        return self.card_page.confidence.text()

    def card_verdict_text(self) -> str:
        return self.card_page.verdict.text()

    def card_has_photo(self) -> bool:
        return self.card_page.photo.has_image()

    def hint_text(self) -> str:
        return self.live_page.hint.text()

    def status_text(self) -> str:
        return self.live_page.status.text() if not self.live_page.status.isHidden() else ""

    def message_text(self) -> str:
        """Headline and detail of the full-screen message (error and retrying modes)."""
        page = self.message_page
        return "\n".join(t for t in (page.headline.text(), page.detail.text()) if t)

    def problem(self) -> str | None:
        """The problem shown or last shown: "camera", "setup", "lookup" (None: none yet)."""
        return self._problem

    def visible_text(self) -> str:
        """Everything a visitor can read now (labels shown, texts painted in the pictures)."""
        texts = [lab.text() for lab in self.findChildren(QLabel) if lab.text() and lab.isVisibleTo(self)]
        for view in (self.camera_view.view, self.card_page.photo):
            if view.isVisibleTo(self) and view.message():
                texts.append(view.message())
        return "\n".join(texts)

    # ---- start-up ------------------------------------------------------------------------
    def _load_pipeline(self) -> None:
        index, settings = self.index, QuerySettings(k=max(1, int(self.settings.top_k)), per_instance=True)

        def done(pipeline: QueryPipeline) -> None:
            self._pipeline = pipeline
            if self._mode == "starting":
                self._set_mode("live")
            elif self._mode == "retrying":
                self._retry_succeeded()

        def failed(exc: BaseException) -> None:
            log.error("kiosk: the query pipeline of the index %s could not be built: %s",
                      getattr(index, "path", None), workers.error_message(exc))  # traceback: debug level
            self._show_problem("setup")

        self._load_job = workers.start(lambda: QueryPipeline(index, settings), on_result=done, on_error=failed)

    def _start_camera(self) -> None:
        self._started_camera = True
        self._camera_error = None
        self._camera_ok = False
        self._prev = None
        self._steady_since = None
        number = self.settings.camera
        try:
            source: CameraSource = self.camera_factory(number)
        except Exception as exc:  # noqa: BLE001 - a factory failure is a camera failure
            log.debug("kiosk: the camera factory failed for camera %s", number, exc_info=exc)
            self._camera_failed(workers.error_message(exc))
            return
        self.camera_view.start(source)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._started_camera and not self._closing:
            self._start_camera()
        self.setFocus(Qt.FocusReason.OtherFocusReason)

    # ---- modes ---------------------------------------------------------------------------
    def _set_mode(self, mode: str) -> None:
        assert mode in self.MODES, mode
        self._mode = mode
        live = self.live_page
        if mode in ("starting", "live", "recognizing"):
            self._stack.setCurrentWidget(live)
            live.hint.setText(GETTING_READY if mode == "starting" else HINT)
            live.set_status({"starting": GETTING_READY, "recognizing": LOOKING}.get(mode, ""))
            live.hint.setVisible(mode == "live")
        elif mode in ("result", "unknown"):
            self._stack.setCurrentWidget(self.card_page)
        else:
            self._stack.setCurrentWidget(self.message_page)
        self.mode_changed.emit(mode)

    def _show_problem(self, kind: str) -> None:
        """Tell the visitor that something is wrong, in plain words (``kind``: a key of
        ``_PROBLEMS``; the caller has logged the details). After a touch on a problem screen the
        answer waits until "Trying again…" has been seen."""
        if self._closing:
            return
        if self._mode == "retrying":
            if self._pending_problem is None or kind != "lookup":
                self._pending_problem = kind
            self._problem_timer.start(max(0, self.RETRY_MIN_MS - self._retry_clock.elapsed()))
            return
        self._show_message(kind, retried=False)

    def _show_pending_problem(self) -> None:
        kind, self._pending_problem = self._pending_problem, None
        if kind is not None and self._mode == "retrying" and not self._closing:
            self._show_message(kind, retried=True)

    def _show_message(self, kind: str, retried: bool) -> None:
        self._result_timer.stop()
        self.card_page.countdown.stop()
        headline, detail, detail_again = _PROBLEMS[kind]
        self._problem = kind
        page = self.message_page
        page.headline.setText(headline)
        page.detail.setText(detail_again if retried else detail)
        page.action.setText(TRY_AGAIN)
        self._set_calm(False)
        self._set_mode("error")

    def _retry(self) -> None:
        """A touch on a problem screen: say "Trying again…" and start again what is not working."""
        if self._problem == "lookup" and self._pipeline is not None and self._camera_ok:
            self._set_mode("live")  # one look-up failed; the kiosk itself works
            return
        self._pending_problem = None
        self._retry_clock.start()
        page = self.message_page
        page.headline.setText(TRYING_AGAIN)
        page.detail.setText(TRYING_AGAIN_BODY)
        page.action.setText("")
        self._set_calm(True)
        self._set_mode("retrying")
        if self._pipeline is None and (self._load_job is None or not self._load_job.running):
            self._load_pipeline()
        if not self._camera_ok:
            self._start_camera()  # a failure comes back through _camera_failed
        self._retry_succeeded()

    def _retry_succeeded(self) -> None:
        """Leave "Trying again…" once the camera works (for the look-up: and the pipeline)."""
        if self._mode != "retrying" or not self._camera_ok or self._pending_problem is not None:
            return
        self._problem_timer.stop()
        self._set_mode("live" if self._pipeline is not None else "starting")

    # ---- camera --------------------------------------------------------------------------
    def _camera_started(self, name: str) -> None:
        log.info("kiosk: camera %s (%s) opened", self.settings.camera, name)
        self._camera_ok = True
        self._retry_succeeded()

    def _camera_failed(self, text: str) -> None:
        self._camera_error = text
        self._camera_ok = False
        self._prev = None
        self._steady_since = None
        if self._closing:
            return
        log.error("kiosk: camera %s cannot be used: %s", self.settings.camera, text)
        self._show_problem("camera")

    def _on_frame(self) -> None:
        full = self.camera_view.latest_frame()
        if full is None:
            return
        frame = _small(full)  # compared several times: shrink once
        now = time.monotonic()
        thr = self.steady_threshold
        if not self._armed and (self._trigger_ref is None or not is_steady(self._trigger_ref, frame, thr)):
            self._armed = True  # the scene changed since the last recognition
        if is_steady(self._prev, frame, thr):
            if self._steady_since is None:
                self._steady_since = self._prev_time
        else:
            self._steady_since = None
        self._prev, self._prev_time = frame, now
        if (self._mode == "live" and self._armed and self._steady_since is not None
                and now - self._steady_since >= self.steady_seconds):
            if self._quiet_ref is not None and is_steady(self._quiet_ref, frame, thr):
                return  # the background (or an object already reported unknown): stay quiet
            self._trigger(auto=True)

    # ---- recognition ---------------------------------------------------------------------
    def _trigger(self, auto: bool) -> bool:
        if self._mode != "live" or self._pipeline is None or self._closing:
            return False
        if self._job is not None and self._job.running:
            return False
        frame = self.camera_view.latest_frame()
        if frame is None:
            return False
        self._armed = False
        self._trigger_ref = _small(frame)
        self._steady_since = None
        pipeline = self._pipeline
        self._set_mode("recognizing")
        self._job = workers.start(lambda: _recognize(pipeline, frame), on_error=self._recognition_failed,
                                  on_result=lambda rec, auto=auto: self._recognized(rec, auto))
        return True

    def _recognized(self, rec: _Recognition, auto: bool) -> None:
        self._job = None  # its answer is here: a touch may start the next one before the worker winds down
        if self._closing:
            return
        self.recognitions += 1
        self.last_recognition = rec
        self.last_results = list(rec.results)
        if rec.found:
            self._quiet_ref = None
            self._fill_result_card(rec)
            mode = "result"
        else:
            if auto:
                self._quiet_ref = _small(rec.frame)
            self._fill_unknown_card(rec)
            mode = "unknown"
        self._set_mode(mode)
        self._result_timer.start(max(1, int(self.result_seconds * 1000)))
        self.card_page.countdown.start(self._result_timer.interval())
        self.recognized.emit(list(rec.results))

    def _recognition_failed(self, exc: BaseException) -> None:
        self._job = None
        if self._closing:
            return
        log.error("kiosk: a camera frame could not be looked up: %s", workers.error_message(exc))
        self._show_problem("lookup")

    def _fill_result_card(self, rec: _Recognition) -> None:
        c, best = self.card_page, rec.results[0]
        c.verdict.setText("We found it!")
        c.verdict.show()
        c.title.setText(_meta(best, "title") or _pretty_instance(best.instance))
        artist, year = _meta(best, "artist"), _meta(best, "year") or _meta(best, "date")
        c.artist.setText(artist)
        c.artist.setVisible(bool(artist))
        c.year.setText(year)
        c.year.setVisible(bool(year))
        description = _meta(best, "description")
        c.description.setText(description)
        c.description.setVisible(bool(description))
        n = rec.answer.top_inliers  # the object's evidence, as the verdict used it
        c.confidence.setText(f"Verified: {n} matching points" if n is not None
                             else f"Similarity {round(100 * max(0.0, best.cosine))} % (not verified)")
        c.confidence.setVisible(True)
        if rec.photo is not None:
            c.photo.set_image(rec.photo)
        else:
            log.warning("kiosk: the photo %s of %s cannot be shown: %s", best.abspath, best.instance,
                        rec.photo_error)
            c.photo.set_message(PHOTO_MISSING)
        c.show_caption(False)
        c.footer.setText(CONTINUE)
        self._set_sorry(False)

    def _fill_unknown_card(self, rec: _Recognition) -> None:
        c = self.card_page
        c.verdict.setText("")
        c.verdict.hide()
        c.title.setText(NOT_IN_COLLECTION)
        c.artist.setVisible(False)
        c.year.setVisible(False)
        c.description.setText(NOT_IN_COLLECTION_BODY)
        c.description.setVisible(True)
        c.confidence.setText("")
        c.confidence.setVisible(False)
        c.photo.set_image(rec.frame)  # what the camera saw
        c.show_caption(True)
        c.footer.setText(CONTINUE)
        self._set_sorry(True)

    def _set_sorry(self, sorry: bool) -> None:
        _set_flag(self.card_page.title, "sorry", sorry)

    def _set_calm(self, calm: bool) -> None:
        _set_flag(self.message_page.headline, "calm", calm)

    # ---- input ---------------------------------------------------------------------------
    def _touched(self, pos: QPointF | None = None) -> None:
        """Every touch: a ring where it landed, and what it means in the current mode."""
        self.ripple.pulse(QPointF(self.rect().center()) if pos is None else pos)
        if self._mode == "live":
            self._trigger(auto=False)
        elif self._mode in ("result", "unknown"):
            self.back_to_live()
        elif self._mode == "error":
            self._retry()

    def mousePressEvent(self, event) -> None:
        if event.button() in (Qt.MouseButton.LeftButton, Qt.MouseButton.RightButton):
            self._touched(event.position())
            event.accept()
            return
        super().mousePressEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.isAutoRepeat():
            event.accept()
            return
        seq = self.exit_keys
        combo = QKeyCombination(event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier, Qt.Key(event.key()))
        if seq is not None:
            if combo == seq[0]:
                self.close()
                event.accept()
                return
        elif event.key() == Qt.Key.Key_Escape:
            self.close()
            event.accept()
            return
        if event.key() in (Qt.Key.Key_Space, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self._touched()
        event.accept()  # nothing else: visitors' keys do nothing

    def closeEvent(self, event) -> None:
        if self.exit_keys is not None and event.spontaneous():
            event.ignore()  # Alt+F4 or the title bar: only the exit combination leaves the kiosk
            return
        self.shutdown()
        super().closeEvent(event)

    # ---- look ----------------------------------------------------------------------------
    def _apply_palette(self) -> None:
        pal = self.palette()
        for role, colour in ((QPalette.ColorRole.Window, _BG), (QPalette.ColorRole.WindowText, _TEXT),
                             (QPalette.ColorRole.Base, _BG), (QPalette.ColorRole.Text, _TEXT),
                             (QPalette.ColorRole.Dark, "#000000"), (QPalette.ColorRole.BrightText, _TEXT)):
            pal.setColor(role, QColor(colour))
        self.setPalette(pal)
        self.setAutoFillBackground(True)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._restyle()

    def _restyle(self) -> None:
        """Type sizes follow the window size (1 unit = 1 px on a 1080-px-high screen)."""
        u = max(0.45, min(self.width() / 1920, self.height() / 1080)) if self.height() > 0 else 0.6

        def px(n: float) -> int:
            return max(12, round(n * u))

        self.card_page.set_margins(px(72))
        self.ripple.radius = px(90)
        self.setStyleSheet(f"""
            QWidget#demoWindow {{ background: {_BG}; }}
            QWidget#demoCard {{ background: {_CARD}; }}
            QLabel {{ color: {_TEXT}; font-family: "DejaVu Sans", "Segoe UI", "Helvetica Neue", sans-serif; }}
            QLabel#demoHint {{ font-size: {px(40)}px; background: rgba(38, 39, 46, 215);
                               border: 1px solid rgba(255, 255, 255, 60);
                               border-radius: {px(24)}px; padding: {px(20)}px {px(36)}px; }}
            QLabel#demoStatus {{ font-size: {px(64)}px; font-weight: 600; background: rgba(38, 39, 46, 225);
                                 border: 1px solid rgba(255, 255, 255, 60);
                                 border-radius: {px(32)}px; padding: {px(32)}px {px(64)}px; }}
            QLabel#demoVerdict {{ font-size: {px(34)}px; color: {_GOOD}; font-weight: 600; }}
            QLabel#demoTitle {{ font-size: {px(76)}px; font-weight: 700; }}
            QLabel#demoTitle[sorry="true"] {{ color: {_SORRY}; font-size: {px(68)}px; }}
            QLabel#demoArtist {{ font-size: {px(44)}px; color: {_ACCENT}; }}
            QLabel#demoYear {{ font-size: {px(36)}px; color: {_MUTED}; }}
            QLabel#demoDescription {{ font-size: {px(32)}px; color: {_TEXT}; }}
            QLabel#demoConfidence {{ font-size: {px(30)}px; color: {_GOOD}; }}
            QLabel#demoCaption {{ font-size: {px(26)}px; color: {_TEXT}; background: rgba(16, 17, 20, 200);
                                  border-radius: {px(10)}px; padding: {px(8)}px {px(16)}px; }}
            QLabel#demoFooter {{ font-size: {px(28)}px; color: {_MUTED}; }}
            QLabel#demoHeadline {{ font-size: {px(84)}px; font-weight: 700; color: {_SORRY}; }}
            QLabel#demoHeadline[calm="true"] {{ color: {_ACCENT}; }}
            QLabel#demoDetail {{ font-size: {px(36)}px; }}
        """)
        self.live_page._place()
