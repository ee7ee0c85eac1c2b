"""The main window: Collection, Search, Evaluation and Visitors tabs, menu, status bar, shortcuts.

Start-up (``MainWindow(lazy=True)``, what :func:`museum_search.gui.app.main` makes): the window shows
at once with a "Loading…" page in each tab, while a thread imports what the tabs run on (core's
indexing, query and evaluation modules, SciPy, OpenCV, pyqtgraph). The tabs are then built on the GUI
thread, the one shown first. An index given on the command line is read on a worker
(:meth:`MainWindow.open_index_in_background`), and the network of every index opened is loaded on a
worker too (:class:`NetworkLoader`), with "Loading the network…" in the status bar; a search started
meanwhile waits for that same load (``core.inference._engines`` keeps one extractor per network). Nothing here
imports torch, ONNX Runtime or faiss: a worker does, when the network or an approximate index is
first needed. ``MainWindow()`` (``lazy=False``) builds every tab before it returns.

The window's place and size are stored as the client rectangle (:func:`restore_geometry`), not as
``saveGeometry``'s frame, which without a window manager came back 1 px right and 25 px down, with a
black strip above it, at every start.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from PySide6.QtCore import QMargins, QObject, QRect, QRegularExpression, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QIcon, QKeySequence, QRegularExpressionValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QKeySequenceEdit,
    QLabel,
    QLayout,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from museum_search import __version__
from museum_search.core.paths import resource
from museum_search.gui.state import AppState, phone_link_problem

log = logging.getLogger(__name__)

#: Settings keys of the window's client rectangle (a QRect) and whether it was maximised.
GEOMETRY_SETTING = "window/rect"
MAXIMIZED_SETTING = "window/maximized"
#: The window manager's frame around the window when it was last closed (left, top, right, bottom).
FRAME_SETTING = "window/frame"
DEFAULT_SIZE = (1280, 820)
#: What the tabs import, loaded on a thread while the window already shows (lazy start), in two groups:
#: the Collection and Search tabs' first (then they are built and the index opens), then the Evaluation tab's
#: (pyqtgraph, the evaluation runner). The Evaluation tab, whose plots take 0.3-0.8 s to build on the GUI
#: thread, is built when it is first chosen, so that no start pays for it.
HEAVY_MODULES = (
    ("superqt", "museum_search.core.jobs._indexing", "museum_search.core.answer._pipeline", "museum_search.core.answer._icfrr",
     "museum_search.gui.workers", "museum_search.gui.upgrade", "museum_search.gui.collection_tab",
     "museum_search.gui.search_tab"),
    ("museum_search.core.evaluation._runner", "museum_search.core.evaluation._sweep", "pyqtgraph",
     "museum_search.gui.evaluation_tab", "museum_search.gui.visitors_tab"),
)
#: (attribute, module, class, tab title) of the tabs, in their order.
TABS = (
    ("collection_tab", "collection_tab", "CollectionTab", "&Collection"),
    ("search_tab", "search_tab", "SearchTab", "&Search"),
    ("evaluation_tab", "evaluation_tab", "EvaluationTab", "&Evaluation"),
    ("visitors_tab", "visitors_tab", "VisitorsTab", "&Visitors"),
)


def show_error(parent: QWidget | None, title: str, exc: BaseException | str) -> None:
    from museum_search.gui.workers import show_error as show

    show(parent, title, exc)


def app_icon() -> QIcon:
    icon = QIcon()
    for size in (16, 32, 48, 64, 128, 256):
        p = resource("icons", f"museum-search-{size}.png")
        if p.is_file():
            icon.addFile(str(p))
    return icon


class SettingsDialog(QDialog):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.state = state
        form = QFormLayout(self)
        # "Not in this collection" is decided by the query pipeline from its evidence, with the
        # thresholds calibrated for each index (re-calibrate them in the Evaluation tab).
        self.camera = QSpinBox(minimum=0, maximum=16)
        self.camera.setValue(state.settings.camera)
        form.addRow("Camera number:", self.camera)
        self._add_kiosk_rows(form)
        self._add_phone_link_rows(form)
        self._add_engine_rows(form)
        self.visitors = VisitorRows(state, self)
        form.addRow(self.visitors)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        # never smaller than its text needs: a message shown under a field makes the dialog grow,
        # and the word-wrapped help keeps every line (the last says how staff leave the kiosk)
        form.setSizeConstraint(QLayout.SizeConstraint.SetMinimumSize)

    def _add_kiosk_rows(self, form: QFormLayout) -> None:
        from museum_search.gui.demo_window import DEFAULT_EXIT_KEYS, EXIT_KEYS_SETTING

        state = self.state
        # Demo mode (the kiosk): how staff leave it; the label under the fields says what visitors
        # can and cannot do with what is typed here
        self.exit_keys = QKeySequenceEdit(QKeySequence(str(state.settings.value(EXIT_KEYS_SETTING, "") or "")))
        self.exit_keys.setClearButtonEnabled(True)
        if hasattr(self.exit_keys, "setMaximumSequenceLength"):
            self.exit_keys.setMaximumSequenceLength(1)  # one combination (the kiosk reads the first)
        self.exit_keys.setToolTip(f"Demo mode: the key combination with which staff leave the kiosk. Empty: "
                                  f"{DEFAULT_EXIT_KEYS}. Esc never leaves unless you choose it here.")
        form.addRow("Demo exit keys:", self.exit_keys)
        self.pin = QLineEdit()
        self.pin.setEchoMode(QLineEdit.EchoMode.Password)
        self.pin.setValidator(QRegularExpressionValidator(QRegularExpression(r"\d{0,12}"), self.pin))
        self.pin.setPlaceholderText("PIN set: type a new one to change it" if state.settings.demo_pin_set
                                    else "No PIN (4 to 12 digits)")
        self.pin.setToolTip("Demo mode: with a staff PIN, the exit keys or holding the top-left corner of the "
                            "screen ask for it before the kiosk closes. Only a hash of it is stored.")
        form.addRow("Demo staff PIN:", self.pin)
        self.clear_pin = QCheckBox("Remove the PIN")
        self.clear_pin.setVisible(state.settings.demo_pin_set)
        form.addRow("", self.clear_pin)
        self.pin_error = QLabel("")
        self.pin_error.setObjectName("pinError")
        self.pin_error.setStyleSheet("color: #b3261e;")
        self.pin_error.hide()
        form.addRow("", self.pin_error)
        self.kiosk_help = QLabel("")
        self.kiosk_help.setObjectName("kioskLockHelp")
        self.kiosk_help.setWordWrap(True)
        self.kiosk_help.setMinimumWidth(420)
        form.addRow("Demo mode:", self.kiosk_help)
        self.exit_keys.keySequenceChanged.connect(self._update_kiosk_help)
        self.pin.textChanged.connect(self._update_kiosk_help)
        self.clear_pin.toggled.connect(self._update_kiosk_help)
        self._update_kiosk_help()

    def _add_phone_link_rows(self, form: QFormLayout) -> None:
        """The kiosk's phone link: the web page of ``museum-search serve``, shown as a QR code."""
        self.qr_url = QLineEdit(self.state.settings.demo_qr_url)
        self.qr_url.setPlaceholderText("e.g. http://192.168.1.20:8000/ (empty: no QR code)")
        self.qr_url.setClearButtonEnabled(True)
        self.qr_url.setToolTip("Demo mode: the kiosk shows this web address as a QR code in the bottom-right "
                               "corner (\"Use your phone: scan me\"), so visitors can ask from their own phones. "
                               "Use the address that “museum-search serve --host 0.0.0.0” prints. Empty: no QR code.")
        form.addRow("Phone link (QR code in the kiosk corner):", self.qr_url)
        self.qr_error = QLabel("")
        self.qr_error.setObjectName("qrUrlError")
        self.qr_error.setStyleSheet("color: #b3261e;")
        self.qr_error.setWordWrap(True)
        self.qr_error.hide()
        form.addRow("", self.qr_error)
        self.qr_url.textChanged.connect(self.qr_error.hide)
        self.qr_url.editingFinished.connect(self._check_phone_link)

    def _check_phone_link(self) -> bool:
        """Say under the field why the phone link cannot be used; True when it can (or is empty)."""
        problem = phone_link_problem(self.qr_url.text())
        self.qr_error.setText(problem)
        self.qr_error.setVisible(bool(problem))
        self._fit()
        return not problem

    def _fit(self) -> None:
        """Grow (never shrink below what the text needs) so that every message shows whole."""
        self.layout().activate()
        need = self.layout().totalHeightForWidth(self.width()) if self.layout().hasHeightForWidth() \
            else self.layout().totalSizeHint().height()
        if need > self.height():
            self.resize(self.width(), need)

    def _add_engine_rows(self, form: QFormLayout) -> None:
        """The inference engine and the matcher of new indexes."""
        from museum_search.core import inference

        state = self.state
        self.engine = QComboBox()
        self.engine.addItem(f"Automatic ({inference.default_engine()})", "auto")
        self.engine.addItem("ONNX Runtime" + ("" if inference.onnx_available() else " (not installed)"), "onnx")
        self.engine.addItem("PyTorch" + ("" if inference.torch_available() else " (not installed)"), "torch")
        self.engine.setCurrentIndex(max(0, self.engine.findData(state.settings.engine)))
        self.engine.setToolTip("What runs the network. ONNX Runtime is about 4x faster on a CPU; both give the "
                               "same descriptors, so an index built with one is searched with the other.")
        form.addRow("Inference engine:", self.engine)
        from museum_search.core.verification import xfeat_available

        self.matcher = QComboBox()
        self.matcher.addItem("SIFT", "sift")
        self.matcher.addItem("XFeat (learned)" + ("" if xfeat_available() else " (not installed)"), "xfeat")
        self.matcher.addItem("Automatic (both calibrated, the better kept; slower builds)", "auto")
        self.matcher.setCurrentIndex(max(0, self.matcher.findData(state.settings.matcher)))
        self.matcher.setToolTip("The local features that verify answers, stored with each new index (an update "
                                "keeps the index's own). XFeat, a learned matcher, finds matching points on dark "
                                "or textureless works and on small photos of objects where SIFT finds few; "
                                "Automatic computes both, calibrates the verdict with each on the collection's own "
                                "views and keeps the better (a build takes about twice as long).")
        form.addRow("Matcher for new indexes:", self.matcher)
        self.whitening = QCheckBox("Learn what visitors' phones change (fewer photos refused; slower builds)")
        self.whitening.setChecked(state.settings.whitening)
        self.whitening.setToolTip("Each new index also learns, from its own photos and a copy of each as a phone takes "
                                  "it, which changes of light, blur and angle to look past when it judges whether a "
                                  "photo shows an object of the collection (a learned whitening of its descriptor). "
                                  "On the project's visitor protocol it halves the known objects refused on "
                                  "phone-like photos (11 % to 5 %), and accepts a few more objects that are not in "
                                  "the collection (on clean photos 95 % of them refused instead of 97 %). A build "
                                  "takes up to 0.4 s more per photo (at most 1,000 photos). An update keeps the "
                                  "index's own.")
        form.addRow("", self.whitening)

    def _pin_after(self) -> bool:
        """Whether a PIN will be set once these settings are saved."""
        if self.pin.text():
            return True
        return self.state.settings.demo_pin_set and not self.clear_pin.isChecked()

    def _update_kiosk_help(self, *_args) -> None:
        from museum_search.gui.demo_window import lock_summary

        keys = self.exit_keys.keySequence().toString(QKeySequence.SequenceFormat.NativeText)
        self.kiosk_help.setText(lock_summary(keys, self._pin_after()))
        self.pin_error.hide()

    def accept(self) -> None:
        pin = self.pin.text()
        if pin and not 4 <= len(pin) <= 12:
            self.pin_error.setText("The PIN needs 4 to 12 digits.")
            self.pin_error.show()
            self._fit()
            self.pin.setFocus()
            return
        if not self._check_phone_link():
            self.qr_url.setFocus()
            return
        if not self.visitors.save(self.state):
            self._fit()
            return
        self.state.settings.camera = self.camera.value()
        self.state.settings.demo_qr_url = self.qr_url.text()
        from museum_search.gui.demo_window import EXIT_KEYS_SETTING

        self.state.settings.set_value(EXIT_KEYS_SETTING, self.exit_keys.keySequence().toString())
        if pin:
            self.state.settings.set_demo_pin(pin)
        elif self.clear_pin.isChecked():
            self.state.settings.set_demo_pin(None)
        if self.matcher.currentData() != self.state.settings.matcher:  # the Collection tab's next builds use it
            self.state.settings.matcher = self.matcher.currentData()
        if self.whitening.isChecked() != self.state.settings.whitening:
            self.state.settings.whitening = self.whitening.isChecked()
        if self.engine.currentData() != self.state.settings.engine:
            self.state.settings.engine = self.state.engine = self.engine.currentData()
            if self.state.index is not None:  # the views build their pipelines again, on the new engine
                self.state.set_index(self.state.index)
        super().accept()


