"""A grid of result cards: thumbnail, rank, evidence (cosine and inliers), instance, title and artist.

Used by the Search tab (top-k of a query) and the Evaluation tab (a query's top results with the
correct ones marked)::

    grid = ResultGrid()
    grid.set_results(results, correct=[True, False, ...])   # green / red borders
    grid.activated.connect(lambda result: ...)                # double-click (or Enter)

Thumbnails come from the shared :class:`ThumbnailCache` and arrive asynchronously (its ``ready``
signal); a card shows a placeholder until then.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontMetrics, QPixmap
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QGridLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import Result
from museum_search.gui.widgets.thumbnails import ThumbnailCache

CORRECT_COLOUR = "#2e9d4c"
INCORRECT_COLOUR = "#d0342c"

_STYLE = f"""
QFrame#resultCard {{
    border: 2px solid palette(mid); border-radius: 6px; background: palette(base);
}}
QFrame#resultCard[selected="true"] {{ border: 2px solid palette(highlight); }}
QFrame#resultCard[mark="correct"] {{ border: 4px solid {CORRECT_COLOUR}; }}
QFrame#resultCard[mark="incorrect"] {{ border: 4px solid {INCORRECT_COLOUR}; }}
QLabel#cardThumb {{ background: palette(window); border-radius: 3px; color: palette(mid); }}
QLabel#cardMark[mark="correct"] {{ color: {CORRECT_COLOUR}; font-weight: bold; }}
QLabel#cardMark[mark="incorrect"] {{ color: {INCORRECT_COLOUR}; font-weight: bold; }}
"""


def result_title(result: Result) -> str:
    """'Title — Artist' from the metadata (either may be missing); '' when neither is known."""
    md = {k.lower(): v for k, v in (result.metadata or {}).items() if v}
    title, artist = md.get("title", ""), md.get("artist", "")
    return " — ".join(s for s in (title, artist) if s)


def evidence_text(result: Result) -> str:
    """'cosine 0.81 · 57 inliers' (or '· not verified') for an answer of the query pipeline;
    'score 0.812' for a bare ranking (an evaluation's results: no cosine, NaN)."""
    if not math.isfinite(result.cosine):
        return f"score {result.score:.3f}"
    return f"cosine {result.cosine:.2f} · " + ("not verified" if result.inliers is None else f"{result.inliers} inliers")


def catalogue_form(instance: str, metadata: dict[str, str] | None, path: str,
                   before: Sequence[tuple[str, str]] = ()) -> QFormLayout:
    """A reference's catalogue entry as a form for a large view: ``before`` (e.g. rank, evidence),
    the instance, each metadata field that has a value, and the file; plain text, wrapped and
    selectable."""
    form = QFormLayout()
    rows = [*before, ("Instance", instance)]
    rows += [(f"{k[:1].upper()}{k[1:]}", v) for k, v in (metadata or {}).items() if v]
    for name, text in [*rows, ("File", path)]:
        lab = QLabel(text)
        lab.setTextFormat(Qt.TextFormat.PlainText)
        lab.setWordWrap(True)
        lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow(f"{name}:", lab)
    return form


def result_tooltip(result: Result) -> str:
    rows = [("Rank", str(result.rank)), ("Evidence", evidence_text(result)), ("Instance", result.instance)]
    rows += [(k.capitalize(), v) for k, v in (result.metadata or {}).items() if v]
    rows.append(("File", result.path))
    return "<table>" + "".join(
        f"<tr><td><b>{html.escape(k)}</b>&nbsp;</td><td>{html.escape(v)}</td></tr>" for k, v in rows
    ) + "</table>"


class ResultCard(QFrame):
    """One result. Double-click emits ``activated``; a click selects it."""

    activated = Signal(object)
    clicked = Signal(object)

    def __init__(self, result: Result, thumb_size: int, mark: bool | None = None, parent=None):
        super().__init__(parent)
        self.result = result
        self.thumb_size = thumb_size
        self.setObjectName("resultCard")
        self.setProperty("mark", "" if mark is None else ("correct" if mark else "incorrect"))
        self.setProperty("selected", False)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip(result_tooltip(result))
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Maximum)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.setSpacing(2)
        self.thumb = QLabel("…")
        self.thumb.setObjectName("cardThumb")
        self.thumb.setFixedSize(thumb_size, thumb_size)
        self.thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.thumb, 0, Qt.AlignmentFlag.AlignHCenter)
        self.head = QLabel()
        self.head.setObjectName("cardRank")
        lay.addWidget(self.head)
        self.evidence_label = QLabel()
        self.evidence_label.setObjectName("cardEvidence")
        lay.addWidget(self.evidence_label)
        self.mark_label = QLabel()
        self.mark_label.setObjectName("cardMark")
        self.mark_label.setProperty("mark", self.property("mark"))
        if mark is not None:
            self.mark_label.setText("✓ correct" if mark else "✗ incorrect")
            lay.addWidget(self.mark_label)
        self.title_label = QLabel()
        self.title_label.setObjectName("cardTitle")
        f = self.title_label.font()
        f.setItalic(True)
        self.title_label.setFont(f)
        self.title_label.setForegroundRole(self.foregroundRole())
        lay.addWidget(self.title_label)
        lay.addStretch(1)
        self.set_card_width(thumb_size + 20)

    def set_card_width(self, width: int) -> None:
        """Make the card ``width`` px wide (at least its thumbnail's) and fit its texts to it. An id
        too long is cut at its start, not in its middle: ids that differ differ in their ends
        ("bbdd_00083"); the card's tooltip has it whole."""
        width = max(int(width), self.thumb_size + 20)
        self.setFixedWidth(width)
        room = width - 20
        fm = QFontMetrics(self.font())
        rank = f"#{self.result.rank}"
        bold = QFont(self.font())
        bold.setBold(True)
        left = room - QFontMetrics(bold).horizontalAdvance(rank) - fm.horizontalAdvance("\u00a0\u00a0")
        self.head.setText(f"<b>{rank}</b>&nbsp;&nbsp;"
                          f"{html.escape(fm.elidedText(self.result.instance, Qt.TextElideMode.ElideLeft, left))}")
        self.evidence_label.setText(fm.elidedText(evidence_text(self.result), Qt.TextElideMode.ElideRight, room))
        title = result_title(self.result)
        italic = QFontMetrics(self.title_label.font())
        self.title_label.setText(italic.elidedText(title, Qt.TextElideMode.ElideRight, room) if title else "")

    @property
    def mark(self) -> str:
        return str(self.property("mark") or "")

    def set_thumbnail(self, pixmap: QPixmap | None) -> None:
        if pixmap is None or pixmap.isNull():
            self.thumb.setText("no preview")
            return
        if pixmap.width() > self.thumb_size or pixmap.height() > self.thumb_size:
            pixmap = pixmap.scaled(self.thumb_size, self.thumb_size, Qt.AspectRatioMode.KeepAspectRatio,
                                   Qt.TransformationMode.SmoothTransformation)
        self.thumb.setPixmap(pixmap)

    def has_thumbnail(self) -> bool:
        pm = self.thumb.pixmap()
        return pm is not None and not pm.isNull()

    def set_selected(self, on: bool) -> None:
        self.setProperty("selected", bool(on))
        self.style().unpolish(self)
        self.style().polish(self)

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit(self)
        super().mousePressEvent(event)

    def mouseDoubleClickEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.activated.emit(self.result)
            event.accept()
            return
        super().mouseDoubleClickEvent(event)


