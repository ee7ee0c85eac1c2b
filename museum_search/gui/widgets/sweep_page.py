"""The Evaluation tab's ICFRR sweep page: the parameter and its values, Run / Cancel, core's
warning when ICFRR cannot help, the status, and the sweep's plot beside its table."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.evaluation import HEADLINE_METRICS
from museum_search.gui.widgets.layout import row, split
from museum_search.gui.widgets.plots import SweepPlot

WARNING_STYLE = ("QLabel { color: #8a5300; background: #fff4e0; border: 1px solid #e0b060; border-radius: 3px; "
                 "padding: 4px; }")
#: The values a parameter starts with (replaced when the parameter changes, unless edited).
DEFAULT_VALUES = {"k": "1:5", "beta": "0:1:0.25"}
IDLE = "Other ICFRR settings, query regions and verification: the controls on the left."
#: The table's columns after the value: core's headline metrics (MP@1, MAP, AMNRO, GAP).
COLUMNS = tuple(m.label for m in HEADLINE_METRICS.values())


def warning_label(name: str) -> QLabel:
    """A hidden warning label (core's ICFRR advice) named ``name``."""
    label = QLabel("")
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setStyleSheet(WARNING_STYLE)
    label.hide()
    return label


class SweepPage(QWidget):
    """``sweepPage``: see the module docstring."""

    #: the swept parameter changed ("k" or "beta")
    parameter_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sweepPage")
        self.param_combo = QComboBox()
        self.param_combo.setObjectName("sweepParameter")
        self.param_combo.addItem("K_q = K_g", "k")
        self.param_combo.addItem("β", "beta")
        self.param_combo.currentIndexChanged.connect(self._param_changed)
        self.values_edit = QLineEdit(DEFAULT_VALUES["k"])
        self.values_edit.setObjectName("sweepValues")
        self.values_edit.setToolTip("Values: 1,2,5 or a range start:stop:step (stop included)")
        self.run_button = QPushButton("Run sweep")
        self.run_button.setObjectName("runSweep")
        self.run_button.setToolTip("Evaluate ICFRR at each value; the other ICFRR settings, query regions and "
                                   "verification come from the controls on the left. The queries are described once.")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelSweep")
        self.cancel_button.setEnabled(False)
        self.warning = warning_label("sweepWarning")
        self.status = QLabel(IDLE)
        self.status.setObjectName("sweepStatus")
        self.status.setWordWrap(True)
        self.plot = SweepPlot()
        self.plot.setObjectName("sweepPlot")
        self.table = QTableWidget(0, 1 + len(COLUMNS))
        self.table.setObjectName("sweepTable")
        self._set_header("Value")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumWidth(260)
        self.table.setMaximumWidth(360)
        lay = QVBoxLayout(self)
        lay.addLayout(row("Sweep", self.param_combo, "over", (self.values_edit, 1), self.run_button,
                          self.cancel_button))
        lay.addWidget(self.warning)
        lay.addWidget(self.status)
        lay.addWidget(split(Qt.Orientation.Horizontal, (self.plot, 3, 700), (self.table, 1, 300)), 1)

    def parameter(self) -> str:
        return self.param_combo.currentData()

    def set_parameter(self, parameter: str) -> None:
        self.param_combo.setCurrentIndex(max(0, self.param_combo.findData(parameter)))

    def set_warning(self, advice: str | None) -> None:
        self.warning.setText(f"⚠ {advice}" if advice else "")
        self.warning.setVisible(bool(advice))

    def start(self, label: str, integer: bool) -> None:
        """A new sweep of the parameter named ``label``: empty plot and table."""
        self.plot.start(label, integer=integer)
        self.table.setRowCount(0)
        self._set_header(label)

    def _set_header(self, label: str) -> None:
        """The value column named ``label``, then the metrics (with their tooltips)."""
        self.table.setHorizontalHeaderLabels([label, *COLUMNS])
        for c, m in enumerate(HEADLINE_METRICS.values(), start=1):
            if m.tip:
                self.table.horizontalHeaderItem(c).setToolTip(m.tip)

    def add_row(self, value: float, summary: dict) -> None:
        """The summary of one value, on the plot and in the table."""
        self.plot.add_point(value, summary)
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, text in enumerate((f"{value:g}", *(m.text(summary[key]) for key, m in HEADLINE_METRICS.items()))):
            item = QTableWidgetItem(text)
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(r, c, item)

    def _param_changed(self, _i: int) -> None:
        text = self.values_edit.text().strip()
        if not text or text in DEFAULT_VALUES.values():
            self.values_edit.setText(DEFAULT_VALUES[self.parameter()])
        self.parameter_changed.emit(self.parameter())