#: (value, words) of the settings "Keep visitors' photos" (core.visitors.KEEP_MODES, in its order).
KEEP_CHOICES = (("none", "Keep nothing"), ("unsure", "Keep the not-recognised and unsure ones"),
                ("all", "Keep all"))
#: What the counting counts, in plain words (the Settings dialog shows it under the rows).
COUNTED_LINE = ("Counted, for each question: the hour, the object answered (or none), whether it was recognised, "
                "how sure, the language and where it was asked (kiosk or phone). No photo, no address, nothing "
                "about the visitor.")


class VisitorRows(QGroupBox):
    """The Settings rows of what the kiosk counts and keeps of visitors' questions (issue 34): the
    keeping mode, its limits (quota, per day, days kept), counting on or off and the folder, each
    explained in its tooltip, and a plain line of what is counted. :meth:`policy` is what they say
    (core's :class:`KeepPolicy`, which refuses a value out of its range)."""

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__("Visitors' questions at the kiosk", parent)
        self.setObjectName("visitorSettings")
        stored, form = state.settings.visitor_policy, QFormLayout(self)
        self.keep = QComboBox()
        for value, words in KEEP_CHOICES:
            self.keep.addItem(words, value)
        self.keep.setCurrentIndex(max(0, self.keep.findData(stored.keep)))
        self.keep.setToolTip("Whether the kiosk keeps visitors' photos, for staff to review in the Visitors tab: "
                             "none (the default), only those it did not recognise or was unsure of, or all. A kept "
                             "photo is stored again from its pixels (no EXIF, no GPS position) with its answer; "
                             "visitors read one line saying what is kept and for how long.")
        form.addRow("Keep visitors' photos:", self.keep)
        self.quota = _spin(QDoubleSpinBox(decimals=0, minimum=1, maximum=1_000_000, suffix=" MB in all"), stored.quota_mb,
                           "At most this much space for all kept photos; beyond it no more are kept.")
        self.per_day = _spin(QSpinBox(minimum=1, maximum=1_000_000, suffix=" a day"), stored.per_day,
                             "At most this many photos are kept each day.")
        self.days = _spin(QSpinBox(minimum=1, maximum=3650, prefix="kept ", suffix=" days"), stored.retention_days,
                          "Kept photos not reviewed by then are deleted after this many days.")
        limits = QHBoxLayout()
        for w in (self.quota, self.per_day, self.days):
            limits.addWidget(w)
        form.addRow("Limits:", limits)
        self.counting = QCheckBox("Count each question (anonymous counts per hour)")
        self.counting.setChecked(stored.counting)
        self.counting.setToolTip("Counts what visitors ask, for the Visitors tab and `museum-search stats`. "
                                 "On by default; off: nothing is counted.")
        form.addRow("Counting:", self.counting)
        self.folder = QLineEdit(state.settings.visitors_folder)
        self.folder.setPlaceholderText("Beside the index (the index folder's name + “-visitors”)")
        self.folder.setClearButtonEnabled(True)
        self.folder.setToolTip("Where the counts and the kept photos are stored: a folder made by museum-search, "
                               "never inside the collection or the index. Empty: beside the index.")
        choose = QPushButton("Choose…")
        choose.clicked.connect(self._choose_folder)
        folder = QHBoxLayout()
        folder.addWidget(self.folder, 1)
        folder.addWidget(choose)
        form.addRow("Folder:", folder)
        self.counted = QLabel(COUNTED_LINE)
        self.counted.setObjectName("visitorsCounted")
        self.counted.setWordWrap(True)
        form.addRow(self.counted)
        self.error = QLabel("")
        self.error.setObjectName("visitorSettingsError")
        self.error.setStyleSheet("color: #b3261e;")
        self.error.setWordWrap(True)
        self.error.hide()
        form.addRow(self.error)
        self.keep.currentIndexChanged.connect(self._enable_limits)
        self._enable_limits()

    def _enable_limits(self, *_args) -> None:
        for w in (self.quota, self.per_day, self.days):
            w.setEnabled(self.keep.currentData() != "none")

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder of the visitors' counts and kept photos",
                                                  self.folder.text() or str(Path.home()))
        if folder:
            self.folder.setText(folder)

    def policy(self, base):
        """The :class:`KeepPolicy` these rows say, ``base``'s other fields kept (core refuses a value
        out of range: MuseumSearchError)."""
        from dataclasses import replace

        return replace(base, keep=self.keep.currentData(), quota_mb=float(self.quota.value()),
                       per_day=self.per_day.value(), retention_days=self.days.value(),
                       counting=self.counting.isChecked())

    def save(self, state: AppState) -> bool:
        """Store the rows (True), or say under them what is wrong and store nothing (False)."""
        from museum_search.core.errors import MuseumSearchError

        try:
            policy = self.policy(state.settings.visitor_policy)
        except MuseumSearchError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return False
        state.settings.visitor_policy = policy
        state.settings.visitors_folder = self.folder.text()
        return True