class ResultGrid(QWidget):
    """Cards of results (:class:`museum_search.core.answer._pipeline.Result`; a bare ranking's have a NaN
    cosine), as many per row as fit."""

    activated = Signal(object)  # Result, on double-click or Enter
    selection_changed = Signal(object)  # Result or None

    def __init__(self, parent: QWidget | None = None, thumb_size: int = 160,
                 placeholder: str = "No results yet."):
        super().__init__(parent)
        self.thumb_size = int(thumb_size)
        self._results: list[Result] = []
        self._correct: list[bool] | None = None
        self._cards: list[ResultCard] = []
        self._by_path: dict[str, list[ResultCard]] = {}
        self._columns = 0
        self._selected: ResultCard | None = None
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setStyleSheet(_STYLE)

        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.container = QWidget()
        self.grid = QGridLayout(self.container)
        self.grid.setContentsMargins(4, 4, 4, 4)
        self.grid.setSpacing(10)
        self.grid.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.scroll.setWidget(self.container)
        self.scroll.viewport().installEventFilter(self)
        self.placeholder = QLabel(placeholder)
        self.placeholder.setObjectName("resultPlaceholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setForegroundRole(self.placeholder.foregroundRole())
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.placeholder)
        lay.addWidget(self.scroll)
        self.scroll.hide()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

        self._cache = ThumbnailCache.instance()
        self._cache.ready.connect(self._thumbnail_ready)

    def sizeHint(self) -> QSize:
        return QSize(4 * (self.thumb_size + 30), 2 * (self.thumb_size + 110))

    # ---- content -------------------------------------------------------------------------
    def set_results(self, results: Sequence[Result], correct: Sequence[bool] | None = None) -> None:
        """Show ``results`` (best first); ``correct`` marks each card right (green) or wrong (red)."""
        results = list(results)
        if correct is not None:
            correct = [bool(c) for c in correct]
            if len(correct) != len(results):
                raise ValueError(f"{len(correct)} correctness flags for {len(results)} results")
        self._clear_cards()
        self._results, self._correct = results, correct
        for i, r in enumerate(results):
            card = ResultCard(r, self.thumb_size, None if correct is None else correct[i], self.container)
            card.activated.connect(self.activated)
            card.clicked.connect(self._select)
            self._cards.append(card)
            key = str(r.abspath)
            self._by_path.setdefault(key, []).append(card)
            pm = self._cache.get(key, self.thumb_size)
            if pm is not None:
                card.set_thumbnail(pm)
        self._columns = 0
        self.scroll.setVisible(bool(results))
        self.placeholder.setVisible(not results)
        self._relayout()
        # the viewport has its real width only once the shown scroll area is laid out
        QTimer.singleShot(0, self, self._relayout)
        self.scroll.verticalScrollBar().setValue(0)

    def clear(self, placeholder: str | None = None) -> None:
        self.set_results([])
        if placeholder is not None:
            self.placeholder.setText(placeholder)

    def results(self) -> list[Result]:
        return list(self._results)

    def correct(self) -> list[bool] | None:
        return None if self._correct is None else list(self._correct)

    def cards(self) -> list[ResultCard]:
        return list(self._cards)

    def count(self) -> int:
        return len(self._cards)

    def _clear_cards(self) -> None:
        self._selected = None
        for card in self._cards:
            self.grid.removeWidget(card)
            card.hide()
            card.deleteLater()
        self._cards = []
        self._by_path = {}

    # ---- layout --------------------------------------------------------------------------
    def _available(self) -> int:
        m = self.grid.contentsMargins()
        return self.scroll.viewport().width() - m.left() - m.right()

    def _column_count(self) -> int:
        return max(1, (self._available() + self.grid.spacing()) // (self.thumb_size + 20 + self.grid.spacing()))

    def card_width(self) -> int:
        """The cards' width: as many columns as fit, stretched to use the whole width."""
        cols = self._column_count()
        return max(self.thumb_size + 20, (self._available() - (cols - 1) * self.grid.spacing()) // cols)

    def _relayout(self) -> None:
        cols, width = self._column_count(), self.card_width()
        for card in self._cards:
            if card.minimumWidth() != width:
                card.set_card_width(width)
        if cols == self._columns and all(self.grid.indexOf(c) >= 0 for c in self._cards):
            return
        self._columns = cols
        for card in self._cards:
            self.grid.removeWidget(card)
        for i, card in enumerate(self._cards):
            self.grid.addWidget(card, i // cols, i % cols)
            card.show()

    def eventFilter(self, obj, event) -> bool:
        if obj is self.scroll.viewport() and event.type() == QEvent.Type.Resize:
            self._relayout()  # the viewport narrows when the vertical scroll bar appears
        return super().eventFilter(obj, event)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._relayout()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._relayout()

    # ---- thumbnails, selection -----------------------------------------------------------
    def _thumbnail_ready(self, path: str, size: int) -> None:
        cards = self._by_path.get(str(path))
        if not cards or int(size) != self.thumb_size:
            return
        pm = self._cache.get(str(path), self.thumb_size)
        for card in cards:
            card.set_thumbnail(pm)

    def _select(self, card: ResultCard) -> None:
        if self._selected is not None and self._selected is not card:
            self._selected.set_selected(False)
        self._selected = card
        card.set_selected(True)
        self.setFocus(Qt.FocusReason.MouseFocusReason)
        self.selection_changed.emit(card.result)

    def keyPressEvent(self, event) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and self._selected is not None:
            self.activated.emit(self._selected.result)
            return
        moves = {Qt.Key.Key_Left: -1, Qt.Key.Key_Right: 1,
                 Qt.Key.Key_Up: -max(1, self._columns), Qt.Key.Key_Down: max(1, self._columns)}
        if key in moves and self._cards:
            i = self._cards.index(self._selected) if self._selected in self._cards else -1
            j = min(len(self._cards) - 1, max(0, i + moves[key])) if i >= 0 else 0
            self._select(self._cards[j])
            self.scroll.ensureWidgetVisible(self._cards[j])
            return
        super().keyPressEvent(event)
