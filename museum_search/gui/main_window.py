"""The main window: Collection, Search and Evaluation tabs, menu, status bar, shortcuts."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QRegularExpression, Qt
from PySide6.QtGui import QAction, QIcon, QKeySequence, QRegularExpressionValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QKeySequenceEdit,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QSpinBox,
    QTabWidget,
    QWidget,
)

from .. import __version__
from ..core.paths import resource
from . import upgrade
from .demo_window import DEFAULT_EXIT_KEYS, EXIT_KEYS_SETTING, lock_summary
from .state import AppState, phone_link_problem
from .workers import show_error


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
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _add_kiosk_rows(self, form: QFormLayout) -> None:
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
        return not problem

    def _add_engine_rows(self, form: QFormLayout) -> None:
        """The inference engine and the matcher of new indexes."""
        from ..core import engines

        state = self.state
        self.engine = QComboBox()
        self.engine.addItem(f"Automatic ({engines.default()})", "auto")
        self.engine.addItem("ONNX Runtime" + ("" if engines.onnx_available() else " (not installed)"), "onnx")
        self.engine.addItem("PyTorch" + ("" if engines.torch_available() else " (not installed)"), "torch")
        self.engine.setCurrentIndex(max(0, self.engine.findData(state.settings.engine)))
        self.engine.setToolTip("What runs the network. ONNX Runtime is about 4x faster on a CPU; both give the "
                               "same descriptors, so an index built with one is searched with the other.")
        form.addRow("Inference engine:", self.engine)
        from ..core.rerank import xfeat

        self.matcher = QComboBox()
        self.matcher.addItem("SIFT", "sift")
        self.matcher.addItem("XFeat (learned)" + ("" if xfeat.available() else " (not installed)"), "xfeat")
        self.matcher.addItem("Automatic (both calibrated, the better kept; slower builds)", "auto")
        self.matcher.setCurrentIndex(max(0, self.matcher.findData(state.settings.matcher)))
        self.matcher.setToolTip("The local features that verify answers, stored with each new index (an update "
                                "keeps the index's own). XFeat, a learned matcher, finds matching points on dark "
                                "or textureless works and on small photos of objects where SIFT finds few; "
                                "Automatic computes both, calibrates the verdict with each on the collection's own "
                                "views and keeps the better (a build takes about twice as long).")
        form.addRow("Matcher for new indexes:", self.matcher)

    def _pin_after(self) -> bool:
        """Whether a PIN will be set once these settings are saved."""
        if self.pin.text():
            return True
        return self.state.settings.demo_pin_set and not self.clear_pin.isChecked()

    def _update_kiosk_help(self, *_args) -> None:
        keys = self.exit_keys.keySequence().toString(QKeySequence.SequenceFormat.NativeText)
        self.kiosk_help.setText(lock_summary(keys, self._pin_after()))
        self.pin_error.hide()

    def accept(self) -> None:
        pin = self.pin.text()
        if pin and not 4 <= len(pin) <= 12:
            self.pin_error.setText("The PIN needs 4 to 12 digits.")
            self.pin_error.show()
            self.pin.setFocus()
            return
        if not self._check_phone_link():
            self.qr_url.setFocus()
            return
        self.state.settings.camera = self.camera.value()
        self.state.settings.demo_qr_url = self.qr_url.text()
        self.state.settings.set_value(EXIT_KEYS_SETTING, self.exit_keys.keySequence().toString())
        if pin:
            self.state.settings.set_demo_pin(pin)
        elif self.clear_pin.isChecked():
            self.state.settings.set_demo_pin(None)
        if self.matcher.currentData() != self.state.settings.matcher:
            self.state.settings.matcher = self.matcher.currentData()
            self.state.settings.apply_matcher()
        if self.engine.currentData() != self.state.settings.engine:
            self.state.settings.engine = self.engine.currentData()
            self.state.settings.apply_engine()
            if self.state.index is not None:  # the views build their pipelines again, on the new engine
                self.state.set_index(self.state.index)
        super().accept()


class MainWindow(QMainWindow):
    def __init__(self, state: AppState | None = None, camera_factory=None):
        super().__init__()
        from .collection_tab import CollectionTab
        from .evaluation_tab import EvaluationTab
        from .search_tab import SearchTab

        self.state = state or AppState()
        self._camera_factory = camera_factory
        self._demo = None  # the kiosk while it runs (this window is hidden meanwhile)
        self._quit_confirmed = False  # staff said "quit and cancel" while a job ran
        self._quit_box: QMessageBox | None = None
        self.setWindowTitle("museum-search")
        self.setWindowIcon(app_icon())
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.collection_tab = CollectionTab(self.state, self)
        self.search_tab = SearchTab(self.state, self, camera_factory=camera_factory)
        self.evaluation_tab = EvaluationTab(self.state, self)
        self.tabs.addTab(self.collection_tab, "&Collection")
        self.tabs.addTab(self.search_tab, "&Search")
        self.tabs.addTab(self.evaluation_tab, "&Evaluation")
        self.setCentralWidget(self.tabs)
        self.status_label = QLabel("No index open. Open an index or build one in the Collection tab.")
        self.statusBar().addWidget(self.status_label, 1)
        self.state.status.connect(self.status_label.setText)
        self.state.index_changed.connect(self._index_changed)
        self._build_menu()
        geometry = self.state.settings.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 820)

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
        for i, name in enumerate(("Collection", "Search", "Evaluation")):
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
        return upgrade.open_index(self, path, self.state.set_index)

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
            from .demo_window import DemoWindow
        except ImportError:
            show_error(self, "Demo mode", "Demo mode is not available in this build.")
            return
        demo = DemoWindow(self.state.index, self.state.settings, self._camera_factory)
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
        tab = self.collection_tab
        if getattr(tab, "running", False):
            return "An update of the index is running" if getattr(tab, "_job_kind", "") == "update" \
                else "A build is running"
        tab = self.evaluation_tab
        if tab.is_running():
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
        self.state.settings.set_value("window/geometry", self.saveGeometry())
        upgrade.cancel_all()
        for tab in (self.collection_tab, self.search_tab, self.evaluation_tab):
            shutdown = getattr(tab, "shutdown", None)
            if shutdown is not None:
                shutdown()
        super().closeEvent(event)