def _spin(box, value, tip: str):
    box.setValue(value)
    box.setToolTip(tip)
    return box


def fit_on_screen(rect: QRect, frame: QMargins | None = None) -> QRect:
    """``rect`` (a client rectangle) moved (and shrunk if need be) so that it and its window
    ``frame`` (the title bar and borders a window manager draws around it) are inside the available
    area of the screen it is on, or of the primary screen when it is on none (a screen unplugged
    since, a resolution made smaller): the title bar is never above the screen's top edge."""
    frame = frame or QMargins()
    screen = QGuiApplication.screenAt(rect.center()) or QGuiApplication.primaryScreen()
    if screen is None:
        return QRect(rect)
    avail = screen.availableGeometry().marginsRemoved(frame)
    w, h = min(rect.width(), avail.width()), min(rect.height(), avail.height())
    x = min(max(rect.x(), avail.left()), avail.left() + avail.width() - w)
    y = min(max(rect.y(), avail.top()), avail.top() + avail.height() - h)
    return QRect(x, y, w, h)


def frame_margins(window: QWidget) -> QMargins:
    """The frame the window manager draws around ``window`` (none without one, or before it shows)."""
    g, f = window.geometry(), window.frameGeometry()
    return QMargins(max(0, g.left() - f.left()), max(0, g.top() - f.top()),
                    max(0, f.right() - g.right()), max(0, f.bottom() - g.bottom()))


