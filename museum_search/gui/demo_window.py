"""The museum demo (kiosk): a full-screen live camera that tells visitors what they show it.

A visitor holds an object (a postcard, a catalogue page, the painting itself) in front of the
camera. Recognition starts when the picture has been steady for ``steady_seconds``, or at once
when the visitor touches (clicks) the screen or presses Space/Enter. The answer is a large card
with the reference photo of the matched object and its catalogue entry (title, artist, year,
description, and how sure the answer is in plain words: :func:`confidence_words`; the confidence as
a number and the verdict's reason go to the log), or a friendly "not in this collection" card exactly when the query
pipeline's answer says so (:attr:`museum_search.core.answer._pipeline.Answer.in_collection`: verified and
calibrated per index, the same answer as the Search tab and ``museum-search query``). When the
photo shows several objects of the collection (:attr:`Answer.objects`), the card says "2 objects in
this photo" and shows a card for each (:mod:`museum_search.gui.widgets.kiosk_objects`). The card
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

A locked kiosk: visitors cannot leave it. Esc does nothing (unless staff chose it as the exit
keys), close requests from the window system (Alt+F4, the title bar) and any other close that was
not authorised are refused, and while the kiosk runs it holds the screen: every other window of the
application (the admin window, dialogs, windows opened later) is hidden and shown again when staff
leave, the kiosk takes the activation back when another window of the application gets it (Alt+Tab
finds nothing of the application to switch to), and once shown full screen it stays full screen
(it comes back when the window manager minimizes it or takes the full-screen state away).

Leaving is for staff: the exit combination (setting ``demo/exit_keys``; empty:
:data:`DEFAULT_EXIT_KEYS`, Ctrl+Shift+Q) leaves at once when no staff PIN is set. With a PIN set
in Settings (:meth:`museum_search.gui.state.Settings.set_demo_pin`), the combination, or holding
the top-left corner of the screen for :attr:`DemoWindow.CORNER_HOLD_MS`, opens a PIN prompt with a
keypad (touch or keyboard); only the right PIN leaves. Wrong PINs keep the kiosk; after
:attr:`DemoWindow.PIN_MAX_TRIES` of them the prompt refuses for :attr:`DemoWindow.PIN_LOCK_SECONDS`.
:func:`lock_summary` says all this in plain words (the Settings dialog shows it).

The phone link: with a web address in the setting ``demo/qr_url`` (the page of ``museum-search
serve``), the live view shows it as a QR code in its bottom-right corner, about
:attr:`DemoWindow.QR_HEIGHT` of the screen high, captioned :data:`PHONE_CAPTION`, so visitors in a
queue can ask from their own phones. It is on the live view only, never over an answer card.

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
from dataclasses import dataclass, field

import cv2
import numpy as np
from PySide6.QtCore import (
    QElapsedTimer,
    QEvent,
    QKeyCombination,
    QLocale,
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
    QApplication,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QStackedLayout,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from museum_search.core.answer import Answer, QueryPipeline, QuerySettings, Result, confidence_band, query_from_array
from museum_search.core.capture import STEADY_THRESHOLD, CameraSource, OpenCVCamera, is_steady, log_camera_problem
from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.images import load_image
from museum_search.gui import workers
from museum_search.gui.state import Settings
from museum_search.gui.widgets.camera_view import CameraView, ImageView
from museum_search.gui.widgets.kiosk_objects import KioskObject, KioskObjects, load_object_photos
from museum_search.gui.widgets.qr_code import QrPanel

log = logging.getLogger(__name__)

__all__ = ["ASK_STAFF", "DEFAULT_EXIT_KEYS", "EXIT_KEYS_SETTING", "GETTING_READY", "HINT", "LOOKUP_FAILED",
           "NOT_IN_COLLECTION", "PHONE_CAPTION", "PIN_TITLE", "PIN_WRONG", "TRYING_AGAIN", "DemoWindow",
           "confidence_words", "exit_keys_from", "lock_summary"]

#: Settings key of the key combination with which staff leave the kiosk (empty: DEFAULT_EXIT_KEYS).
EXIT_KEYS_SETTING = "demo/exit_keys"
#: The exit combination when none is set: not one a visitor presses by chance (Esc does nothing).
DEFAULT_EXIT_KEYS = "Ctrl+Shift+Q"
# the staff PIN prompt
PIN_TITLE = "Staff only"
PIN_DETAIL = "Type the staff PIN to leave the kiosk."
PIN_WRONG = "Wrong PIN. The kiosk stays on."
PIN_LOCKED = "Too many wrong tries. Try again in a minute."
PIN_CANCEL = "Back to the kiosk"
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
#: Under the QR code of the phone link (setting ``demo/qr_url``).
PHONE_CAPTION = "Use your phone: scan me"
#: Under the phone link's QR code on the screen that says the camera is not working.
PHONE_INSTEAD = "Use your phone instead: scan me"
#: Under the phone link's QR code on the "not in this collection" card.
PHONE_TRY = "Try again from your phone: scan me"
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
    #: each object's reference photo when the photo shows several (Answer.objects; else empty)
    object_photos: list[np.ndarray | None] = field(default_factory=list)

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
    several = load_object_photos(answer.objects) if len(answer.objects) >= 2 else []
    return _Recognition(answer, photo, frame, time.perf_counter() - t0, photo_error, several)


def _recorded(rec: _Recognition, visitors) -> _Recognition:
    """``rec``, its answer counted (source "kiosk") and its frame kept as the policy of ``visitors``
    (the kiosk's VisitorLog, or None) says; on the worker. A failure goes to the log, never to the
    visitor, who gets the answer all the same."""
    try:
        if visitors is not None:
            visitors.record(rec.answer, source="kiosk", language=kiosk_language(), image=rec.frame)
    except Exception as exc:  # whatever went wrong, the visitor still gets the answer
        log.warning("kiosk: a visitor's question could not be recorded: %s", workers.error_message(exc))
    return rec


def kiosk_language() -> str:
    """The kiosk's language as counted and for its notice: the system's (e.g. "fr" from fr_FR; ""
    for the C locale: unknown, the notice then in English)."""
    lang = QLocale.system().name().split("_")[0].lower()
    return "" if lang in ("c", "posix") else lang


def _open_visitors(index, policy, folder: str):
    """The kiosk's visitor log with the ``policy`` and ``folder`` of Settings (on a worker); None when
    it counts and keeps nothing, or cannot be opened (the technician reads why in the log; the kiosk
    runs all the same)."""
    from museum_search.core.visitors import VisitorLog

    if getattr(index, "path", None) is None or (policy.keep == "none" and not policy.counting):
        return None
    try:
        return VisitorLog.open(index.path, policy, folder=folder or None)
    except (MuseumSearchError, OSError) as exc:
        log.error("kiosk: visitors' questions are not counted or kept: %s", workers.error_message(exc))
        return None


#: What a visitor reads under a recognised object, by the answer's confidence band (core's
#: :func:`confidence_band`, the same as the phone page's; a probability in words, never the number).
CONFIDENCE_WORDS = {"sure": "We are sure it is this one.", "likely": "It is very likely this one.",
                    "might": "It is probably this one."}


def confidence_words(confidence: float | None) -> str:
    """How sure the kiosk is of a recognised object, in plain words for visitors ("" when the
    answer has no confidence). The number itself goes to the technician's log."""
    band = confidence_band(confidence)
    return "" if band is None else CONFIDENCE_WORDS[band]


def _technician_verdict(answer: Answer) -> str:
    """The verdict for the log: the confidence as a number and the reason."""
    conf = "no confidence" if answer.confidence is None else f"confidence {answer.confidence:.3f}"
    return f"{conf}; {answer.reason}"


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


def exit_keys_from(settings: Settings) -> QKeySequence:
    """The exit combination set in ``settings`` (:data:`EXIT_KEYS_SETTING`), or
    :data:`DEFAULT_EXIT_KEYS` when none (or an unusable one) is set."""
    value = settings.value(EXIT_KEYS_SETTING, "")
    if isinstance(value, (list, tuple)):  # QSettings splits "a, b" into a list
        value = ", ".join(str(v) for v in value)
    text = str(value or "").strip()
    if text:
        seq = QKeySequence(text)
        if not seq.isEmpty() and seq[0].key() != Qt.Key.Key_unknown:
            return seq
        log.warning("ignoring the invalid demo exit keys %r (%s leaves the demo)", text, DEFAULT_EXIT_KEYS)
    return QKeySequence(DEFAULT_EXIT_KEYS)


def _easy_to_press(seq: QKeySequence) -> bool:
    """True when the first chord of ``seq`` needs no Ctrl, Alt or Meta (Esc, F12, a letter)."""
    mods = seq[0].keyboardModifiers() if not seq.isEmpty() else Qt.KeyboardModifier.NoModifier
    strong = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier | Qt.KeyboardModifier.MetaModifier
    return not (mods & strong)


def lock_summary(exit_keys: str, pin_set: bool) -> str:
    """What visitors and staff can do in the kiosk, in plain words, for the exit keys ``exit_keys``
    as typed in Settings (empty: the default) and whether a staff PIN is set."""
    text = exit_keys.strip()
    seq = QKeySequence(text) if text else QKeySequence(DEFAULT_EXIT_KEYS)
    if seq.isEmpty() or seq[0].key() == Qt.Key.Key_unknown:
        seq = QKeySequence(DEFAULT_EXIT_KEYS)
    keys = QKeySequence(seq[0]).toString(QKeySequence.SequenceFormat.NativeText)
    default = "" if text else " (the default while the field is empty)"
    lines = ["Visitors cannot leave the kiosk: Esc, Alt+F4 and Alt+Tab do nothing, and the other windows of "
             "this program stay hidden while it runs."]
    if pin_set:
        lines.append(f"Staff press {keys}{default}, or hold the top-left corner of the screen for "
                     f"{DemoWindow.CORNER_HOLD_MS // 1000} seconds, then type the PIN.")
    else:
        lines.append(f"Staff leave with {keys}{default}. Anyone who knows it can leave: set a PIN to ask for "
                     "one as well.")
        if _easy_to_press(seq):
            lines.append(f"Warning: {keys} alone is easy to press: any visitor with a keyboard can leave. Choose "
                         "a combination with Ctrl, or set a PIN.")
    return "\n".join(lines)


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
        self.phone_qr = QrPanel(PHONE_CAPTION, self)  # the phone link, bottom-right (hidden: none)
        self.notice = QLabel("", self)  # what is kept of visitors' photos, where keeping is on (top)
        self.notice.setObjectName("demoNotice")
        self.notice.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.notice.setWordWrap(True)
        self.notice.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.notice.hide()

    def set_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        self._place()

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
        qr = self.phone_qr
        # the hint, centred, narrows to stay clear of the QR code; where that leaves it too narrow
        # (a portrait screen), the QR code goes above it instead
        beside = 2 * (w - 2 * margin - qr.width() - w // 2) if not qr.isHidden() else hw
        self.hint.setFixedWidth(max(1, min(hw, beside)) if beside >= min(hw, 560) else hw)
        self.hint.adjustSize()
        self.hint.move((w - self.hint.width()) // 2, h - margin - self.hint.height())
        self.hint.raise_()
        if not qr.isHidden():
            above = beside < min(hw, 560)  # where the hint is (or will be), shown or not: it never jumps
            bottom = self.hint.y() - margin // 2 if above else h - margin
            qr.move(w - margin - qr.width(), bottom - qr.height())
            qr.raise_()
        if not self.notice.isHidden():  # one line where it fits (a word-wrapped label's hint is narrower)
            self.notice.setWordWrap(False)
            full = self.notice.sizeHint().width()
            self.notice.setWordWrap(True)
            self.notice.setFixedWidth(max(1, min(w - 2 * margin, full)))
            self.notice.adjustSize()
            self.notice.move((w - self.notice.width()) // 2, margin // 2)
            self.notice.raise_()
        if not self.status.isHidden():
            self.status.setFixedWidth(max(1, min(w - 2 * margin, self.status.sizeHint().width())))
            self.status.adjustSize()
            self.status.move((w - self.status.width()) // 2, (h - self.status.height()) // 2)
            self.status.raise_()


def _phone_panel(caption: str, name: str, parent: QWidget, align: Qt.AlignmentFlag) -> QrPanel:
    """The phone link's QR code and caption, both aligned ``align`` (shown where a visitor may need
    it: the camera-failure screen, the "not in this collection" card)."""
    panel = QrPanel(caption, parent)
    panel.setObjectName(name)
    for i in range(panel.layout().count()):
        panel.layout().itemAt(i).setAlignment(align)
    return panel


def _named_label(name: str) -> QLabel:
    label = QLabel("")
    label.setObjectName(name)
    return label


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
        (self.verdict, self.title, self.artist, self.year, self.description, self.confidence,
         self.footer) = (_named_label(name) for name in ("demoVerdict", "demoTitle", "demoArtist", "demoYear",
                                                          "demoDescription", "demoConfidence", "demoFooter"))
        self.footer.setText(CONTINUE)
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
        self.phone_qr = _phone_panel(PHONE_TRY, "cardQr", self, Qt.AlignmentFlag.AlignLeft)  # on "not in this collection"
        text.addWidget(self.phone_qr, 0, Qt.AlignmentFlag.AlignLeft)
        text.addStretch(2)
        text.addWidget(self.footer)

        self.single = QWidget()  # one object: its photo and catalogue entry
        row = QHBoxLayout(self.single)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(48)
        row.addWidget(self.photo, 11)
        row.addLayout(text, 9)
        self.several = KioskObjects()  # several objects in the photo: a card each
        self.several.hide()
        self._outer = QVBoxLayout(self)
        self._outer.addWidget(self.single, 1)
        self._outer.addWidget(self.several, 1)
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
        # the phone link, shown when the camera fails: then visitors can still ask from their phones
        self.phone_qr = _phone_panel(PHONE_INSTEAD, "messageQr", self, Qt.AlignmentFlag.AlignHCenter)
        lay.addWidget(self.phone_qr, 0, Qt.AlignmentFlag.AlignHCenter)
        lay.addStretch(1)


class _PinPrompt(QWidget):
    """The staff PIN prompt, over the whole kiosk (a child of it, not a window of its own): a title,
    dots for the digits typed, a message line and a keypad for touch screens. The kiosk checks the
    PIN (``submitted``); clicks on the prompt never reach the kiosk below."""

    submitted = Signal(str)
    cancelled = Signal()
    MAX_DIGITS = 12

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setObjectName("pinPrompt")
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self._digits = ""
        self.card = QFrame(self)
        self.card.setObjectName("pinCard")
        self.title = QLabel(PIN_TITLE)
        self.title.setObjectName("pinTitle")
        self.detail = QLabel(PIN_DETAIL)
        self.detail.setObjectName("pinDetail")
        self.dots = QLabel("")
        self.dots.setObjectName("pinDots")
        self.message = QLabel("")
        self.message.setObjectName("pinMessage")
        for lab in (self.title, self.detail, self.dots, self.message):
            lab.setAlignment(Qt.AlignmentFlag.AlignCenter)
            lab.setTextFormat(Qt.TextFormat.PlainText)
            lab.setWordWrap(True)
        self.keys: dict[str, QPushButton] = {}
        grid = QGridLayout()
        grid.setSpacing(12)
        labels = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "⌫", "0", "OK"]
        for i, text in enumerate(labels):
            b = QPushButton(text)
            b.setObjectName("pinOk" if text == "OK" else "pinKey")
            b.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # keys always reach the kiosk
            b.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
            b.clicked.connect(lambda _=False, t=text: self._pressed(t))
            self.keys[text] = b
            grid.addWidget(b, i // 3, i % 3)
        self.keys["⌫"].setAccessibleName("Delete")
        self.cancel_button = QPushButton(PIN_CANCEL)
        self.cancel_button.setObjectName("pinCancel")
        self.cancel_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.cancel_button.clicked.connect(self.cancel)
        lay = QVBoxLayout(self.card)
        lay.setSpacing(10)
        for w in (self.title, self.detail, self.dots, self.message):
            lay.addWidget(w)
        lay.addLayout(grid, 1)
        lay.addWidget(self.cancel_button)
        self._idle = QTimer(self, singleShot=True, interval=DemoWindow.PIN_IDLE_MS)
        self._idle.timeout.connect(self.cancel)  # a prompt nobody uses goes away by itself
        self.hide()

    def digits(self) -> str:
        return self._digits

    def open(self) -> None:
        self._digits = ""
        self._show_digits()
        self.setGeometry(self.parentWidget().rect())
        self.show()
        self.raise_()
        self._idle.start()

    def close_prompt(self) -> None:
        self._idle.stop()
        self._digits = ""
        self.message.setText("")
        self.hide()

    def cancel(self) -> None:
        if self.isVisible():
            self.close_prompt()
            self.cancelled.emit()

    def set_message(self, text: str) -> None:
        self.message.setText(text)

    def set_locked(self, locked: bool) -> None:
        for b in self.keys.values():
            b.setEnabled(not locked)

    def type_key(self, key: int, text: str) -> None:
        """A key press while the prompt is open (digits, Backspace, Enter, Esc)."""
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self._pressed("OK")
        elif key == Qt.Key.Key_Backspace:
            self._pressed("⌫")
        elif key == Qt.Key.Key_Escape:
            self.cancel()
        elif len(text) == 1 and text.isdigit():
            self._pressed(text)

    def _pressed(self, key: str) -> None:
        if not self.keys["0"].isEnabled():
            return  # locked after too many wrong tries
        self._idle.start()
        if key == "OK":
            pin, self._digits = self._digits, ""
            self._show_digits()
            if pin:
                self.submitted.emit(pin)
            return
        if key == "⌫":
            self._digits = self._digits[:-1]
        elif len(self._digits) < self.MAX_DIGITS:
            self._digits += key
        self.message.setText("")
        self._show_digits()

    def _show_digits(self) -> None:
        self.dots.setText(" ".join("●" * len(self._digits)) or " ")

    def set_sizes(self, card_width: int, key_height: int) -> None:
        self.card.setFixedWidth(card_width)
        for b in self.keys.values():
            b.setMinimumHeight(key_height)
        self.cancel_button.setMinimumHeight(key_height * 3 // 4)
        self._place()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._place()

    def _place(self) -> None:
        self.card.adjustSize()
        h = min(self.height() - 16, self.card.sizeHint().height())
        self.card.resize(self.card.width(), max(1, h))
        self.card.move((self.width() - self.card.width()) // 2, (self.height() - self.card.height()) // 2)

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), QColor(0, 0, 0, 190))  # the kiosk dimmed behind the prompt
        p.end()

    def mousePressEvent(self, event) -> None:
        event.accept()  # a touch beside the keypad is not a touch on the kiosk

    def mouseReleaseEvent(self, event) -> None:
        event.accept()


class DemoWindow(QWidget):
    """The kiosk: see the module docstring. Show it with ``showFullScreen()``.

    ``camera_factory(number) -> CameraSource`` (default :class:`OpenCVCamera`) is called with
    ``settings.camera``. ``steady_seconds``: how long the picture must be still before it is
    recognized by itself; ``result_seconds``: how long a card stays; ``steady_threshold``: see
    :func:`museum_search.core.capture.is_steady`.

    Locked (see the module docstring): only :meth:`leave` (the exit combination, or the right PIN)
    and :meth:`shutdown` (code) let it close; ``left`` fires once it has closed. (Qt 6's
    ``QApplication.quit()`` asks the windows to close first, so it too is refused while the kiosk
    runs: call :meth:`shutdown` before it.)
    """

    mode_changed = Signal(str)
    recognized = Signal(object)  # the list of Results (best first)
    left = Signal()  # the kiosk closed (staff left it, or it was shut down); the hidden windows are back

    MODES = ("starting", "live", "recognizing", "result", "unknown", "error", "retrying")
    #: A touch on a problem screen shows "Trying again…" at least this long (ms).
    RETRY_MIN_MS = 1200
    #: Holding the top-left corner this long opens the PIN prompt (when a PIN is set).
    CORNER_HOLD_MS = 3000
    #: The PIN prompt closes by itself when nobody touched it for this long.
    PIN_IDLE_MS = 30_000
    #: Wrong PINs in a row before the prompt refuses for PIN_LOCK_SECONDS.
    PIN_MAX_TRIES = 5
    PIN_LOCK_SECONDS = 60
    #: The phone link's QR code is about this fraction of the screen's height.
    QR_HEIGHT = 0.12
    #: While the kiosk holds the screen, it checks this often that it is still in front.
    GUARD_MS = 500
    #: The kiosk that holds the screen now (one at a time: the last shown).
    _holder: DemoWindow | None = None

    def __init__(self, index, settings: Settings, camera_factory=None, parent: QWidget | None = None, *,
                 steady_seconds: float = 1.0, result_seconds: float = 8.0,
                 steady_threshold: float = STEADY_THRESHOLD, max_fps: float = 24.0, engine: str | None = None):
        super().__init__(parent)
        self.index = index
        self.settings = settings
        self.engine = engine or settings.engine  # the inference engine of the kiosk's pipeline
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
        self._init_state()
        self._build_pages(max_fps)
        self._make_timers()
        self._restyle()
        self._set_mode("starting")
        self._load_pipeline()

    def _init_state(self) -> None:
        self._mode = "starting"
        self._pipeline: QueryPipeline | None = None
        self._visitors = None  # the VisitorLog that counts (and keeps) visitors' questions, or None
        self._camera_error: str | None = None  # the technician's text of the last camera failure
        self._camera_ok = False  # the camera opened (and has not failed since)
        self._problem: str | None = None  # the problem shown: a key of _PROBLEMS
        self._pending_problem: str | None = None  # to show once "Trying again…" has been seen
        self._retry_clock = QElapsedTimer()
        self._fitted_screen = None  # the screen whose size the window follows (full screen)
        self._load_job: workers.Job | None = None
        self._job: workers.Job | None = None
        self._closing = False
        self._leave_authorised = False  # staff left (exit combination, PIN): the close is let through
        self._left_emitted = False
        self._started_camera = False
        self._hidden_windows: list[QWidget] = []  # the application's windows hidden while the kiosk runs
        self._holding = False
        self._want_full_screen = False  # shown full screen: it stays full screen
        self._unexposed_looks = 0  # guard looks in a row that found the window unmapped
        self._pin_wrong = 0
        self._pin_locked_until = 0.0
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

    def _build_pages(self, max_fps: float) -> None:
        """The camera, the card and the message pages; the touch ripple and the PIN prompt over them."""
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

        self.set_phone_link(self.settings.demo_qr_url)
        self.ripple = _Ripple(self)
        self.pin_prompt = _PinPrompt(self)
        self.pin_prompt.submitted.connect(self._pin_submitted)

    def _make_timers(self) -> None:
        self._corner_timer = QTimer(self, singleShot=True, interval=self.CORNER_HOLD_MS)
        self._corner_timer.timeout.connect(self._corner_held)
        self._pin_unlock_timer = QTimer(self, singleShot=True)
        self._pin_unlock_timer.timeout.connect(self._pin_unlocked)
        # while holding the screen: a look every GUARD_MS at what the window manager did (it may hide
        # the kiosk without telling: "show desktop" unmaps it and Qt still thinks it is shown)
        self._guard_timer = QTimer(self, interval=self.GUARD_MS)
        self._guard_timer.timeout.connect(self._guard)
        self._result_timer = QTimer(self, singleShot=True)
        self._result_timer.timeout.connect(self.back_to_live)
        self._problem_timer = QTimer(self, singleShot=True)  # shows _pending_problem
        self._problem_timer.timeout.connect(self._show_pending_problem)

    # ---- public API ----------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """One of :attr:`MODES`: starting, live, recognizing, result, unknown, error, retrying."""
        return self._mode

    @property
    def exit_keys(self) -> QKeySequence:
        """The combination with which staff leave (:data:`DEFAULT_EXIT_KEYS` when none is set)."""
        return exit_keys_from(self.settings)

    @property
    def phone_link(self) -> str:
        """The web address shown as a QR code on the live view ("" for none)."""
        return self.live_page.phone_qr.data()

    def set_phone_link(self, url: str) -> None:
        """Show ``url`` as a QR code in the live view's corner; "" hides it."""
        self.live_page.phone_qr.set_data(url)
        self.live_page._place()
        self.message_page.phone_qr.set_data(url)
        self.message_page.phone_qr.setVisible(bool(url) and self._problem == "camera" and self._mode == "error")
        self.card_page.phone_qr.set_data(url)
        self.card_page.phone_qr.setVisible(bool(url) and self._mode == "unknown")

    @property
    def pin_set(self) -> bool:
        """True when leaving asks for the staff PIN."""
        return bool(getattr(self.settings, "demo_pin_set", False))

    def request_leave(self) -> None:
        """Staff want to leave (the exit combination, the held corner): ask for the PIN when one is
        set, else leave."""
        if self._closing:
            return
        if self.pin_set:
            self.open_pin_prompt()
        else:
            self.leave()

    def leave(self) -> None:
        """Leave the kiosk (authorised): it closes and the hidden windows come back."""
        log.info("kiosk: left by staff")
        self._leave_authorised = True
        self.pin_prompt.close_prompt()
        if not self.close():
            self._leave_authorised = False

    def open_pin_prompt(self) -> None:
        """Show the staff PIN prompt over the kiosk."""
        if not self.pin_set or self._closing:
            return
        self._corner_timer.stop()
        self.pin_prompt.open()
        self._show_pin_lock()

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
        self._want_full_screen = True
        super().showFullScreen()
        self.raise_()
        self.activateWindow()  # keyboard focus without a window manager (the exit keys)

    def _fit_screen(self, *_args) -> None:
        if self.isFullScreen() and self._fitted_screen is not None:
            self.setGeometry(self._fitted_screen.geometry())

    def shutdown(self) -> None:
        """Stop the camera, timers and background work, and let go of the screen (the window
        closes; after this a close is no longer refused)."""
        self._closing = True
        self._release_screen()
        self._result_timer.stop()
        self._problem_timer.stop()
        self._corner_timer.stop()
        self._pin_unlock_timer.stop()
        self.pin_prompt.close_prompt()
        self.card_page.countdown.stop()
        self.camera_view.stop(message=None)
        for job in (self._job, self._load_job):
            if job is not None and job.running:
                job.cancel()
        visitors, self._visitors = self._visitors, None
        if visitors is not None:  # closed once the last answer is recorded
            if self._job is not None and self._job.running:
                self._job.finished.connect(visitors.close)
            else:
                visitors.close()

    def is_busy(self) -> bool:
        """True while a background job (model loading, recognition) runs."""
        return any(j is not None and j.running for j in (self._job, self._load_job))

    def problem(self) -> str | None:
        """The problem shown or last shown: "camera", "setup", "lookup" (None: none yet)."""
        return self._problem

    # ---- start-up ------------------------------------------------------------------------
    def _load_pipeline(self) -> None:
        index, settings = self.index, QuerySettings(k=max(1, int(self.settings.top_k)), per_instance=True,
                                                    engine=self.engine)

        def done(ready: tuple) -> None:
            pipeline, self._visitors = ready
            if self._visitors is not None and self._closing:
                self._visitors.close()
                self._visitors = None
            notice = self._visitors.policy.notice(kiosk_language()) if self._visitors is not None else None
            self.live_page.set_notice(notice or "")  # what is kept, where keeping is on: one plain line
            self._pipeline = pipeline
            weak = pipeline.verdict.warning()
            if weak is not None:  # staff read it in the Collection tab too, before opening the kiosk
                log.warning("kiosk: %s", weak)
            if self._mode == "starting":
                self._set_mode("live")
            elif self._mode == "retrying":
                self._retry_succeeded()

        def failed(exc: BaseException) -> None:
            log.error("kiosk: the query pipeline of the index %s could not be built: %s",
                      getattr(index, "path", None), workers.error_message(exc))  # traceback: debug level
            self._show_problem("setup")

        policy, folder = self.settings.visitor_policy, self.settings.visitors_folder  # read here: QSettings
        self._load_job = workers.start(lambda: (QueryPipeline(index, settings), _open_visitors(index, policy, folder)),
                                       on_result=done, on_error=failed)

    def _start_camera(self) -> None:
        self._started_camera = True
        self._camera_error = None
        self._camera_ok = False
        self._prev = None
        self._steady_since = None
        number = self.settings.camera
        try:
            source: CameraSource = self.camera_factory(number)
        except Exception as exc:
            log.debug("kiosk: the camera factory failed for camera %s", number, exc_info=exc)
            self._camera_failed(workers.error_message(exc))
            return
        self.camera_view.start(source)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._closing:
            self._hold_screen()
        if not self._started_camera and not self._closing:
            self._start_camera()
        self.setFocus(Qt.FocusReason.OtherFocusReason)

    # ---- holding the screen --------------------------------------------------------------
    def _hold_screen(self) -> None:
        """Hide every other window of the application and watch for new ones (until released)."""
        previous = DemoWindow._holder
        if previous is not None and previous is not self and isValid(previous):
            previous._release_screen(restore=False)
        DemoWindow._holder = self
        for w in QApplication.topLevelWidgets():
            self._hide_other(w)
        if not self._holding:
            self._holding = True
            QApplication.instance().installEventFilter(self)
            self._guard_timer.start()

    def _hide_other(self, w) -> None:
        if (w is self or not isinstance(w, QWidget) or not isValid(w) or not w.isWindow() or w.isHidden()
                or w.windowType() == Qt.WindowType.Desktop):
            return
        log.debug("kiosk: hiding the window %r while the kiosk runs", w.windowTitle() or w.objectName())
        if w not in self._hidden_windows:
            self._hidden_windows.append(w)
        w.hide()

    def _release_screen(self, restore: bool = True) -> None:
        """Stop holding the screen; show again the windows hidden while the kiosk ran."""
        self._guard_timer.stop()
        if self._holding:
            self._holding = False
            app = QApplication.instance()
            if app is not None:
                app.removeEventFilter(self)
        if DemoWindow._holder is self:
            DemoWindow._holder = None
        hidden, self._hidden_windows = self._hidden_windows, []
        if restore:
            for w in hidden:
                if isValid(w) and w.isHidden():
                    w.show()

    def eventFilter(self, obj, event) -> bool:
        if (self._holding and event.type() == QEvent.Type.Show and isinstance(obj, QWidget) and obj is not self
                and obj.isWindow()):
            # another window of the application is shown while the kiosk runs (an error dialog of a
            # job that finished, say): hidden, after its show event, until staff leave
            QTimer.singleShot(0, lambda w=obj: self._holding and isValid(w) and self._hide_other(w))
        return False

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if not getattr(self, "_holding", False) or self._closing:  # (also called during __init__)
            return
        if event.type() == QEvent.Type.ActivationChange and not self.isActiveWindow():
            QTimer.singleShot(0, self._take_activation_back)
        elif event.type() == QEvent.Type.WindowStateChange and self._want_full_screen:
            QTimer.singleShot(0, self._keep_full_screen)

    def _take_activation_back(self) -> None:
        """Another window of the application was activated (Alt+Tab, a dialog): hide it, come back."""
        if not self._holding or self._closing or self.isActiveWindow():
            return
        other = QApplication.activeWindow()
        if other is None or other is self:
            return  # another program's window (or none): not ours to hide
        self._hide_other(other)
        self.raise_()
        self.activateWindow()

    def _keep_full_screen(self) -> None:
        if not self._holding or self._closing or not self._want_full_screen:
            return
        handle = self.windowHandle()
        if not self.isFullScreen() or self.isMinimized() or self.isHidden():
            log.info("kiosk: the window lost its full-screen state; back to full screen")
            self.setWindowState(Qt.WindowState.WindowNoState)
            self.showFullScreen()
        elif handle is not None and not handle.isExposed():
            # unmapped behind Qt's back (the window manager's "show desktop"; Qt still has it shown
            # and will not ask for activation while it is unmapped): shown again, after two looks
            # in a row (not while a show is under way)
            self._unexposed_looks += 1
            if self._unexposed_looks >= 2:
                self._unexposed_looks = 0
                log.info("kiosk: the window was hidden by the window manager; shown again")
                self.hide()
                self.showFullScreen()
        else:
            self._unexposed_looks = 0

    def _guard(self) -> None:
        """What the window manager may have done without an event to the kiosk (see GUARD_MS)."""
        if not self._holding or self._closing or self.isHidden():
            return
        other = QApplication.activeWindow()
        if other is not None and other is not self:
            self._take_activation_back()
        self._keep_full_screen()

    # ---- the staff PIN -------------------------------------------------------------------
    def _pin_submitted(self, pin: str) -> None:
        if self._closing:
            return
        if time.monotonic() < self._pin_locked_until:
            self._show_pin_lock()
            return
        if self.settings.check_demo_pin(pin):
            self._pin_wrong = 0
            self.leave()
            return
        self._pin_wrong += 1
        log.warning("kiosk: a wrong staff PIN was typed (%d in a row)", self._pin_wrong)
        if self._pin_wrong >= self.PIN_MAX_TRIES:
            self._pin_wrong = 0
            self._pin_locked_until = time.monotonic() + self.PIN_LOCK_SECONDS
            self._pin_unlock_timer.start(self.PIN_LOCK_SECONDS * 1000)
            self._show_pin_lock()
        else:
            self.pin_prompt.set_message(PIN_WRONG)

    def _show_pin_lock(self) -> None:
        locked = time.monotonic() < self._pin_locked_until
        self.pin_prompt.set_locked(locked)
        if locked:
            self.pin_prompt.set_message(PIN_LOCKED)

    def _pin_unlocked(self) -> None:
        self._pin_locked_until = 0.0
        self.pin_prompt.set_locked(False)
        self.pin_prompt.set_message("")

    def _corner(self) -> QRect:
        side = max(48, min(self.width(), self.height()) // 10)
        return QRect(0, 0, side, side)

    def _corner_held(self) -> None:
        if self.pin_set and not self._closing:
            log.info("kiosk: the corner was held: the staff PIN prompt")
            self.open_pin_prompt()

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
        page.phone_qr.setVisible(kind == "camera" and bool(page.phone_qr.data()))
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
        page.phone_qr.hide()
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
        log_camera_problem(log, f"kiosk: camera {self.settings.camera} cannot be used: {text}")  # once per process
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
        if self._mode != "live" or self._pipeline is None or self._closing or self.pin_prompt.isVisible():
            return False
        if self._job is not None and self._job.running:
            return False
        frame = self.camera_view.latest_frame()
        if frame is None:
            return False
        self._armed = False
        self._trigger_ref = _small(frame)
        self._steady_since = None
        pipeline, visitors = self._pipeline, self._visitors
        self._set_mode("recognizing")
        self._job = workers.start(lambda: _recorded(_recognize(pipeline, frame), visitors),
                                  on_error=self._recognition_failed,
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
        log.info("kiosk: recognised %s, %s (%s)", best.instance, best.path, _technician_verdict(rec.answer))
        objects = rec.answer.objects if rec.object_photos else []
        for o in objects[1:]:
            log.info("kiosk: also in the photo: %s, %s (confidence %.3f; %s)", o.instance, o.result.path,
                     o.confidence, o.reason)
        c.several.show_objects([KioskObject(_meta(o.result, "title") or _pretty_instance(o.instance),
                                            _meta(o.result, "artist"),
                                            _meta(o.result, "year") or _meta(o.result, "date"),
                                            confidence_words(o.confidence), photo)
                                for o, photo in zip(objects, rec.object_photos)], CONTINUE, PHOTO_MISSING)
        c.single.setVisible(not objects)
        c.several.setVisible(bool(objects))
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
        words = confidence_words(rec.answer.confidence)  # plain words; the number goes to the log
        c.confidence.setText(words)
        c.confidence.setVisible(bool(words))
        c.phone_qr.hide()
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
        c.single.show()
        c.several.hide()
        log.info("kiosk: not in the collection (%s)", _technician_verdict(rec.answer))
        c.verdict.setText("")
        c.verdict.hide()
        c.title.setText(NOT_IN_COLLECTION)
        c.artist.setVisible(False)
        c.year.setVisible(False)
        c.description.setText(NOT_IN_COLLECTION_BODY)
        c.description.setVisible(True)
        c.confidence.setText("")
        c.confidence.setVisible(False)
        c.phone_qr.setVisible(bool(c.phone_qr.data()))
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
            if event.button() == Qt.MouseButton.LeftButton and self._corner().contains(event.position().toPoint()):
                self._corner_timer.start()  # held there: the staff PIN prompt (when a PIN is set)
            self._touched(event.position())
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:
        if self._corner_timer.isActive() and not self._corner().contains(event.position().toPoint()):
            self._corner_timer.stop()
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        self._corner_timer.stop()
        super().mouseReleaseEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.isAutoRepeat():
            event.accept()
            return
        if self.pin_prompt.isVisible():
            self.pin_prompt.type_key(event.key(), event.text())
            event.accept()
            return
        combo = QKeyCombination(event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier, Qt.Key(event.key()))
        if combo == self.exit_keys[0]:
            self.request_leave()
            event.accept()
            return
        if event.key() in (Qt.Key.Key_Space, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self._touched()
        event.accept()  # nothing else: visitors' keys (Esc too) do nothing

    def closeEvent(self, event) -> None:
        if not (self._leave_authorised or self._closing):
            # Alt+F4, the title bar, any close staff did not authorise: the kiosk stays
            log.info("kiosk: a request to close the kiosk was refused (%s)",
                     "from the window system" if event.spontaneous() else "not authorised")
            event.ignore()
            if self._holding:
                QTimer.singleShot(0, self._take_activation_back)
            return
        self.shutdown()
        super().closeEvent(event)
        if not self._left_emitted:
            self._left_emitted = True
            self.left.emit()

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
        self.card_page.several.restyle(px)
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
            QLabel#demoNotice {{ font-size: {px(22)}px; background: rgba(38, 39, 46, 200); padding: {px(6)}px; }}
            QLabel#qrCaption {{ font-size: {px(24)}px; background: rgba(38, 39, 46, 215);
                                border: 1px solid rgba(255, 255, 255, 60);
                                border-radius: {px(12)}px; padding: {px(6)}px {px(14)}px; }}
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
            QFrame#pinCard {{ background: {_CARD}; border: 1px solid rgba(255, 255, 255, 70);
                              border-radius: {px(28)}px; padding: {px(28)}px; }}
            QLabel#pinTitle {{ font-size: {px(52)}px; font-weight: 700; color: {_ACCENT}; }}
            QLabel#pinDetail {{ font-size: {px(30)}px; color: {_MUTED}; }}
            QLabel#pinDots {{ font-size: {px(48)}px; min-height: {px(64)}px; color: {_TEXT}; }}
            QLabel#pinMessage {{ font-size: {px(28)}px; color: {_SORRY}; min-height: {px(36)}px; }}
            QPushButton {{ font-family: "DejaVu Sans", "Segoe UI", "Helvetica Neue", sans-serif; color: {_TEXT};
                           background: #2a2c33; border: 1px solid rgba(255, 255, 255, 50);
                           border-radius: {px(18)}px; }}
            QPushButton:pressed {{ background: #3a3d47; }}
            QPushButton:disabled {{ color: #5b5a56; background: #202127; }}
            QPushButton#pinKey {{ font-size: {px(44)}px; }}
            QPushButton#pinOk {{ font-size: {px(38)}px; font-weight: 700; color: {_BG}; background: {_ACCENT}; }}
            QPushButton#pinOk:disabled {{ background: #5b4e36; }}
            QPushButton#pinCancel {{ font-size: {px(28)}px; color: {_MUTED}; }}
        """)
        self.pin_prompt.set_sizes(px(760), px(96))
        self.pin_prompt.setGeometry(self.rect())
        self.live_page.phone_qr.set_side(max(64, round(self.QR_HEIGHT * self.height())))
        self.message_page.phone_qr.set_side(max(96, round(2 * self.QR_HEIGHT * self.height())))
        self.card_page.phone_qr.set_side(max(64, round(self.QR_HEIGHT * self.height())))
        self.live_page._place()
