"""The progress area of a long job (building an index, an evaluation): the job's buttons above a
progress bar, optionally a line naming the current item, and the status in words."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QVBoxLayout, QWidget


class ProgressPanel(QWidget):
    """``buttons`` (a row the tab made: start, cancel …) over :attr:`bar` and :attr:`status_label`;
    ``item_label``: a line between them naming what is being done (the Collection tab's file)."""

    def __init__(self, buttons: QHBoxLayout, bar_name: str, status_name: str, item_label: QWidget | None = None,
                 selectable: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setObjectName(bar_name)
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.item_label = item_label
        self.status_label = QLabel("")
        self.status_label.setObjectName(status_name)
        self.status_label.setWordWrap(True)
        if selectable:
            self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(buttons)
        lay.addWidget(self.bar)
        if item_label is not None:
            lay.addWidget(item_label)
        lay.addWidget(self.status_label)

    def set_status(self, text: str) -> None:
        self.status_label.setText(text)

    def status(self) -> str:
        return self.status_label.text()

    def set_busy(self) -> None:
        """A job of unknown length is running (the bar moves to and fro)."""
        self.bar.setRange(0, 0)

    def set_step(self, done: int, total: int) -> None:
        """``done`` of ``total`` (a total of 0 or less leaves the bar as it is)."""
        if total <= 0:
            return
        if self.bar.maximum() != total:
            self.bar.setRange(0, total)
        self.bar.setValue(done)

    def stop_busy(self) -> None:
        """The job ended: a busy bar becomes an idle one (a counted bar keeps its count)."""
        if self.bar.maximum() == 0:
            self.bar.setRange(0, 1)