def _stored_frame(settings) -> QMargins:
    value = settings.value(FRAME_SETTING)
    try:
        left, top, right, bottom = (min(200, max(0, int(v))) for v in value)
    except (TypeError, ValueError):
        return QMargins()
    return QMargins(left, top, right, bottom)


def restore_geometry(window: QWidget, settings) -> None:
    """Give ``window`` the client rectangle stored by :func:`save_geometry`, kept on a screen;
    the first time, :data:`DEFAULT_SIZE` centred on the primary screen (smaller if the screen is)."""
    rect = settings.value(GEOMETRY_SETTING)
    if not isinstance(rect, QRect) or rect.width() < 100 or rect.height() < 100:
        screen = QGuiApplication.primaryScreen()
        avail = screen.availableGeometry() if screen is not None else QRect(0, 0, *DEFAULT_SIZE)
        rect = QRect(0, 0, *DEFAULT_SIZE)
        rect.moveCenter(avail.center())
    window.setGeometry(fit_on_screen(rect, _stored_frame(settings)))
    if str(settings.value(MAXIMIZED_SETTING, "false")).lower() == "true":
        window.setWindowState(window.windowState() | Qt.WindowState.WindowMaximized)


def save_geometry(window: QWidget, settings) -> None:
    """Store ``window``'s client rectangle (its normal one when maximised) and whether it is maximised.

    Not ``saveGeometry()``: its frame rectangle comes back shifted by a frame that only a window
    manager draws (without one, every start moved the window 1 px right and 25 px down)."""
    settings.set_value(GEOMETRY_SETTING, window.normalGeometry())
    settings.set_value(MAXIMIZED_SETTING, "true" if window.isMaximized() else "false")
    if not (window.isMaximized() or window.isFullScreen()):
        m = frame_margins(window)
        settings.set_value(FRAME_SETTING, [m.left(), m.top(), m.right(), m.bottom()])


