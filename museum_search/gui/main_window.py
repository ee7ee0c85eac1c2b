"""The main window: Collection, Search and Evaluation tabs, menu, status bar, shortcuts."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QKeySequenceEdit, QLabel,
    QMainWindow, QMessageBox, QSpinBox, QTabWidget, QWidget,
)

from .. import __version__
from ..core.paths import resource
from .demo_window import EXIT_KEYS_SETTING
from . import upgrade
from .state import AppState
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
        self.exit_keys = QKeySequenceEdit(QKeySequence(str(state.settings.value(EXIT_KEYS_SETTING, "") or "")))
        self.exit_keys.setClearButtonEnabled(True)
        self.exit_keys.setToolTip("Demo mode: the only key combination that leaves it (e.g. Ctrl+Shift+Q), so "
                                  "visitors cannot quit. Empty: Esc leaves.")
        form.addRow("Demo exit keys:", self.exit_keys)
        from ..core import engines

        self.engine = QComboBox()
        self.engine.addItem(f"Automatic ({engines.default()})", "auto")
        self.engine.addItem("ONNX Runtime" + ("" if engines.onnx_available() else " (not installed)"), "onnx")
        self.engine.addItem("PyTorch" + ("" if engines.torch_available() else " (not installed)"), "torch")
        self.engine.setCurrentIndex(max(0, self.engine.findData(state.settings.engine)))
        self.engine.setToolTip("What runs the network. ONNX Runtime is about 4x faster on a CPU; both give the "
                               "same descriptors, so an index built with one is searched with the other.")
        form.addRow("Inference engine:", self.engine)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def accept(self) -> None:
        self.state.settings.camera = self.camera.value()
        self.state.settings.set_value(EXIT_KEYS_SETTING, self.exit_keys.keySequence().toString())
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

    def _start_demo(self) -> None:
        if self.state.index is None:
            show_error(self, "Demo mode", "Open or build an index first.")
            return
        try:
            from .demo_window import DemoWindow
        except ImportError:
            show_error(self, "Demo mode", "Demo mode is not available in this build.")
            return
        self._demo = DemoWindow(self.state.index, self.state.settings)
        self._demo.showFullScreen()

    def _about(self) -> None:
        QMessageBox.about(
            self, "About museum-search",
            f"<b>museum-search {__version__}</b><p>Instance search for museum and heritage collections: "
            "CNN descriptors, ICFRR re-ranking, MP@1 / MAP / MNRO evaluation.</p>",
        )

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        self.state.settings.set_value("window/geometry", self.saveGeometry())
        upgrade.cancel_all()
        for tab in (self.collection_tab, self.search_tab, self.evaluation_tab):
            shutdown = getattr(tab, "shutdown", None)
            if shutdown is not None:
                shutdown()
        super().closeEvent(event)
