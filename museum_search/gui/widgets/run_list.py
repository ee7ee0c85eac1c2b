"""The Evaluation tab's list of finished runs: ticked runs are compared, the selected one fills the
plots and the table; below it, removing the selected run and exporting it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from museum_search.gui.widgets.layout import row

KEY_ROLE = Qt.ItemDataRole.UserRole


def name_lines(name: str) -> str:
    """A run's name on two lines: the query set, then the settings and the time (the run list and
    the comparison table wrap it further when narrow; nothing is elided)."""
    head, sep, rest = name.partition(" · ")
    return f"{head}\n{rest}" if sep else name


def colour_icon(colour: str) -> QIcon:
    """A 12 px square of ``colour`` (a run's colour in the plots)."""
    pm = QPixmap(12, 12)
    pm.fill(QColor(colour))
    return QIcon(pm)


class RunList(QGroupBox):
    """The runs by key (an int), with their colour, name and tooltip."""

    #: the selected run's key (None: no run selected)
    current_changed = Signal(object)
    #: a run was ticked or unticked
    checked_changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Runs", parent)
        self.list = QListWidget()
        self.list.setObjectName("runsList")
        self.list.setToolTip("Ticked runs are compared; the selected run fills the plots and the table")
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.currentItemChanged.connect(
            lambda current, _previous: self.current_changed.emit(current.data(KEY_ROLE) if current else None))
        self.list.itemChanged.connect(lambda _item: self.checked_changed.emit())
        self.list.setMinimumHeight(70)
        # whole names: wrapped to the list's width, never elided (and in full in the tooltips)
        self.list.setWordWrap(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.list.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # the settings above take their height first; the list gets the rest (at least 70 px)
        self.list.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.remove_button = QPushButton("Remove")
        self.export_json_button = QPushButton("Export JSON…")
        self.export_json_button.setToolTip("Summary, 95 % intervals and per-query results of the selected run")
        self.export_csv_button = QPushButton("Export CSV…")
        self.export_csv_button.setToolTip("One line per query of the selected run")
        lay = QVBoxLayout(self)
        lay.addWidget(self.list, 1)
        lay.addLayout(row(self.remove_button, None, self.export_json_button, self.export_csv_button))

    def add(self, key: int, colour: str, text: str, tooltip: str) -> None:
        """Add a run, ticked (no signal); ``text``: its name (shown whole, :func:`name_lines`)."""
        item = QListWidgetItem(colour_icon(colour), name_lines(text))
        item.setData(KEY_ROLE, key)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setToolTip(tooltip)
        self.list.blockSignals(True)
        item.setCheckState(Qt.CheckState.Checked)
        self.list.addItem(item)
        self.list.blockSignals(False)

    def remove(self, key: int) -> None:
        """Remove the run ``key`` (no signal)."""
        self.list.blockSignals(True)
        self.list.takeItem(self.row(key))
        self.list.blockSignals(False)

    def row(self, key: int | None) -> int:
        """The row of the run ``key`` (-1: none)."""
        keys = (self.list.item(i).data(KEY_ROLE) for i in range(self.list.count()))
        return next((i for i, k in enumerate(keys) if key is not None and k == key), -1)

    def select(self, key: int | None) -> bool:
        """Make the run ``key`` the current one; True when that changed the current row (then
        :attr:`current_changed` has been emitted)."""
        i = self.row(key)
        if i >= 0 and self.list.currentRow() != i:
            self.list.setCurrentRow(i)
            return True
        return False

    def checked_keys(self) -> list[int]:
        """The ticked runs' keys, in list order."""
        items = (self.list.item(i) for i in range(self.list.count()))
        return [it.data(KEY_ROLE) for it in items if it.checkState() == Qt.CheckState.Checked]

    def set_checked(self, key: int, checked: bool) -> None:
        item = self.list.item(self.row(key))
        if item is not None:
            item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)

    def set_actions_enabled(self, on: bool) -> None:
        """Remove and the exports (a run is selected and no job runs)."""
        for w in (self.export_json_button, self.export_csv_button, self.remove_button):
            w.setEnabled(on)
