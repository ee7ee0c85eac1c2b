"""Small layout helpers shared by the tabs' widgets: a row of widgets, a splitter, a scroll area
as tall as its contents."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSplitter, QVBoxLayout, QWidget


def row(*items: QWidget | str | tuple | None) -> QHBoxLayout:
    """A row of widgets, texts (labels), ``(widget, stretch)`` pairs and stretches (``None``)."""
    layout = QHBoxLayout()
    for it in items:
        if it is None:
            layout.addStretch(1)
        else:
            layout.addWidget(*(it if isinstance(it, tuple) else (QLabel(it) if isinstance(it, str) else it,)))
    return layout


def split(orientation: Qt.Orientation, *parts: tuple[QWidget, int, int]) -> QSplitter:
    """A splitter of ``(widget, stretch factor, initial size)`` parts."""
    sp = QSplitter(orientation)
    for i, (w, stretch, _size) in enumerate(parts):
        sp.addWidget(w)
        sp.setStretchFactor(i, stretch)
    sp.setSizes([size for _w, _s, size in parts])
    return sp


def with_legend(plot: QWidget) -> QWidget:
    """``plot`` under its ``legend`` widget (wrapped to the plot's width, outside the data)."""
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(2)
    layout.addWidget(plot.legend)
    layout.addWidget(plot, 1)
    return box


def vertical_scroll(widget: QWidget, name: str, scroll: QScrollArea | None = None) -> QScrollArea:
    """``widget`` in a frameless scroll area named ``name`` that scrolls up and down only (its
    width follows the area's): text wraps instead of being cut on the right."""
    scroll = QScrollArea() if scroll is None else scroll
    scroll.setObjectName(name)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setWidget(widget)
    return scroll


class FitScroll(QScrollArea):
    """A scroll area as tall as its contents when there is room (Qt caps a scroll area's size
    hint at a few hundred pixels), shorter, with a scroll bar, when there is not."""

    def setWidget(self, widget: QWidget) -> None:
        super().setWidget(widget)
        widget.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:
        if obj is self.widget() and event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize):
            self.updateGeometry()  # its contents changed (a label wraps, a box shows): ask again
        return False

    def sizeHint(self):
        hint = super().sizeHint()
        w = self.widget()
        if w is not None:
            width = self.viewport().width()
            h = w.heightForWidth(width) if w.hasHeightForWidth() and width > 0 else -1
            hint.setHeight((h if h > 0 else w.sizeHint().height()) + 2 * self.frameWidth())
        return hint