def keep_on_screen(window: QWidget) -> None:
    """Once shown: where the window manager's title bar is above the screen's top edge (or left of
    its left edge), where it cannot be dragged, move the window (shrunk if need be) so that all of its
    frame shows. A window whose title bar is on the screen is left as it is."""
    if window.isMaximized() or window.isFullScreen() or not window.isVisible():
        return
    screen = window.screen()
    if screen is None:
        return
    avail, f = screen.availableGeometry(), window.frameGeometry()
    if f.top() < avail.top() or f.left() < avail.left():  # then all of the frame is brought onto the screen
        window.setGeometry(fit_on_screen(window.geometry(), frame_margins(window)))


class _LoadingPage(QWidget):
    """What a tab shows until it is built (lazy start): a line of text and a busy bar."""

    def __init__(self, what: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("tabLoading")
        layout = QVBoxLayout(self)
        layout.addStretch(1)
        label = QLabel(f"Loading {what}…")
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(label)
        bar = QProgressBar()
        bar.setRange(0, 0)
        bar.setMaximumWidth(240)
        bar.setTextVisible(False)
        layout.addWidget(bar, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addStretch(2)


class _Importer(QObject):
    """Imports groups of modules on a Python thread (not a superqt worker: superqt is among them);
    ``done`` fires on the GUI thread after each group, with its number."""

    done = Signal(int)

    def start(self, groups: Sequence[Sequence[str]]) -> None:
        threading.Thread(target=self._run, args=(groups,), name="museum-search-imports", daemon=True).start()

    def _run(self, groups: Sequence[Sequence[str]]) -> None:
        for i, names in enumerate(groups):
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception as exc:  # the tab that needs it says so when it is built
                    log.warning("could not import %s in the background: %s", name, exc)
            try:
                self.done.emit(i)
            except RuntimeError:  # the window is gone
                return


class NetworkLoader(QObject):
    """Loads the network of every index opened on a worker, so that the first search does not wait
    for it; ``changed`` fires with the text to show ("" once ready). A search started meanwhile
    waits for this same load (``core.inference._engines`` keeps one extractor per network and engine)."""

    changed = Signal(str)

    def __init__(self, state: AppState, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.loading = False
        self.ready = False
        self.error: str | None = None
        self._key: tuple | None = None
        self._job: Any = None
        state.index_changed.connect(self.load)

    def load(self, index) -> None:
        if index is None or index.meta.imported:  # imported descriptors: no network to load
            return
        from museum_search.core import inference
        from museum_search.gui import workers

        engine = inference.resolve_engine(self.state.engine)  # the session's (AppState.engine)
        key = (index.meta, engine)
        if key == self._key:
            return
        self._key, self.loading, self.ready, self.error = key, True, False, None
        meta = index.meta
        stage = inference.loading_stage(meta.config(), engine)  # says when it is the one-time export
        self.changed.emit(f"{stage[:1].upper()}{stage[1:]}…" if inference.first_use(meta.config(), engine)
                          else f"Loading the network ({meta.name})…")
        self._job = workers.start(lambda: inference.extractor_for_meta(meta, engine=engine),
                                  on_result=lambda _ext, key=key: self._loaded(key, None),
                                  on_error=lambda exc, key=key: self._loaded(key, exc))

    def _loaded(self, key: tuple, exc: BaseException | None) -> None:
        if key != self._key:
            return  # another index (or engine) since: its own load reports
        from museum_search.gui.workers import error_message

        self.loading, self.ready = False, exc is None
        self.error = None if exc is None else error_message(exc)
        self._job = None
        self.changed.emit("" if exc is None else f"The network could not be loaded: {self.error}")

    def shutdown(self) -> None:
        if self._job is not None and self._job.running:
            self._job.cancel()


class MainWindow(QMainWindow):
    """The application window. ``lazy=True``: the tabs are built after the window shows and the
    network of each index is loaded in the background (see the module docstring)."""

    def __init__(self, state: AppState | None = None, camera_factory=None, *, lazy: bool = False):
        super().__init__()
        self.state = state or AppState()
        self._camera_factory = camera_factory
        self._demo = None  # the kiosk while it runs (this window is hidden meanwhile)
        self._quit_confirmed = False  # staff said "quit and cancel" while a job ran
        self._quit_box: QMessageBox | None = None
        self._built: dict[str, QWidget] = {}  # the tabs built so far, by attribute name
        self._ready = False  # the Collection and Search tabs built (lazy: some time after the window shows)
        self._when_ready: list[Callable[[], None]] = []
        self._lazy = lazy
        self._opening: Path | None = None  # the index read on a worker (open_index_in_background)
        self._open_job: Any = None
        self._closed = False  # closed for good: what is still loading is not wanted
        self._groups_imported = 0  # of HEAVY_MODULES, by the background thread
        self.setWindowTitle("museum-search")
        self.setWindowIcon(app_icon())
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for _attr, _module, _cls, title in TABS:
            self.tabs.addTab(_LoadingPage(f"the {title.replace('&', '')} tab"), title)
        self.setCentralWidget(self.tabs)
        self.tabs.currentChanged.connect(self._tab_chosen)
        self.status_label = QLabel("No index open. Open an index or build one in the Collection tab.")
        self.statusBar().addWidget(self.status_label, 1)
        self.network_label = QLabel("")
        self.network_label.setObjectName("networkStatus")
        self.network_bar = QProgressBar()
        self.network_bar.setRange(0, 0)
        self.network_bar.setMaximumWidth(100)
        self.network_bar.setTextVisible(False)
        self.statusBar().addPermanentWidget(self.network_label)
        self.statusBar().addPermanentWidget(self.network_bar)
        self.network_label.hide()
        self.network_bar.hide()
        self.state.status.connect(self.status_label.setText)
        self.state.index_changed.connect(self._index_changed)
        self.network: NetworkLoader | None = None
        if lazy:
            self.network = NetworkLoader(self.state, self)
            self.network.changed.connect(self._network_changed)
        self._build_menu()
        restore_geometry(self, self.state.settings)
        self._kept_on_screen = False
        self._importer: _Importer | None = None
        if not lazy:
            for attr, *_rest in TABS:
                self._tab(attr)
            self._set_ready()

    # ---- the tabs, built at once or after the window shows ---------------------------------
    @property
    def collection_tab(self):
        return self._tab("collection_tab")

    @property
    def search_tab(self):
        return self._tab("search_tab")

    @property
    def evaluation_tab(self):
        return self._tab("evaluation_tab")

    @property
    def visitors_tab(self):
        return self._tab("visitors_tab")

    @property
    def ready(self) -> bool:
        """True once the Collection and Search tabs are built (a lazy window: some time after it shows;
        the Evaluation tab follows, or is built when chosen)."""
        return self._ready

    @property
    def all_tabs_built(self) -> bool:
        return len(self._built) == len(TABS)

    def when_ready(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once :attr:`ready` (now if it is)."""
        if self._ready:
            fn()
        else:
            self._when_ready.append(fn)

    def _tab(self, attr: str) -> QWidget:
        """The tab named ``attr``, built now if it is not yet (in place of its loading page)."""
        tab = self._built.get(attr)
        if tab is not None:
            return tab
        i = next(i for i, spec in enumerate(TABS) if spec[0] == attr)
        _attr, module, cls, title = TABS[i]
        kind = getattr(importlib.import_module(f"{__package__}.{module}"), cls)
        extra = {"camera_factory": self._camera_factory} if attr == "search_tab" else {}
        tab = kind(self.state, self, **extra)
        self._built[attr] = tab
        current = self.tabs.currentIndex()
        page = self.tabs.widget(i)
        self.tabs.removeTab(i)
        self.tabs.insertTab(i, tab, title)
        self.tabs.setCurrentIndex(current)
        if page is not None and not isinstance(page, type(tab)):
            page.deleteLater()
        return tab

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._kept_on_screen:  # the first show: once the window manager framed it
            self._kept_on_screen = True
            QTimer.singleShot(300, self, lambda: keep_on_screen(self))
        if self._lazy and self._importer is None:
            self._importer = _Importer(self)
            self._importer.done.connect(self._imported)
            # after the window has been painted: the thread then shares the GIL with an idle GUI
            QTimer.singleShot(0, lambda: self._importer.start(HEAVY_MODULES))

    def _imported(self, group: int) -> None:
        self._groups_imported = max(self._groups_imported, group + 1)
        if self._closed:
            return
        if group == 0:  # the shown tab first (the Collection tab, unless one was chosen meanwhile)
            first = [TABS[self.tabs.currentIndex()][0]]
            self._build_in_turn(first + [a for a in ("collection_tab", "search_tab") if a not in first])
        else:
            self._tab_chosen(self.tabs.currentIndex())

    def _tab_chosen(self, i: int) -> None:
        """A tab still loading was chosen: built as soon as its modules are imported (once its
        loading page has been painted)."""
        if not self._lazy or self._closed or i < 0 or TABS[i][0] in self._built:
            return
        group = 1 if TABS[i][0] in ("evaluation_tab", "visitors_tab") else 0
        if self._groups_imported > group:
            QTimer.singleShot(0, lambda: self._build_in_turn([TABS[i][0]]) if self.tabs.currentIndex() == i else None)

    def _build_in_turn(self, attrs: list[str]) -> None:
        """Build the tabs one per event-loop turn (the window answers between them)."""
        if self._closed:
            return
        if attrs:
            self._tab(attrs[0])
            QTimer.singleShot(0, lambda: self._build_in_turn(attrs[1:]))
        elif not self._ready and {"collection_tab", "search_tab"} <= set(self._built):
            self._set_ready()

    def _set_ready(self) -> None:
        if self._ready:
            return
        self._ready = True
        calls, self._when_ready = self._when_ready, []
        for fn in calls:
            fn()

    # ---- menu ------------------------------------------------------------------------------
    def _build_menu(self) -> None:
        m = self.menuBar().addMenu("&File")
        a = QAction("Open &collection folder…", self, shortcut=QKeySequence("Ctrl+Shift+O"))
        a.triggered.connect(self._open_collection)
        m.addAction(a)
        a = QAction("&Open index…", self, shortcut=QKeySequence.StandardKey.Open)
        a.triggered.connect(self._open_index_dialog)
        m.addAction(a)
        self.recent_menu = m.addMenu("Recent indexes")
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        m.addSeparator()
        a = QAction("&Settings…", self, shortcut=QKeySequence("Ctrl+,"))
        a.triggered.connect(self._settings_dialog)
        m.addAction(a)
        a = QAction("&Demo mode (kiosk)", self, shortcut=QKeySequence("F11"))
        a.triggered.connect(self._start_demo)
        m.addAction(a)
        m.addSeparator()
        a = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        a.triggered.connect(self.close)
        m.addAction(a)
        v = self.menuBar().addMenu("&View")
        for i, name in enumerate(("Collection", "Search", "Evaluation", "Visitors")):
            a = QAction(name, self, shortcut=QKeySequence(f"Ctrl+{i + 1}"))
            a.triggered.connect(lambda _=False, i=i: self.tabs.setCurrentIndex(i))
            v.addAction(a)
        h = self.menuBar().addMenu("&Help")
        a = QAction("&About museum-search", self)
        a.triggered.connect(self._about)
        h.addAction(a)

    def _settings_dialog(self) -> None:
        dialog = SettingsDialog(self.state, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # not one kept per opening
        dialog.exec()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = self.state.settings.recent_indexes()
        if not recent:
            self.recent_menu.addAction("(none)").setEnabled(False)
        for p in recent:
            a = self.recent_menu.addAction(p)
            a.triggered.connect(lambda _=False, p=p: self.open_index(p))

    def _open_collection(self) -> None:
        self.tabs.setCurrentWidget(self.collection_tab)
        self.collection_tab.choose_collection()

    def _open_index_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open index folder")
        if path:
            self.open_index(path)

    def open_index(self, path: str | Path) -> bool:
        """Open the index at ``path`` (True when it is open now). An index of an older format is
        offered for conversion, and opened once converted (:func:`.upgrade.open_index`)."""
        from museum_search.gui import upgrade

        self._opening = None  # an index still being read in the background is not wanted any more
        return upgrade.open_index(self, path, self.state.set_index)

    def reopen_last_index(self) -> Path | None:
        """A plain start: open the index used last (File → Recent's first that is still there), quietly
        (a status line, no dialog, when it cannot be read any more). Returns its folder, or None."""
        from museum_search.core.index import MANIFEST

        for text in self.state.settings.recent_indexes():
            path = Path(text)
            if (path / MANIFEST).is_file():
                self.open_index_in_background(path, quiet=True)
                return path
        return None

    def open_index_in_background(self, path: str | Path, *, quiet: bool = False) -> None:
        """Read the index at ``path`` on a worker and open it when read (the window stays usable
        meanwhile). If it cannot be read, :meth:`open_index` opens it here: the same error dialog,
        or the offer to convert an index of an older format (``quiet``: the status bar says it could
        not be opened, and nothing else happens)."""
        from museum_search.core.index import Index
        from museum_search.gui import workers

        path = Path(path)
        self._opening = path
        self.state.status.emit(f"Opening the index {path}…")

        def opened(index) -> None:
            if self._opening == path:
                self._opening = None
                self.state.set_index(index)

        def failed(exc: BaseException) -> None:
            if self._opening == path and quiet:
                self._opening = None
                self.state.status.emit(f"The index used last ({path}) could not be opened: {exc}. "
                                       "Open it with File → Open index… to see why.")
            elif self._opening == path:
                self.open_index(path)

        self._open_job = workers.start(lambda: Index.load(path), on_result=opened, on_error=failed)

    def _network_changed(self, text: str) -> None:
        self.network_label.setText(text)
        self.network_label.setToolTip(text)
        self.network_label.setVisible(bool(text))
        self.network_bar.setVisible(self.network is not None and self.network.loading)

    def _index_changed(self, index) -> None:
        self.setWindowTitle(f"museum-search — {index.path}" if index is not None and index.path else "museum-search")

    @property
    def demo(self):
        """The kiosk while it runs (None otherwise)."""
        return self._demo

    def _start_demo(self) -> None:
        if self._demo is not None:
            self._demo.raise_()
            self._demo.activateWindow()
            return
        if self.state.index is None:
            show_error(self, "Demo mode", "Open or build an index first.")
            return
        try:
            from museum_search.gui.demo_window import DemoWindow
        except ImportError:
            show_error(self, "Demo mode", "Demo mode is not available in this build.")
            return
        demo = DemoWindow(self.state.index, self.state.settings, self._camera_factory, engine=self.state.engine)
        demo.setAttribute(Qt.WidgetAttribute.WA_QuitOnClose, False)  # leaving the kiosk brings this window back
        demo.left.connect(self._demo_left)
        self._demo = demo
        self.hide()  # the admin window is not reachable while the kiosk runs (the kiosk hides the others)
        demo.showFullScreen()

    def _demo_left(self) -> None:
        """Staff left the kiosk: this window again."""
        demo, self._demo = self._demo, None
        if demo is not None:
            demo.deleteLater()
        self.show()
        self.raise_()
        self.activateWindow()

    def _about(self) -> None:
        QMessageBox.about(
            self, "About museum-search",
            f"<b>museum-search {__version__}</b><p>Instance search for museum and heritage collections: "
            "CNN descriptors, ICFRR re-ranking, MP@1 / MAP / MNRO evaluation.</p>",
        )

    def busy_text(self) -> str | None:
        """What quitting now would cancel, as a sentence ("A build is running"), or None."""
        tab = self._built.get("collection_tab")
        if getattr(tab, "running", False):
            return "An update of the index is running" if getattr(tab, "_job_kind", "") == "update" \
                else "A build is running"
        tab = self._built.get("visitors_tab")
        if tab is not None and tab.busy_text():
            return tab.busy_text()
        tab = self._built.get("evaluation_tab")
        if tab is not None and tab.is_running():
            kind = getattr(tab, "_job_kind", "")
            if kind == "sweep":
                return "An ICFRR sweep is running"
            if kind != "verdict":  # storing a verdict is short, and not cancelled: quitting waits for it
                return "An evaluation is running"
        return None

    def _ask_quit(self, busy: str) -> None:
        """Ask whether to quit and cancel the running job; quit when the answer is yes."""
        if self._quit_box is not None:
            self._quit_box.raise_()
            self._quit_box.activateWindow()
            return
        box = QMessageBox(QMessageBox.Icon.Question, "Quit museum-search",
                          f"{busy}; quit and cancel it?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, self)
        box.setObjectName("quitWhileBusyDialog")
        box.setInformativeText("The work done so far is lost; the index on disk stays as it was.")
        quit_button = box.button(QMessageBox.StandardButton.Yes)
        quit_button.setText("Quit and cancel")
        box.button(QMessageBox.StandardButton.No).setText("Keep working")
        box.setDefaultButton(QMessageBox.StandardButton.No)
        box.setEscapeButton(QMessageBox.StandardButton.No)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._quit_box = box

        def answered(_result: int) -> None:
            self._quit_box = None
            if box.clickedButton() is quit_button:
                self._quit_confirmed = True
                self.close()

        box.finished.connect(answered)
        box.open()

    def closeEvent(self, event) -> None:
        busy = None if self._quit_confirmed else self.busy_text()
        if busy is not None:
            event.ignore()  # asked first; closed again when the answer is yes
            self._ask_quit(busy)
            return
        if self._demo is not None:  # closed by code while the kiosk runs: the kiosk goes too
            demo, self._demo = self._demo, None
            demo.left.disconnect(self._demo_left)
            demo.shutdown()
            demo.close()
            demo.deleteLater()
        self._closed = True
        save_geometry(self, self.state.settings)
        self.state.settings.q.remove("window/geometry")  # the saveGeometry() of earlier versions
        self._opening = None
        if "museum_search.gui.upgrade" in sys.modules:  # else no conversion was ever offered
            sys.modules["museum_search.gui.upgrade"].cancel_all()
        if self.network is not None:
            self.network.shutdown()
        for tab in list(self._built.values()):
            shutdown = getattr(tab, "shutdown", None)
            if shutdown is not None:
                shutdown()
        super().closeEvent(event)
