"""The progress area of a long job (building an index, an evaluation): the job's buttons above a
progress bar, optionally a line naming the current item, and the status in words.

:class:`FittingLine` is a one-line label that shows the longest of several wordings of the same
news that fits its width (chosen again when it is resized), so what matters is never cut away."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QVBoxLayout, QWidget


class FittingLine(QLabel):
    """One line of text: :meth:`set_texts` gives wordings from the longest to the shortest, and the
    label shows the first that fits its width (the last one, cut at the right, when none does).
    Put what must stay visible in every wording (a count, the time left) and leave the details to
    the longer ones and the tooltip. ``setText`` shows a single wording."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._texts: tuple[str, ...] = (text,)
        # its width comes from the layout, not from the text (a long wording must not widen the panel)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(1)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self._fit()

    def set_texts(self, texts: Sequence[str]) -> None:
        self._texts = tuple(t for t in texts if t) or ("",)
        self._fit()

    def setText(self, text: str) -> None:
        self.set_texts([text])

    def full_text(self) -> str:
        """The longest wording (what :meth:`text` shows when there is room)."""
        return self._texts[0]

    def fits(self, text: str) -> bool:
        return self.fontMetrics().horizontalAdvance(text) <= self.contentsRect().width()

    def _fit(self) -> None:
        shown = next((t for t in self._texts if self.fits(t)), None)
        if shown is None:
            shown = self.fontMetrics().elidedText(self._texts[-1], Qt.TextElideMode.ElideRight,
                                                  max(0, self.contentsRect().width()))
        if shown != super().text():
            super().setText(shown)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit()


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
