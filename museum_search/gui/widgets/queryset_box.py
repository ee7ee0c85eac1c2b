"""The Evaluation tab's "Labelled queries" box: the folder, how its photos are labelled (a layout
of ``core.evaluation.querysets``, or a regular expression), what was detected, and whether query
regions are described."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QGridLayout, QGroupBox, QLabel, QLineEdit, QPushButton, QWidget

from museum_search.core.evaluation import LAYOUTS

LAYOUT_LABELS = {
    "auto": "Auto-detect",
    "clicide": "CLICIDE (test/<label>-<k>)",
    "garofou": "GaRoFou (TEST_I/)",
    "folder": "One folder per instance",
    "csv": "ground_truth.csv",
    "regex": "Regular expression",
}


class QuerySetBox(QGroupBox):
    """The query set's inputs; :attr:`reload_requested` when they ask for the set to be loaded again."""

    #: Enter in the folder or the expression, or another layout: load the query set again
    reload_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Labelled queries", parent)
        self.path_edit = QLineEdit()
        self.path_edit.setObjectName("querysetPath")
        self.path_edit.setPlaceholderText("Folder of labelled query photos")
        self.path_edit.returnPressed.connect(lambda: self.reload_requested.emit())
        self.browse_button = QPushButton("Browse…")
        self.layout_combo = QComboBox()
        self.layout_combo.setObjectName("layoutCombo")
        for key in LAYOUTS:
            self.layout_combo.addItem(LAYOUT_LABELS.get(key, key), key)
        self.layout_combo.setToolTip("How query photos are labelled; auto-detect recognises CLICIDE, GaRoFou, "
                                     "one folder per instance and a ground_truth.csv")
        self.layout_combo.currentIndexChanged.connect(self._layout_changed)
        self.regex_edit = QLineEdit()
        self.regex_edit.setPlaceholderText(r"e.g. (?P<instance>[^/]+)/[^/]+$")
        self.regex_edit.setToolTip("A regular expression with a group named 'instance', searched in the relative path")
        self.regex_edit.returnPressed.connect(lambda: self.reload_requested.emit())
        self.regex_edit.hide()
        self.regions_check = QCheckBox("Describe query regions (best of 5 crops)")
        self.regions_check.setObjectName("queryRegions")
        self.regions_check.setChecked(True)
        self.regions_check.setToolTip("As the Search tab does: a reference's score is its best over the whole "
                                      "photo and four large crops. Untick for the papers' protocol (whole image).")
        self.detected_label = QLabel("No query set.")
        self.detected_label.setObjectName("detectedLabel")
        self.detected_label.setWordWrap(True)
        grid = QGridLayout(self)
        grid.addWidget(self.path_edit, 0, 0, 1, 2)
        grid.addWidget(self.browse_button, 0, 2)
        grid.addWidget(QLabel("Layout:"), 1, 0)
        grid.addWidget(self.layout_combo, 1, 1, 1, 2)
        grid.addWidget(self.regex_edit, 2, 0, 1, 3)
        grid.addWidget(self.detected_label, 3, 0, 1, 3)
        grid.addWidget(self.regions_check, 4, 0, 1, 3)
        grid.setColumnStretch(1, 1)

    def layout_name(self) -> str:
        """The chosen layout (a key of ``querysets.LAYOUTS``)."""
        return self.layout_combo.currentData()

    def set_layout_name(self, layout: str) -> bool:
        """Choose ``layout`` without reloading (False: unknown)."""
        i = self.layout_combo.findData(layout)
        if i < 0:
            return False
        self.layout_combo.blockSignals(True)
        self.layout_combo.setCurrentIndex(i)
        self.layout_combo.blockSignals(False)
        self.regex_edit.setVisible(layout == "regex")
        return True

    def regex(self) -> str | None:
        return self.regex_edit.text().strip() or None

    def set_busy(self, busy: bool) -> None:
        for w in (self.browse_button, self.layout_combo, self.path_edit, self.regions_check, self.regex_edit):
            w.setEnabled(not busy)

    def _layout_changed(self, _i: int) -> None:
        self.regex_edit.setVisible(self.layout_name() == "regex")
        if self.layout_name() != "regex" or self.regex_edit.text().strip():
            self.reload_requested.emit()
